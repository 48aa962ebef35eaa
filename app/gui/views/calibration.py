"""The Calibration tab: is the proposer's confidence worth anything, and does a draft head
accept as often as its training said? It draws what app/gui/model/calibration.py computes
for the window's run (live or replayed), and follows it: a new run or another opened trace
starts it afresh, rounds arriving extend it (redrawn at most 4 times a second).

Left: the reliability curve, each confidence bin's mean confidence against the fraction of
its reached nodes accepted (all depths, and depth by depth), with each bin's count; the
diagonal is a perfectly calibrated proposer. Right: acceptance by depth (accepted / reached)
as bars, with the head's training accuracy by depth as a line when the run's proposer is a
head whose config.json records one; the text below says why there is no line otherwise, and
where the realised rate falls far below the trained one.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from specscope.app.gui import theme
from specscope.app.gui.model.calibration import Calibration, CalibrationTally, head_reference
from specscope.app.gui.model.runmodel import RunModel

REFRESH_MS = 250
HEADROOM = 1.32  # the plots' first y range: 0 .. 1 for the data, above it the legend's rows (fit to its height)
NARROW_PX = 760  # below this width the two plots stack
DEPTH_COLORS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7")  # depth 1 .. 4+ (Okabe-Ito)
TRAINED = "#d55e00"
EMPTY_TEXT = (
    "<b>Calibration</b> of the run's proposer appears here once a run has drafted: its confidence "
    "(the probability it gave each token it proposed) against how often those tokens were accepted, "
    "and the acceptance rate by depth against the accuracy by depth a draft head's training recorded. "
    "Run, or open a trace."
)


def _style(plot: pg.PlotItem, title: str, left: str, bottom: str) -> None:
    plot.setTitle(title, size="9pt")
    plot.setLabel("left", left)
    plot.setLabel("bottom", bottom)
    plot.showGrid(x=True, y=True, alpha=0.15)
    plot.setMenuEnabled(False)
    plot.getAxis("bottom").enableAutoSIPrefix(False)


class CalibrationView(QWidget):
    """The reliability curve and acceptance by depth of the model's run (module docstring)."""

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        self.model = model
        self.tally = CalibrationTally()
        self.reference = head_reference(None)
        self.calibration: Calibration | None = None
        self.header = QLabel(EMPTY_TEXT)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setWordWrap(True)
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.PlainText)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground("w")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.header)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.verdict)
        self._build()
        self._stacked = False
        self._dirty = True
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        model.reset.connect(self._on_reset)
        model.appended.connect(self._on_appended)
        model.finished.connect(lambda _reason: self.refresh())
        self._on_reset()

    # ------------------------------------------------------------------ building

    def _build(self) -> None:
        self.reliability = self.graphics.addPlot(row=0, col=0)
        _style(self.reliability, "confidence against acceptance", "fraction accepted", "draft confidence (bin mean)")
        # headroom above 1 for the legend's rows, so that it never covers a point
        self.reliability.setRange(xRange=(0, 1), yRange=(0, HEADROOM), padding=0.02)
        self.reliability.getAxis("left").setTicks([[(v / 5, f"{v / 5:.1f}") for v in range(6)]])
        self.reliability_legend = self.reliability.addLegend(offset=(4, 2), labelTextSize="8pt", colCount=3)
        self.diagonal = pg.PlotDataItem([0, 1], [0, 1], pen=pg.mkPen("#9a9a9a", style=Qt.PenStyle.DashLine))
        self.reliability.addItem(self.diagonal)
        self.all_curve = pg.PlotDataItem(
            pen=pg.mkPen(theme.MEASURED, width=2), symbol="o", symbolSize=7, symbolBrush=theme.MEASURED
        )
        self.reliability.addItem(self.all_curve)
        self.depth_curves = []
        for color in DEPTH_COLORS:
            curve = pg.PlotDataItem(
                pen=pg.mkPen(color + "90", width=1), symbol="o", symbolSize=5, symbolBrush=color, symbolPen=None
            )
            self.reliability.addItem(curve)
            self.depth_curves.append(curve)
        self.count_labels: list[pg.TextItem] = []
        self.depths = self.graphics.addPlot(row=0, col=1)
        _style(self.depths, "acceptance by depth", "P(accept | reached)", "depth")
        self.depths.setYRange(0, HEADROOM, padding=0)
        self.depths.getAxis("left").setTicks([[(v / 5, f"{v / 5:.1f}") for v in range(6)]])
        self.depths_legend = self.depths.addLegend(offset=(4, 2), labelTextSize="8pt", colCount=2)
        for plot, legend in ((self.reliability, self.reliability_legend), (self.depths, self.depths_legend)):
            plot.vb.sigResized.connect(lambda _vb, plot=plot, legend=legend: self._fit_headroom(plot, legend))
        self.realised_bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=theme.P_COLOR + "b0")
        self.depths.addItem(self.realised_bars)
        self.trained_line = pg.PlotDataItem(
            pen=pg.mkPen(TRAINED, width=2), symbol="s", symbolSize=7, symbolBrush=TRAINED, symbolPen=None
        )
        self.depths.addItem(self.trained_line)
        self.depth_labels: list[pg.TextItem] = []

    @staticmethod
    def _fit_headroom(plot: pg.PlotItem, legend: pg.LegendItem) -> None:
        """The y range above 1 that the legend's rows take at the plot's height: its points
        never hide under it, and a tall plot wastes no room on it."""
        height = plot.vb.height()
        need = legend.boundingRect().height() + 30  # and a bar's two-line label at 1.0
        if height <= need:
            return
        top = 1.0 + min(1.0, max(0.08, need / (height - need))) * 1.02
        plot.setYRange(0, top, padding=0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        stacked = event.size().width() < NARROW_PX
        if stacked != self._stacked:
            self._stacked = stacked
            layout = self.graphics.ci
            layout.removeItem(self.depths)
            layout.addItem(self.depths, row=1 if stacked else 0, col=0 if stacked else 1)

    # ------------------------------------------------------------------ following the run

    def _on_reset(self) -> None:
        self.tally = CalibrationTally()
        self.reference = head_reference(self.model.config)
        self.tally.extend(self.model.rounds)
        self._dirty = True
        self.refresh()

    def _on_appended(self, first: int, count: int) -> None:
        rounds = self.model.rounds
        for i in range(first, first + count):
            self.tally.add(rounds[i])
        self._dirty = True

    def _tick(self) -> None:
        if self._dirty and self.isVisible():
            self.refresh()

    # ------------------------------------------------------------------ drawing

    def refresh(self) -> None:
        self._dirty = False
        c = self.calibration = self.tally.result(self.reference)
        self._draw_reliability(c)
        self._draw_depths(c)
        self.header.setText(self._header(c))
        self.verdict.setText(c.verdict())
        self.verdict.setVisible(not c.empty)
        self._fit_headroom(self.reliability, self.reliability_legend)
        self._fit_headroom(self.depths, self.depths_legend)

    def _header(self, c: Calibration) -> str:
        if self.model.config is None or c.empty:
            return EMPTY_TEXT
        cfg = self.model.config
        params = cfg.proposer_params or {}
        what = (
            f"draft model {params['draft']}"
            if cfg.proposer == "draft" and params.get("draft")
            else f"{cfg.proposer} head {params['head']}"
            if params.get("head")
            else cfg.proposer
        )
        sampling = "greedy" if cfg.sampling.greedy else f"T={cfg.sampling.temperature:g}"
        known = (
            f"{c.with_confidence} of {c.reached} reached nodes recorded a confidence"
            if c.with_confidence < c.reached
            else f"{c.reached} reached nodes"
        )
        text = f"<b>{what}</b>, {sampling}, {c.rounds} rounds: {known}."
        if not c.with_confidence:
            text += (
                " <i>No confidence recorded</i> (prompt lookup and the transformers engine have none, nor do "
                "traces written before it was recorded): the reliability curve stays empty."
            )
        else:
            ece = c.curves[0].calibration_error()
            text += f" Calibration error (count-weighted |confidence - accepted|): {ece:.3f}."
            if not cfg.sampling.greedy:  # why a sampled run's points sit above the diagonal
                text += (
                    " <i>Sampled: a drawn token is accepted with probability min(1, p/q), so an unlikely "
                    "draw can still be accepted.</i>"
                )
        return text

    def _draw_reliability(self, c: Calibration) -> None:
        for label in self.count_labels:
            self.reliability.removeItem(label)
        self.count_labels = []
        legend = self.reliability_legend
        legend.clear()
        legend.addItem(self.diagonal, "calibrated")
        for item in (self.all_curve, *self.depth_curves):
            item.setData([], [])
        if not c.curves:
            return
        overall, by_depth = c.curves[0], c.curves[1:]
        self.all_curve.setData(overall.confidence, overall.accepted)
        legend.addItem(self.all_curve, "all depths")
        for curve in by_depth:  # "depth 2", "depth 4+": each depth keeps its colour
            item = self.depth_curves[curve.depth - 1]
            item.setData(curve.confidence, curve.accepted)
            legend.addItem(item, curve.label)
        for x, y, n in zip(overall.confidence, overall.accepted, overall.counts):  # each bin's count
            label = pg.TextItem(str(int(n)), color="#444444", anchor=(0.5, 1.2))
            label.setPos(float(x), float(y))
            self.reliability.addItem(label)
            self.count_labels.append(label)

    def _draw_depths(self, c: Calibration) -> None:
        for label in self.depth_labels:
            self.depths.removeItem(label)
        self.depth_labels = []
        rates = c.acceptance_by_depth
        depths = np.arange(1, len(rates) + 1, dtype=float)
        shown = ~np.isnan(rates)
        self.realised_bars.setOpts(x=depths[shown], height=rates[shown])
        trained = self.reference.accuracy
        legend = self.depths_legend
        legend.clear()
        if not c.empty:
            legend.addItem(self.realised_bars, "this run")
        if trained is not None and not c.empty:
            self.trained_line.setData(np.arange(1, len(trained) + 1, dtype=float), np.asarray(trained))
            legend.addItem(self.trained_line, f"training ({self.reference.label})")
        else:
            self.trained_line.setData([], [])
        for d, rate, n in zip(depths[shown], rates[shown], c.depth_reached[shown]):
            label = pg.TextItem(f"{rate:.2f}\nn={int(n)}", color="#333333", anchor=(0.5, 1.0))
            label.setPos(float(d), float(rate))
            self.depths.addItem(label)
            self.depth_labels.append(label)
        width = max(len(rates), len(trained or ()), 1)
        self.depths.setXRange(0.4, width + 0.6, padding=0)
        self.depths.getAxis("bottom").setTicks([[(d, str(d)) for d in range(1, width + 1)]])

    # ------------------------------------------------------------------ for tests and the status bar

    def numbers(self) -> dict:
        """What the view shows, as numbers (the tests read these)."""
        c = self.calibration
        if c is None or c.empty:
            return {"empty": True, "text": self.header.text()}
        overall = c.curves[0] if c.curves else None
        return {
            "empty": False,
            "bins": []
            if overall is None
            else [
                (round(float(x), 6), round(float(y), 6), int(n))
                for x, y, n in zip(overall.confidence, overall.accepted, overall.counts)
            ],
            "acceptance_by_depth": [None if math.isnan(r) else float(r) for r in c.acceptance_by_depth],
            "reached_by_depth": [int(n) for n in c.depth_reached],
            "training": None if self.reference.accuracy is None else list(self.reference.accuracy),
            "verdict": c.verdict(),
        }
