"""The KV-cache view: one row per cache (target, draft) for the selected round, with its
length before the round, at its peak (after this round's forwards) and after the crop, the
length it should have after the round, and any difference marked and named in words.

The expected length after a round is the committed context (prefix + emitted tokens) minus
the tokens no forward of this round processed: the repair or bonus token is emitted from the
last forward's logits, so it is always still pending. A cache longer than that kept entries
of the rejected draft suffix (the crop was off); a shorter one is fine only while its
pending tokens cover the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QMessageBox, QToolButton, QVBoxLayout, QWidget

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel
from specscope.core.records import CacheState, Round

ROW_MIN_PX = 80  # a cache row's plot never gets shorter than this (its four labels need it)
WRONG = "#b00020"
OK = "#007a4d"

HELP_HTML = (
    "<p>One row per KV cache of the selected round (the target's, and the draft model's when the "
    "proposer has one).</p><ul>"
    "<li><b>before</b>: entries the cache held when the round started (the previous round's <i>after</i>).</li>"
    "<li><b>peak</b>: entries after this round's forward passes (before + the pending tokens fed + the "
    "draft), before anything is cropped.</li>"
    "<li><b>after</b>: entries left after cropping to the accepted prefix.</li>"
    "<li><b>committed context</b>: prompt + every token emitted so far, including this round's.</li>"
    "<li><b>pending</b>: committed tokens no forward has processed yet; they are fed first at the next "
    "round. The round's repair or bonus token is always pending: it was drawn from the last forward's "
    "output, so no forward has seen it.</li>"
    "<li><b>expected</b>: committed context minus what must be pending. A cache <i>longer</i> than "
    "expected kept entries of the rejected draft suffix: the next forward reads stale keys and values "
    "(an off-by-one crop shows as +1). A cache <i>shorter</i> than expected is fine while its "
    "recorded pending tokens cover the gap (a draft model does not process its own last token).</li>"
    "<li><b>cropped</b>: peak − after, the drafted entries thrown away.</li></ul>"
    "<p>The view zooms on the round's region; tick <i>whole cache</i> to see it from position 0.</p>"
)


@dataclass
class CacheDiagnosis:
    """What one cache did in a round and whether that matches the committed context."""

    name: str  # "target" or "draft"
    state: CacheState
    context: int  # committed context after the round
    expected: int  # context minus what must be pending
    problems: list[str] = field(default_factory=list)  # wrong, in words
    notes: list[str] = field(default_factory=list)  # fine, but worth saying

    @property
    def difference(self) -> int:
        return self.state.after - self.expected

    @property
    def ok(self) -> bool:
        return not self.problems


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def diagnose(r: Round, previous: Round | None = None, run_over: bool = False) -> list[CacheDiagnosis]:
    """The round's caches checked against the committed context (the checker's cache rules,
    said for a person). `run_over`: the run ended with this round, so nothing reads the caches again."""
    context = r.prefix_len + len(r.emitted)
    must_pend = 1 if r.emitted and r.emitted[-1].kind in ("repaired", "bonus") else 0
    out = []
    for name, cache, prev in (
        ("target", r.target_cache, previous.target_cache if previous else None),
        ("draft", r.draft_cache, previous.draft_cache if previous else None),
    ):
        if cache is None:
            continue
        d = CacheDiagnosis(name, cache, context, context - must_pend)
        if prev is not None and cache.before != prev.after:
            d.problems.append(
                f"{name} cache starts at {cache.before} but the previous round left {prev.after}: "
                f"it changed between rounds"
            )
        diff = d.difference
        if diff > 0:
            text = (
                f"{name} cache holds {_entries(diff)} more than expected ({cache.after} vs {d.expected}): "
                f"the rejected draft suffix was not cropped away (stale keys/values are read next round)"
            )
            if name == "draft" and run_over:
                d.notes.append(text + "; harmless here, the run ended and nothing reads it again")
            else:
                d.problems.append(text)
        elif diff < 0:
            if cache.after + len(cache.pending) == context:
                d.notes.append(f"{-diff} accepted token(s) still pending in the {name} cache: fed at the next round")
            else:
                d.problems.append(
                    f"{name} cache holds {cache.after} + {len(cache.pending)} pending = "
                    f"{cache.after + len(cache.pending)}, not the committed context {context}: "
                    f"{_entries(context - cache.after - len(cache.pending))} missing"
                )
        out.append(d)
    return out


# what the view says before a round is selected (an empty plot's axis read 5e-306 .. 1.5e-305)
# (a plot title: a wrapped label here once made the whole inspector taller)
EMPTY_KV = "select a round: its target and draft caches appear here (before, peak, after the crop, expected)"


class KVCacheView(QWidget):
    """Shows diagnose() of the RunModel's selected round."""

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        self.model = model
        self.whole = QCheckBox("whole cache")
        self.whole.setToolTip("Show each cache from position 0 instead of zooming on this round's region")
        self.whole.toggled.connect(lambda _: self._redraw())
        help_button = QToolButton()
        help_button.setText("?")
        help_button.setToolTip("What before, peak, after, pending and expected mean")
        help_button.clicked.connect(self.show_help)
        self.help_button = help_button
        self.title = QLabel("<b>KV caches</b>")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.title, 1)
        head.addWidget(self.whole)
        head.addWidget(help_button)
        self.verdict = QLabel("")
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setWordWrap(True)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground("w")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(head)
        layout.addWidget(self.verdict)
        layout.addWidget(self.graphics, 1)
        self.rows: list[_CacheRow] = [_CacheRow(self.graphics, i) for i in range(2)]
        self.graphics.setMinimumHeight(2 * ROW_MIN_PX)
        self.diagnoses: list[CacheDiagnosis] = []
        self.round_index = -1
        self.clear()

    def show_help(self) -> None:
        QMessageBox.information(self, "KV caches", HELP_HTML)

    def clear(self) -> None:
        self.diagnoses = []
        self.round_index = -1
        self.verdict.setText("")
        for row in self.rows:
            row.clear()
        self.rows[0].plot.setTitle(EMPTY_KV, size="8pt", color="#777777")

    def show_round(self, r: Round) -> None:
        i = r.index
        previous = self.model.rounds[i - 1] if 0 < i <= len(self.model.rounds) else None
        run_over = self.model.stop_reason is not None and i == len(self.model.rounds) - 1
        self.diagnoses = diagnose(r, previous, run_over)
        self.round_index = i
        self._redraw()

    def tooltip_of(self, d: CacheDiagnosis) -> str:
        return (
            f"expected {d.expected} = committed context {d.context} − {d.context - d.expected} token(s) "
            f"that must be pending; recorded pending: {len(d.state.pending)}"
        )

    def verdict_text(self) -> str:
        """Every problem and note, in words (plain text; what the label shows)."""
        return "\n".join(p for d in self.diagnoses for p in d.problems + d.notes)

    def _redraw(self) -> None:
        lines = []
        for d in self.diagnoses:
            lines += [f"<span style='color:{WRONG}'>✗ {p}</span>" for p in d.problems]
            lines += [f"<span style='color:#555555'>• {n}</span>" for n in d.notes]
        if self.diagnoses and not lines:
            lines.append(
                f"<span style='color:{OK}'>✔ every cache holds the committed context minus its pending token</span>"
            )
        self.verdict.setText("<br>".join(lines))
        self.graphics.setToolTip("\n".join(self.tooltip_of(d) for d in self.diagnoses))
        self.title.setText(f"<b>KV caches</b> · round {self.round_index}" if self.diagnoses else "<b>KV caches</b>")
        for j, row in enumerate(self.rows):
            if j < len(self.diagnoses):
                row.show(self.diagnoses[j], self.whole.isChecked())
            else:
                row.clear()
        if not self.diagnoses:
            self.rows[0].plot.setTitle(EMPTY_KV, size="8pt", color="#777777")


class _CacheRow:
    """One cache: kept / written / cropped / pending bars and four labelled markers at
    distinct heights (peak and before above the bar, after and expected below), so labels
    never sit on one another however close the lengths are."""

    def __init__(self, graphics: pg.GraphicsLayoutWidget, row: int):
        self.plot = graphics.addPlot(row=row, col=0)
        self.plot.hideAxis("left")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.setYRange(-1.45, 1.45, padding=0)
        self.plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.bars = {
            "kept": pg.BarGraphItem(x0=[], x1=[], y=[], height=0.5, brush=theme.CACHE_KEPT, pen=None),
            "written": pg.BarGraphItem(x0=[], x1=[], y=[], height=0.5, brush=theme.CACHE_NEW, pen=None),
            "cropped": pg.BarGraphItem(x0=[], x1=[], y=[], height=0.5, brush=pg.mkBrush(theme.CACHE_CROPPED), pen=None),
            "pending": pg.BarGraphItem(
                x0=[], x1=[], y=[], height=0.16, brush=theme.CACHE_PENDING, pen=pg.mkPen("#8a7f00")
            ),
            "wrong": pg.BarGraphItem(
                x0=[], x1=[], y=[], height=0.9, brush=pg.mkBrush(176, 0, 32, 60), pen=pg.mkPen(WRONG, width=2)
            ),
        }
        for item in self.bars.values():
            self.plot.addItem(item)
        self.lines = {}
        self.labels = {}
        for key, y, color, anchor in (
            ("peak", 1.05, "#333333", (0.0, 0.5)),
            ("before", 0.62, "#333333", (1.0, 0.5)),
            ("after", -0.62, "#333333", (0.5, 0.5)),
            ("expected", -1.05, OK, (0.5, 0.5)),
        ):
            style = Qt.PenStyle.DashLine if key == "expected" else Qt.PenStyle.SolidLine
            line = pg.PlotDataItem(pen=pg.mkPen(color, width=1.5, style=style))
            label = pg.TextItem("", color=color, anchor=anchor)
            self.plot.addItem(line)
            self.plot.addItem(label)
            self.lines[key], self.labels[key] = line, label
            label.y_at = y  # type: ignore[attr-defined]

    def clear(self) -> None:
        """Nothing drawn, no axis (an empty axis shows meaningless numbers)."""
        self.plot.setTitle("")
        self.plot.hideAxis("bottom")
        for item in self.bars.values():
            item.setOpts(x0=[], x1=[], y=[])
        for key in self.lines:
            self.lines[key].setData([], [])
            self.labels[key].setText("")

    def show(self, d: CacheDiagnosis, whole: bool) -> None:
        self.plot.showAxis("bottom")
        c = d.state
        color = WRONG if d.problems else OK
        mark = "✗" if d.problems else "✔"
        diff = f" ({d.difference:+d})" if d.difference else ""
        self.plot.setTitle(
            f"<span style='color:{color}'>{mark} {d.name} cache</span> · before {c.before} · "
            f"peak {c.peak} · after {c.after}{diff} · expected {d.expected}",
            size="9pt",
        )
        self.bars["kept"].setOpts(x0=[0], x1=[min(c.before, c.after)], y=[0])
        self.bars["written"].setOpts(x0=[min(c.before, c.after)], x1=[c.peak], y=[0])
        self.bars["cropped"].setOpts(
            x0=[c.after] if c.peak > c.after else [],
            x1=[c.peak] if c.peak > c.after else [],
            y=[0] if c.peak > c.after else [],
        )
        n_pend = len(c.pending)
        self.bars["pending"].setOpts(
            x0=[c.after] if n_pend else [], x1=[c.after + n_pend] if n_pend else [], y=[-0.36] if n_pend else []
        )
        bad = d.difference != 0 and d.problems
        lo_w, hi_w = sorted((c.after, d.expected))
        self.bars["wrong"].setOpts(x0=[lo_w] if bad else [], x1=[hi_w] if bad else [], y=[0] if bad else [])
        same = c.after == d.expected
        lo = min(c.after, d.expected)
        hi = max(c.peak, c.after + n_pend, d.expected)
        # zoom on what the round wrote and cropped; an earlier "before" is pointed at
        x0 = 0 if whole else max(0, lo - max(4, c.peak - lo))
        x1 = hi + max(2.5, 0.2 * (hi - x0))
        # labels point away from each other: peak to the right of its line, before to the
        # left of its own; below the bar, the longer of after/expected to the right
        anchors = {
            "peak": (0.0, 0.5),
            "before": (1.0, 0.5),
            "after": (0.0, 0.5) if c.after > d.expected else (1.0, 0.5),
            "expected": (1.0, 0.5) if c.after > d.expected else (0.0, 0.5),
        }
        if same:  # one label for both, right of the lines (centred, the expected line ran through it)
            anchors["after"] = (0.0, 0.5)
        for key, x in (("peak", c.peak), ("before", c.before), ("after", c.after), ("expected", d.expected)):
            y = self.labels[key].y_at
            self.lines[key].setData([x, x], [0, y * 0.8])
            text = f"{key} {x} " if anchors[key][0] == 1.0 else f" {key} {x}"
            anchor = anchors[key]
            if key == "before" and x - x0 < 0.25 * (x1 - x0):  # no room on its left: point at it
                text, x, anchor = (
                    (f"◀ before {c.before}", x0, (0.0, 0.5)) if x < x0 else (f" before {x}", x, (0.0, 0.5))
                )
            self.labels[key].setAnchor(anchor)
            if key == "after" and same:
                text = f"  after = expected {x}"
            if key == "expected" and same:
                text = ""
            self.labels[key].setText(text)
            self.labels[key].setPos(x, y)
        self.plot.setXRange(x0 - 0.5, x1, padding=0)
