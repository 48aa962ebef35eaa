"""Compare mode's view: two or three proposers side by side on the same prompt, target and
sampler (lanes A, B and, when its menu names a proposer, C).

`CompareWidget` shows a `compare_session.CompareSession`: the lanes' timelines (aligned by
output position, scrolled together), their plots, a summary table and the first divergence.
The table and the lanes share a splitter and every part has a readable minimum, so the tab
works from 1024x700 up.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from specscope.app.gui import theme
from specscope.app.gui.model.settings import (
    ENGINES,
    PATH_ARG,
    PanelSettings,
    menu_spec,
    note_engines,
    proposer_choices,
    proposer_label,
    validate,
)
from specscope.app.gui.sessions.compare import LANE_NAMES, SUMMARY_ROWS, CompareSession, LaneSettings, reference_text

from .inspector import RoundInspectorWidget
from .plot_scroll import ScrollingPlots
from .plots import LivePlotsWidget
from .timeline import TokenTimelineWidget
from .tree import DraftTreeView

__all__ = ["CompareSession", "CompareWidget"]

DEFAULT_SIDES = (("draft:small", "4"), ("lookup", "4"), (None, "4"))  # (proposer spec, k) of A, B, C (None: off)
LANE_OFF = "(no lane C)"  # lane C's menu entry that leaves it out
TABLE_REFRESH_MS = 250  # the summary table's refresh while the lanes run
# a lane's timeline never gets shorter (about four rows of cells; 100, not 110, since lane C's
# controls row: 1024x700 still fits)
LANE_MIN_PX = 100
SUMMARY_BLOCKS = 2  # the summary's rows in this many blocks side by side
SUMMARY_ROW_PX = 21
BLOCK_COLUMNS = 1 + len(LANE_NAMES)  # a summary block: the metric, then one column per lane
IDLE_NOTE_HTML = (
    "<span style='color:#666666'>Prompt, sampler, seed and budget come from the run panel; the "
    "speedup is against plain decoding measured before the run.</span>"
)
COUPLING_HTML = (
    "<p><b>Coupled lanes</b> (sampling only). Normally each lane draws its own random numbers, and the two "
    "proposers use them differently, so sampled lanes part at the first token. Coupled, both lanes share one "
    "set of random numbers keyed by the output position: for position j a fixed random score G_j(v) per "
    "token, made from the run's seed and j. At every position the target emits the token with the highest "
    "log p(v) + G_j(v); a draft model proposes the token with the highest log q(v) + G_j(v), and a draft "
    "token is accepted only if it is that same token. Picking the highest log p + G is an exact draw from p "
    "(the Gumbel-max trick), so each lane still samples exactly the target's distribution; and because the "
    "emitted token depends only on the target and the shared scores, two coupled lanes emit the same tokens "
    "wherever their prefixes agree, whatever their proposers. The cost: a draft token is accepted with "
    "probability P(both picks agree), which is below the usual sum min(p, q). A repair is the target's "
    "pick, not a draw from the residual. Off by default; ignored at temperature 0 (greedy lanes agree "
    "anyway). <code>specscope run --coupled SEED</code> does the same for one run; docs/coupling.md.</p>"
)
NOTE_HTML = (
    "<p>Prompt, target, sampler, seed and budget come from the run panel. The lanes run "
    "interleaved; times are each lane's own rounds, and the speedup compares them with plain "
    "decoding of the target measured before the run. Drawing the lanes slows their rounds "
    "somewhat: <code>specscope bench</code> measures speedups undisturbed.</p>"
    "<p>Plots: acceptance (dots per round, line = rolling mean), accepted-length histogram, latency "
    "(draft below, verify on top), tokens per round (black measured, dashed predicted by the cost "
    "model).</p><p>Timeline: " + theme.kind_legend_html() + "</p>"
    "<p>Hover a lane cell for its whole token, p, q and the decision.</p>" + COUPLING_HTML
)


# a lane's empty timeline: the run panel's Run does not start lanes (it said it did)
LANE_EMPTY_TEXT = (
    "No rounds yet. The Compare button (or Space on this tab) runs the lanes with the run panel's "
    "prompt and sampler; File > Compare two runs shows stored ones."
)


class CompareWidget(QWidget):
    """Controls, summary table, divergence line and two synchronised columns."""

    compareRequested = Signal()
    stopRequested = Signal()

    def __init__(self, session: CompareSession, parent=None):
        super().__init__(parent)
        self.session = session
        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        outer.setSpacing(3)
        outer.addLayout(self._controls())
        outer.addWidget(self._note())
        self.divergence = QLabel("")
        self.divergence.setTextFormat(Qt.TextFormat.RichText)
        self.divergence.setWordWrap(True)
        outer.addWidget(self.divergence)
        self._syncing = False
        self.body = QSplitter(Qt.Orientation.Vertical)
        self.body.setChildrenCollapsible(False)
        self.body.addWidget(self._summary_table())
        self.body.addWidget(self._lane_columns())
        self.body.setStretchFactor(0, 2)
        self.body.setStretchFactor(1, 5)
        outer.addWidget(self.body, 1)
        # The table follows the lanes at most 4 times a second while they run (each refresh
        # rebuilds and repaints it, on the thread whose GIL the decoder needs), and at once
        # when they stop.
        self._refresh_timer = QTimer(self)
        self._refresh_timer.setSingleShot(True)
        self._refresh_timer.setInterval(TABLE_REFRESH_MS)
        self._refresh_timer.timeout.connect(self.refresh)
        session.changed.connect(self._schedule_refresh)
        session.divergence.connect(self._on_divergence)
        session.stateChanged.connect(self._on_state)
        self.refresh()
        self._on_state("idle")

    # ------------------------------------------------------------------ building

    def _controls(self) -> QGridLayout:
        """One row per side: engine, proposer menu (from the registry, without a local
        checkpoint; lane C's starts with LANE_OFF) and k, its error beside; Compare and Stop at
        the left of the rows."""
        controls = QGridLayout()
        controls.setVerticalSpacing(2)
        self.proposers: list[QComboBox] = []
        self._picked: list[str] = []  # per side: the last spec chosen, restored when a folder dialog is cancelled
        self.engines: list[QComboBox] = []  # per side: ENGINES
        self.ks: list[QLineEdit] = []
        self.errors: list[QLabel] = []
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip(
            "Run the prompt and sampler of the run panel with proposers A and B (and C when its menu names one)"
        )
        self.stop_button = QPushButton("Stop")
        self.compare_button.clicked.connect(self.compareRequested.emit)
        self.stop_button.clicked.connect(self.stopRequested.emit)
        controls.addWidget(self.compare_button, 0, 0)
        controls.addWidget(self.stop_button, 1, 0)
        for side, (prop, k) in enumerate(DEFAULT_SIDES):
            name = QLabel(f"<b style='color:{theme.SIDE_COLORS[side]}'>{LANE_NAMES[side]}</b>")
            combo = QComboBox()
            if prop is None:
                combo.addItem(LANE_OFF, "")
            for choice in proposer_choices():  # a "checkpoint…" entry asks for the folder (_lane_picked)
                combo.addItem(choice.label, choice.spec)
            combo.setCurrentIndex(combo.findData(prop or ""))
            self._picked.append(prop or "")
            combo.activated.connect(lambda index, side=side: self._lane_picked(side, index))
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(18)
            kedit = QLineEdit(k)
            kedit.setFixedWidth(50)
            err = QLabel("")
            err.setStyleSheet("color:#b00020; font-size:9pt;")
            err.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            engine = QComboBox()
            engine.addItems(ENGINES)
            note_engines(engine)
            engine.setToolTip(
                f"who decodes side {LANE_NAMES[side]}: specscope, transformers' own generate() or vLLM (docs/vllm.md)"
            )
            self.engines.append(engine)
            for col, widget in enumerate((name, engine, combo, QLabel("k"), kedit, err)):
                controls.addWidget(widget, side, 1 + col)
            self.proposers.append(combo)
            self.ks.append(kedit)
            self.errors.append(err)
        self.coupled = QCheckBox("coupled lanes")
        self.coupled.setToolTip(
            "Share the target's random draws between the lanes by output position, so that "
            "both emit the same tokens wherever their prefixes agree (both stay exact; sampling "
            "only). ? explains how."
        )
        self.coupled_note = QLabel("")
        self.coupled_note.setStyleSheet("color:#666666")
        controls.addWidget(self.coupled, 0, 7)
        controls.addWidget(self.coupled_note, 1, 7)
        controls.setColumnStretch(
            3, 3
        )  # the proposer menus: room for their labels (lane C: "prompt lookup (max_ngram=3, ...)")
        controls.setColumnStretch(6, 2)  # the errors (cut short: whole in their tooltips)
        return controls

    def _note(self) -> QWidget:
        box = QWidget()
        row = QGridLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        self.legend = QLabel(theme.kind_legend_html())
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setToolTip(NOTE_HTML)
        help_button = QToolButton()
        help_button.setText("?")
        help_button.setToolTip("How compare mode measures, and what the plots show")
        help_button.clicked.connect(lambda: QMessageBox.information(self, "Compare", NOTE_HTML))
        row.addWidget(self.legend, 0, 0)
        row.addWidget(help_button, 0, 1)
        row.setColumnStretch(0, 1)
        return box

    def _summary_table(self) -> QTableWidget:
        """The summary in two blocks side by side (metric | A | B | C, twice; C's columns hidden
        without lane C): every row shows at 1024x700 (one tall column of 11 rows showed 4 and
        scrolled the rest away)."""
        rows = -(-len(SUMMARY_ROWS) // 2)
        self.table = QTableWidget(rows, BLOCK_COLUMNS * SUMMARY_BLOCKS)
        self.table.setHorizontalHeaderLabels(["", *LANE_NAMES] * SUMMARY_BLOCKS)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        for block in range(SUMMARY_BLOCKS):
            header.setSectionResizeMode(BLOCK_COLUMNS * block, QHeaderView.ResizeMode.ResizeToContents)
        for i, (_, label) in enumerate(SUMMARY_ROWS):
            item = QTableWidgetItem(label)
            item.setForeground(Qt.GlobalColor.darkGray)
            self.table.setItem(i % rows, BLOCK_COLUMNS * (i // rows), item)
        self.table.verticalHeader().setDefaultSectionSize(SUMMARY_ROW_PX)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setFixedHeight(SUMMARY_ROW_PX * rows + header.sizeHint().height() + 2 * self.table.frameWidth())
        return self.table

    def summary_cell(self, label: str, side: int) -> QTableWidgetItem:
        """The summary table's cell of row `label` (as SUMMARY_ROWS names it) for side 0 (A), 1 (B) or 2 (C)."""
        i = [name for _, name in SUMMARY_ROWS].index(label)
        rows = self.table.rowCount()
        return self.table.item(i % rows, BLOCK_COLUMNS * (i // rows) + 1 + side)

    def _lane_columns(self) -> QSplitter:
        """One column per side: its header, aligned timeline and compact plots."""
        self.columns = QSplitter(Qt.Orientation.Horizontal)
        self.columns.setChildrenCollapsible(False)
        self._timelines: list[TokenTimelineWidget] = []
        self._plots: list[LivePlotsWidget] = []
        self._headers: list[QLabel] = []
        self._details: list[QTabWidget] = []  # per lane: plots | the selected round
        self._trees: list[DraftTreeView] = []
        self._inspectors: list[RoundInspectorWidget] = []
        # The lanes' columns (plots, tree, inspector: about half a second each to build) are
        # made when first shown or asked for (`timelines` etc.), lane C when a comparison has
        # three lanes: not with the window, whose start-up they slowed.
        return self.columns

    def _ensure_lanes(self, count: int) -> None:
        while len(self._timelines) < count:
            self._add_lane(len(self._timelines))
            model = self.session.slots[len(self._timelines) - 1]
            if model.rounds:  # built after its lane filled (a stored comparison reopened)
                model.reset.emit()

    timelines = property(lambda self: self._lanes_built()._timelines)
    plots = property(lambda self: self._lanes_built()._plots)
    headers = property(lambda self: self._lanes_built()._headers)
    details = property(lambda self: self._lanes_built()._details)  # per lane: plots | the selected round
    trees = property(lambda self: self._lanes_built()._trees)
    inspectors = property(lambda self: self._lanes_built()._inspectors)

    def _lanes_built(self) -> CompareWidget:
        if len(self._timelines) < max(2, self.session.count):
            self._show_lanes(max(2, self.session.count))
        return self

    def showEvent(self, event) -> None:
        if not self._timelines:
            self._show_lanes(max(2, self.session.count))
            self.refresh()
        super().showEvent(event)

    def _add_lane(self, side: int) -> None:
        """Build lane `side`'s column: header, aligned timeline, plots and round details."""
        col = QSplitter(Qt.Orientation.Vertical)
        col.setChildrenCollapsible(False)
        box = QWidget()
        bl = QVBoxLayout(box)
        bl.setContentsMargins(0, 0, 0, 0)
        head = QLabel(f"<b style='color:{theme.SIDE_COLORS[side]}'>{LANE_NAMES[side]}</b>")
        head.setTextFormat(Qt.TextFormat.RichText)
        # cut at the lane's edge, whole in the tooltip: three long labels ("prompt lookup
        # (max_ngram=3, min_ngram=1), k=4") widened the window past 1024 px
        head.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        bl.addWidget(head)
        tl = TokenTimelineWidget(self.session.slots[side], aligned=True)
        tl.empty_text = LANE_EMPTY_TEXT
        tl.setMinimumHeight(LANE_MIN_PX)
        bl.addWidget(tl, 1)
        col.addWidget(box)
        plots = LivePlotsWidget(
            self.session.slots[side],
            compact=True,
            color=theme.SIDE_COLORS[side],
            shown=("acceptance", "histogram", "latency", "cost"),
            show_summary=False,
            legends=False,
        )
        col.addWidget(self._lane_details(side, plots))
        tl.cellClicked.connect(lambda rnd, pos, side=side: self.follow(side, rnd, pos))
        col.setSizes([260, 340])
        self.columns.addWidget(col)
        self._timelines.append(tl)
        self._plots.append(plots)
        self._headers.append(head)
        bar = tl.verticalScrollBar()
        bar.valueChanged.connect(
            lambda v, side=side: self._sync(
                [t.verticalScrollBar() for i, t in enumerate(self._timelines) if i != side], v
            )
        )

    def _show_lanes(self, count: int, build: bool = True) -> None:
        """Show the first `count` lanes' columns (and summary columns), hide the others;
        build=False: only the columns already built."""
        if build:
            self._ensure_lanes(count)
        for side in range(len(LANE_NAMES)):
            if side < len(self._timelines):
                self.columns.widget(side).setVisible(side < count)
            for block in range(SUMMARY_BLOCKS):
                self.table.setColumnHidden(BLOCK_COLUMNS * block + 1 + side, side >= count)

    def _lane_details(self, side: int, plots: LivePlotsWidget) -> QTabWidget:
        """Below a lane: its plots, or the clicked round's draft tree, p/q and caches."""
        tabs = QTabWidget()
        tabs.setMinimumHeight(220)
        tabs.addTab(ScrollingPlots(plots), "Plots")
        round_view = QSplitter(Qt.Orientation.Vertical)
        round_view.setChildrenCollapsible(False)
        tree = DraftTreeView(self.session.slots[side])
        tree.setMinimumHeight(90)
        inspector = RoundInspectorWidget(self.session.slots[side])
        round_view.addWidget(tree)
        round_view.addWidget(inspector)
        round_view.setSizes([120, 400])
        tabs.addTab(round_view, "Round")
        self._details.append(tabs)
        self._trees.append(tree)
        self._inspectors.append(inspector)
        return tabs

    def follow(self, side: int, rnd: int, pos: int) -> int | None:
        """A position clicked in one lane: every lane shows its round at that output
        position (the tree, p/q and caches of each); returns the output position."""
        models = self.session.models
        m = models[side]
        if not 0 <= rnd < len(m.rounds):
            return None
        r = m.rounds[rnd]
        emitted = [e for e in r.emitted if e.node == pos] if pos >= 0 else []
        out = r.emitted_before + (r.emitted.index(emitted[0]) if emitted else 0)
        if pos >= len(r.nodes) and r.emitted:  # the bonus position
            out = r.emitted_before + len(r.emitted) - 1
        for lane in range(self.session.count):
            other = models[lane]
            if lane != side and out < len(other.cells.out_cell):
                cell_index = other.cells.out_cell[out]
                cell = other.cells.cell(cell_index)
                other.select(cell.round, cell.pos)
                self.timelines[lane].ensure_cell_visible(cell_index)
        for tabs in self.details:
            tabs.setCurrentIndex(1)
        return out

    # ------------------------------------------------------------------ behaviour

    def _schedule_refresh(self) -> None:
        if self.session.running:
            if not self._refresh_timer.isActive():
                self._refresh_timer.start()
        else:
            self.refresh()

    def _sync(self, others, value: int) -> None:
        if self._syncing:
            return
        self._syncing = True
        for other in others:
            other.setValue(value)
        self._syncing = False

    def _on_state(self, state: str) -> None:
        active = state in ("loading", "running", "paused")
        self.compare_button.setEnabled(not active)
        self.stop_button.setEnabled(active)
        if not active:
            self._refresh_timer.stop()
            self.refresh()

    def _lane_picked(self, side: int, index: int) -> None:
        """A lane's menu choice: a "checkpoint…" entry (KIND:PATH) asks for the folder and
        selects KIND:FOLDER (added to the menu); cancelled, the lane keeps its last choice."""
        combo = self.proposers[side]
        spec = str(combo.itemData(index) or "")
        kind, _, arg = spec.partition(":")
        if arg != PATH_ARG:
            self._picked[side] = spec
            return
        path = self.choose_checkpoint(kind)
        if path:
            self.set_side(side, f"{kind}:{path}", self.ks[side].text())
        else:
            combo.setCurrentIndex(max(0, combo.findData(self._picked[side])))

    def choose_checkpoint(self, kind: str) -> str:
        """The folder of a lane's `kind` checkpoint ("" when cancelled)."""
        what = "draft model" if kind == "draft" else f"{kind} head"
        return QFileDialog.getExistingDirectory(self, f"Choose a {what} checkpoint folder")

    def show_lane_error(self, side: int, message: str) -> None:
        """A refusal of lane `side`'s own settings, beside its fields (whole in the tooltip)."""
        self.errors[side].setText(message)
        self.errors[side].setToolTip(message)

    def side_texts(self, side: int) -> tuple[str, str]:
        return self.proposers[side].currentData(), self.ks[side].text()

    def set_side(self, side: int, proposer: str | None, k: int | str) -> None:
        """Choose a side's proposer (a spec or a legacy name; a spec not in the menu is added;
        None or "" leaves lane C out)."""
        combo = self.proposers[side]
        if not proposer:
            combo.setCurrentIndex(combo.findData(""))
            self._picked[side] = ""
            self.ks[side].setText(str(k))
            return
        spec = menu_spec(proposer)
        if spec is not None:
            if combo.findData(spec) < 0:
                combo.addItem(proposer_label(spec), spec)
                combo.setItemData(combo.count() - 1, spec, Qt.ItemDataRole.ToolTipRole)
            combo.setCurrentIndex(combo.findData(spec))
            self._picked[side] = spec
        self.ks[side].setText(str(k))

    def lane_settings(self, base_texts: dict[str, str], devices: tuple[str, ...]) -> tuple[LaneSettings, ...] | None:
        """Validate the lanes (A, B and C when chosen) on top of the run panel's texts; show
        errors next to the fields."""
        out = []
        all_ok = True
        for side in range(len(LANE_NAMES)):
            prop, k = self.side_texts(side)
            self.errors[side].setText("")
            if not prop:  # lane C left out
                continue
            texts = dict(base_texts, proposer=prop, k=k, checkpoint="", engine=self.engines[side].currentText())
            v = validate(texts, devices)
            own = {key: msg for key, msg in v.errors.items() if key in ("k", "proposer", "checkpoint", "engine")}
            self.errors[side].setText("; ".join(own.values()))
            self.errors[side].setToolTip("; ".join(own.values()))
            self.ks[side].setStyleSheet("border: 1px solid #b00020;" if "k" in own else "")
            if not v.ok:
                all_ok = False
            out.append(v)
        if not all_ok:
            return None
        return self._lanes([v.settings for v in out])

    def _lanes(self, settings: list[PanelSettings]) -> tuple[LaneSettings, ...] | None:
        """The lanes' settings, coupled (seed = the run panel's seed) when the box is ticked
        and the lanes sample; a ticked box at temperature 0 is ignored, with a note."""
        a = settings[0]
        coupled = self.coupled.isChecked() and not a.greedy
        self.update_coupling_note(a.temperature)
        seed = a.seed if coupled else None
        lanes = tuple(LaneSettings(**{**vars(s), "coupling_seed": seed}) for s in settings)
        for side, lane in enumerate(lanes):  # the core's check: the transformers engine and trees cannot couple
            problem = lane.validate({"coupling_seed": "coupling"}).get("coupling_seed")
            if problem:
                self.errors[side].setText(problem)
                return None
        return lanes  # type: ignore[return-value]

    def update_coupling_note(self, temperature: float | str) -> None:
        """The note beside the coupled-lanes box: it does nothing at temperature 0."""
        try:
            greedy = float(temperature) == 0
        except ValueError:
            greedy = False
        self.coupled.setEnabled(not greedy)
        self.coupled_note.setText("(off at T=0)" if greedy else "")
        self.coupled_note.setToolTip(
            "Greedy decoding draws nothing: greedy lanes agree without coupling" if greedy else ""
        )

    def refresh(self) -> None:
        self._refresh_timer.stop()
        needed = (
            self._timelines or self.session.settings or self.isVisible() or any(m.rounds for m in self.session.slots)
        )  # a stored comparison reopened
        self._show_lanes(self.session.count, build=bool(needed))
        for side in range(self.session.count):
            summary = self.session.summary(side)
            rows = self.table.rowCount()
            for i, (key, _) in enumerate(SUMMARY_ROWS):
                item = QTableWidgetItem(summary[key])
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                item.setToolTip(
                    reference_text(self.session.references[side])[1] if key == "reference" else summary[key]
                )
                self.table.setItem(i % rows, BLOCK_COLUMNS * (i // rows) + 1 + side, item)
            s = self.session.settings[side] if self.session.settings else None
            label = summary["proposer"] if s else ""
            if side < len(self._headers):
                self._headers[side].setText(
                    f"<b style='color:{theme.SIDE_COLORS[side]}'>{LANE_NAMES[side]}</b> {label}"
                )
                self._headers[side].setToolTip(label)
        self._show_divergence()

    def _show_divergence(self) -> None:
        """The first divergence; before any comparison, where the lanes' settings come from
        (the line is shared: a third lane's controls row took the note's own line at 1024x700)."""
        self.divergence.setText(self.session.divergence_text() or IDLE_NOTE_HTML)

    def _on_divergence(self, pos) -> None:
        for t in self._timelines:
            t.set_marker(pos)
        self._show_divergence()
