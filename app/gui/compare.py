"""Compare mode: the same prompt, target and sampler with two proposers, side by side.

`CompareSession` (no widgets) drives a RunController with two lanes and fills two
RunModels; `CompareWidget` shows both timelines (aligned by output position, scrolled
together), both sets of plots, a summary table and the first divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .plots import LivePlotsWidget
from .runmodel import RunModel, first_divergence
from .session import PlainCost
from .settings import ENGINES, RunSettings, menu_spec, proposer_choices, proposer_label, validate
from .timeline import TokenTimelineWidget
from .worker import RunController

DEFAULT_SIDES = (("draft:small", "4"), ("lookup", "4"))  # (proposer spec, k) of A and B
TABLE_REFRESH_MS = 250  # the summary table's refresh while the lanes run
SUMMARY_ROWS = (
    ("proposer", "proposer"),
    ("mean_accepted_length", "mean accepted length"),
    ("acceptance_rate", "acceptance rate"),
    ("rounds", "rounds"),
    ("new_tokens", "new tokens"),
    ("target_passes", "target forward passes"),
    ("draft_passes", "draft forward passes"),
    ("decode_s", "decoding time (s)"),
    ("tokens_per_s", "tokens / s"),
    ("speedup", "speedup over plain decoding"),
    ("stop", "stop reason"),
)


@dataclass
class SideResult:
    stop_reason: str | None = None
    wall_s: float | None = None


class CompareSession(QObject):
    """Two lanes of one worker; fills models[0] and models[1]."""

    changed = Signal()
    divergence = Signal(object)  # output position or None
    failed = Signal(str, str)
    stateChanged = Signal(str)

    def __init__(self, controller: RunController, parent=None):
        super().__init__(parent)
        self.controller = controller
        self.models = (RunModel(self), RunModel(self))
        self.settings: tuple[RunSettings, RunSettings] | None = None
        self.results = [SideResult(), SideResult()]
        self.plain: PlainCost | None = None  # plain decoding of the target, measured before the run
        self.first_divergence: int | None = None
        w = controller.worker
        w.prepared.connect(self._on_prepared)
        w.roundReady.connect(self._on_round)
        w.laneFinished.connect(self._on_lane_finished)
        w.baseline.connect(self._on_baseline)
        w.failed.connect(self.failed)
        w.stateChanged.connect(self.stateChanged)

    def start(self, a: RunSettings, b: RunSettings) -> None:
        self.settings = (a, b)
        self.results = [SideResult(), SideResult()]
        self.plain = None
        self.first_divergence = None
        for m in self.models:
            m.clear()
        self.controller.start([a, b], run=True, measure_baseline=True)

    def stop(self) -> None:
        self.controller.stop()

    @property
    def running(self) -> bool:
        """Whether lanes are being prepared, decoded or stopped."""
        return self.controller.busy

    def _on_prepared(self, lane: int, config, token_text, label: str) -> None:
        self.models[lane].begin(config, token_text, source="compare", label=label)

    def _on_round(self, lane: int, rnd) -> None:
        cfg = self.models[lane].config
        if cfg is None or rnd.run_id != cfg.run_id:
            return  # a round of a cancelled comparison
        self.models[lane].append(rnd)
        a, b = (m.output_tokens for m in self.models)
        div = first_divergence(a, b)
        if div != self.first_divergence:
            self.first_divergence = div
            self.divergence.emit(div)
        self.changed.emit()

    def _on_lane_finished(self, lane: int, reason: str, wall: float, result) -> None:
        self.results[lane] = SideResult(reason, wall)
        self.models[lane].finish(reason, wall)
        self.changed.emit()

    def _on_baseline(self, plain: PlainCost) -> None:
        self.plain = plain
        self.changed.emit()

    # ------------------------------------------------------------------ summary

    def summary(self, lane: int) -> dict[str, str]:
        m = self.models[lane]
        met = m.metrics
        res = self.results[lane]
        # The lane's own rounds (draft + verify + bookkeeping), not the wall time from its
        # start to its end: the two lanes run interleaved on one worker, so each lane's wall
        # time also holds the other lane's rounds, the recording and the window's updates.
        decode = met.time_total
        tps = met.emitted_total / decode if decode else math.nan
        speed = (self.plain.total_s(met.emitted_total) / decode
                 if self.plain is not None and decode and met.emitted_total else math.nan)
        s = self.settings[lane] if self.settings else None
        return {
            "proposer": ((f"{'transformers: ' if s.engine == 'transformers' else ''}{proposer_label(s.proposer)}, "
                          f"k={s.k}") if s else m.label),
            "mean_accepted_length": f"{met.mean_accepted_length:.3f}",
            "acceptance_rate": f"{met.acceptance_rate:.3f}",
            "rounds": str(len(met)),
            "new_tokens": str(met.emitted_total),
            "target_passes": str(met.target_forwards),
            "draft_passes": str(met.draft_forwards),
            "decode_s": f"{decode:.3f}" if decode else "—",
            "tokens_per_s": f"{tps:.1f}" if not math.isnan(tps) else "—",
            "speedup": f"{speed:.2f}×" if not math.isnan(speed) else "—",
            "stop": res.stop_reason or ("running" if len(met) else "—"),
        }

    def divergence_text(self) -> str:
        a, b = (m.output_tokens for m in self.models)
        n = min(len(a), len(b))
        greedy = bool(self.settings and self.settings[0].greedy)
        if self.first_divergence is None:
            if not n:
                return ""
            note = " (greedy: identical outputs, as exactness requires)" if greedy else ""
            return f"<span style='color:#007a4d'>✔ no divergence in the first {n} tokens{note}</span>"
        i = self.first_divergence
        tt = self.models[0].token_text
        text = (f"<b style='color:{theme.DIVERGENCE_COLOR.name()}'>first divergence at output position {i}</b>: "
                f"A “{tt(a[i])}” vs B “{tt(b[i])}”")
        if greedy:
            text += " — <b style='color:#b00020'>greedy outputs must be identical: this is a bug</b>"
        else:
            text += " (expected when sampling: the two proposers consume the random stream differently)"
        return text


class CompareWidget(QWidget):
    """Controls, summary table, divergence line and two synchronised columns."""

    compareRequested = Signal()
    stopRequested = Signal()

    def __init__(self, session: CompareSession, parent=None):
        super().__init__(parent)
        self.session = session
        outer = QVBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        outer.addLayout(self._controls())
        outer.addWidget(self._note())
        top = QHBoxLayout()
        top.addWidget(self._summary_table(), 1)
        outer.addLayout(top)
        self.divergence = QLabel("")
        self.divergence.setTextFormat(Qt.TextFormat.RichText)
        self.divergence.setWordWrap(True)
        outer.addWidget(self.divergence)
        outer.addWidget(self._lane_columns(), 1)
        self._syncing = False
        a, b = (t.verticalScrollBar() for t in self.timelines)
        a.valueChanged.connect(lambda v: self._sync(b, v))
        b.valueChanged.connect(lambda v: self._sync(a, v))
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
        """Per side: proposer menu (from the registry, without a local checkpoint) and k."""
        controls = QGridLayout()
        self.proposers: list[QComboBox] = []
        self.engines: list[QComboBox] = []  # per side: ENGINES
        self.ks: list[QLineEdit] = []
        self.errors: list[QLabel] = []
        for side, (prop, k) in enumerate(DEFAULT_SIDES):
            name = QLabel(f"<b style='color:{theme.SIDE_COLORS[side]}'>{'AB'[side]}</b>")
            combo = QComboBox()
            for choice in proposer_choices(with_checkpoint=False):
                combo.addItem(choice.label, choice.spec)
            combo.setCurrentIndex(combo.findData(prop))
            kedit = QLineEdit(k)
            kedit.setFixedWidth(50)
            err = QLabel("")
            err.setStyleSheet("color:#b00020; font-size:9pt;")
            err.hide()
            engine = QComboBox()
            engine.addItems(ENGINES)
            engine.setToolTip(f"who decodes side {'AB'[side]}: specscope, or transformers' own generate()")
            self.engines.append(engine)
            for col, widget in enumerate((name, engine, combo, QLabel("k"), kedit)):
                controls.addWidget(widget, 0, side * 5 + col)
            controls.addWidget(err, 1, side * 5 + 1, 1, 4)
            self.proposers.append(combo)
            self.ks.append(kedit)
            self.errors.append(err)
        self.compare_button = QPushButton("Compare")
        self.compare_button.setToolTip("Run the prompt and sampler of the run panel with proposers A and B")
        self.stop_button = QPushButton("Stop")
        self.compare_button.clicked.connect(self.compareRequested.emit)
        self.stop_button.clicked.connect(self.stopRequested.emit)
        controls.addWidget(self.compare_button, 0, 10)
        controls.addWidget(self.stop_button, 0, 11)
        controls.setColumnStretch(12, 1)
        return controls

    def _note(self) -> QLabel:
        self.note = QLabel("Prompt, target, sampler, seed and budget come from the run panel. The lanes run "
                           "interleaved; times are each lane's own rounds, and the speedup compares them "
                           "with plain decoding of the target measured before the run. Drawing the lanes "
                           "slows their rounds somewhat: `specscope bench` measures speedups undisturbed. "
                           "Plots: "
                           "acceptance (dots per round, line = rolling mean), accepted-length histogram, "
                           "latency (draft below, verify on top), tokens per round (black measured, "
                           "dashed predicted by the cost model).")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#666666")
        return self.note

    def _summary_table(self) -> QTableWidget:
        self.table = QTableWidget(len(SUMMARY_ROWS), 2)
        self.table.setHorizontalHeaderLabels(["A", "B"])
        self.table.setVerticalHeaderLabels([label for _, label in SUMMARY_ROWS])
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(21)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.setFixedHeight(21 * len(SUMMARY_ROWS) + self.table.horizontalHeader().sizeHint().height() + 4)
        return self.table

    def _lane_columns(self) -> QSplitter:
        """One column per side: its header, aligned timeline and compact plots."""
        self.columns = QSplitter(Qt.Orientation.Horizontal)
        self.timelines: list[TokenTimelineWidget] = []
        self.plots: list[LivePlotsWidget] = []
        self.headers: list[QLabel] = []
        for side in range(2):
            col = QSplitter(Qt.Orientation.Vertical)
            box = QWidget()
            bl = QVBoxLayout(box)
            bl.setContentsMargins(0, 0, 0, 0)
            head = QLabel(f"<b style='color:{theme.SIDE_COLORS[side]}'>{'AB'[side]}</b>")
            head.setTextFormat(Qt.TextFormat.RichText)
            bl.addWidget(head)
            tl = TokenTimelineWidget(self.session.models[side], aligned=True)
            bl.addWidget(tl, 1)
            col.addWidget(box)
            plots = LivePlotsWidget(self.session.models[side], compact=True, color=theme.SIDE_COLORS[side],
                                    shown=("acceptance", "histogram", "latency", "cost"), show_summary=False,
                                    legends=False)
            col.addWidget(plots)
            col.setSizes([260, 340])
            self.columns.addWidget(col)
            self.timelines.append(tl)
            self.plots.append(plots)
            self.headers.append(head)
        return self.columns

    # ------------------------------------------------------------------ behaviour

    def _schedule_refresh(self) -> None:
        if self.session.running:
            if not self._refresh_timer.isActive():
                self._refresh_timer.start()
        else:
            self.refresh()

    def _sync(self, other, value: int) -> None:
        if self._syncing:
            return
        self._syncing = True
        other.setValue(value)
        self._syncing = False

    def _on_state(self, state: str) -> None:
        active = state in ("loading", "running", "paused")
        self.compare_button.setEnabled(not active)
        self.stop_button.setEnabled(active)
        if not active:
            self._refresh_timer.stop()
            self.refresh()

    def side_texts(self, side: int) -> tuple[str, str]:
        return self.proposers[side].currentData(), self.ks[side].text()

    def set_side(self, side: int, proposer: str, k: int | str) -> None:
        """Choose a side's proposer (a spec or a legacy name; a spec not in the menu is added)."""
        combo = self.proposers[side]
        spec = menu_spec(proposer)
        if spec is not None:
            if combo.findData(spec) < 0:
                combo.addItem(proposer_label(spec), spec)
            combo.setCurrentIndex(combo.findData(spec))
        self.ks[side].setText(str(k))

    def settings_pair(self, base_texts: dict[str, str], devices: tuple[str, ...]) -> tuple[RunSettings, RunSettings] | None:
        """Validate both sides on top of the run panel's texts; show errors next to the fields."""
        out = []
        all_ok = True
        for side in range(2):
            prop, k = self.side_texts(side)
            texts = dict(base_texts, proposer=prop, k=k, checkpoint="", engine=self.engines[side].currentText())
            v = validate(texts, devices)
            own = {key: msg for key, msg in v.errors.items() if key in ("k", "proposer", "engine")}
            self.errors[side].setText("; ".join(own.values()))
            self.errors[side].setVisible(bool(own))
            self.ks[side].setStyleSheet("border: 1px solid #b00020;" if "k" in own else "")
            if not v.ok:
                all_ok = False
            out.append(v)
        if not all_ok:
            return None
        return out[0].settings, out[1].settings

    def refresh(self) -> None:
        self._refresh_timer.stop()
        for side in range(2):
            summary = self.session.summary(side)
            for row, (key, _) in enumerate(SUMMARY_ROWS):
                item = QTableWidgetItem(summary[key])
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                self.table.setItem(row, side, item)
            s = self.session.settings[side] if self.session.settings else None
            label = summary["proposer"] if s else ""
            self.headers[side].setText(f"<b style='color:{theme.SIDE_COLORS[side]}'>{'AB'[side]}</b> {label}")
        self.divergence.setText(self.session.divergence_text())

    def _on_divergence(self, pos) -> None:
        for t in self.timelines:
            t.set_marker(pos)
        self.divergence.setText(self.session.divergence_text())
