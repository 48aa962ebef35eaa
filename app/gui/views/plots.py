"""Live plots of a run, redrawn from the RunModel's metric buffers at <= 30 Hz.

Plot items are created once; `refresh()` only calls setData/setOpts on numpy views, and
only when new rounds arrived since the last frame. The frame interval adapts to what a
frame costs (the refresh and its paints): drawing holds the GIL, which the decoding thread
needs, so at most about a tenth of the time goes to the plots
(scripts/measure_live_overhead.py measures what a live run costs in all).
"""

from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from specscope.app.gui import theme
from specscope.app.gui.model.metrics import ROLLING_WINDOW
from specscope.app.gui.model.runmodel import RunModel

FRAME_MS = 34  # <= 30 Hz
MAX_FRAME_MS = 1000  # at least one frame a second while rounds arrive
LEGEND_PLOTS = ("acceptance", "latency", "throughput", "cost")  # the plots with a legend
ROUND_PLOTS = LEGEND_PLOTS  # x = the round index: whole rounds, 0 to the last (at least 0..4)
MIN_ROUNDS_SHOWN = 5


def round_ticks(rounds: int, most: int = 8) -> int:
    """The spacing of whole-round ticks for `rounds` rounds: 1, 2, 5, 10, 20, 50... so that
    at most `most` ticks show (pyqtgraph's own ticks put 0.5 steps and -4..4 under one round)."""
    span = max(rounds, MIN_ROUNDS_SHOWN)
    step = 1
    while span / step > most:
        for factor in (2, 2.5, 2):  # 1 -> 2 -> 5 -> 10 -> 20 -> 50 ...
            step = int(step * factor)
            if span / step <= most:
                break
    return step


FRAME_COST_SHARE = 10  # frame interval >= 10 x (last refresh + the paints since the frame before)


class _TimedGraphics(pg.GraphicsLayoutWidget):
    """A GraphicsLayoutWidget that adds up the time its paints take (pyqtgraph often paints
    a refreshed layout two or three times, as the axes follow the new ranges)."""

    paint_s = 0.0

    def paintEvent(self, event) -> None:
        started = time.perf_counter()
        super().paintEvent(event)
        self.paint_s += time.perf_counter() - started


def _style(plot: pg.PlotItem, title: str, left: str, bottom: str) -> None:
    plot.setTitle(title, size="9pt")
    plot.setLabel("left", left)
    plot.setLabel("bottom", bottom)
    plot.showGrid(x=True, y=True, alpha=0.15)


class LivePlotsWidget(QWidget):
    """Acceptance, accepted-length histogram, per-position acceptance, latency split,
    tokens/s and the cost model's prediction next to the measurement."""

    PLOTS = ("acceptance", "histogram", "positions", "latency", "throughput", "cost")

    def __init__(
        self,
        model: RunModel,
        compact: bool = False,
        color: str | None = None,
        shown: tuple[str, ...] | None = None,
        show_summary: bool = True,
        legends: bool = True,
        parent=None,
    ):
        super().__init__(parent)
        self.model = model
        self.compact = compact
        self.color = color
        self.shown = tuple(shown or self.PLOTS)
        self.legends = legends
        self.graphics = _TimedGraphics()
        self.graphics.setBackground("w")
        self.summary = QLabel("")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.summary)
        self.summary.setVisible(show_summary)
        self.plots: dict[str, pg.PlotItem] = {}
        self._build()
        for plot in self.plots.values():  # rounds are counts: never "round (x0.001)"
            plot.getAxis("bottom").enableAutoSIPrefix(False)
        for name in LEGEND_PLOTS:  # the legend's strip is a share of the plot's height
            self.plots[name].vb.sigResized.connect(self._on_plot_resized)
        self._empty_axes: bool | None = None  # whether the axes show the empty run's fixed range
        self._dirty = True
        self._line_at: int | None = None  # a selection to show at the next frame
        self.frames = 0  # redraws done (tests check the throttle)
        self.timer = QTimer(self)
        self.timer.setInterval(FRAME_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        model.reset.connect(self.mark_dirty)
        model.appended.connect(self.mark_dirty)
        model.finished.connect(self._on_finished)
        model.selectionChanged.connect(self._on_selection)

    def _build(self) -> None:  # long: the plot items, created once in their layout order
        g = self.graphics
        cols = 2 if self.compact else 3
        hidden = pg.GraphicsLayout()  # plots not shown still exist, so refresh() stays uniform
        for i, name in enumerate(self.PLOTS):
            if name in self.shown:
                j = self.shown.index(name)
                self.plots[name] = g.addPlot(row=j // cols, col=j % cols)
            else:
                self.plots[name] = hidden.addPlot(row=0, col=i)
        self._hidden_layout = hidden
        c = self.color
        # acceptance per round + rolling mean
        p = self.plots["acceptance"]
        _style(p, "acceptance per round", "accepted / drafted", "round")
        self._legend(p)
        self.acc_scatter = pg.ScatterPlotItem(
            size=5, brush=pg.mkBrush(c or theme.ACCEPT_RATE), pen=None, name="per round"
        )
        self.acc_mean = pg.PlotDataItem(pen=pg.mkPen(theme.MEASURED, width=2), name=f"rolling mean ({ROLLING_WINDOW})")
        p.addItem(self.acc_scatter)
        p.addItem(self.acc_mean)
        # token trees: the same plot shows accepted length per round (accepted / drafted says
        # little when most of a tree's nodes are off the accepted path by design)
        self.len_scatter = pg.ScatterPlotItem(
            size=5, brush=pg.mkBrush(c or theme.KIND_EDGE[theme.ACCEPTED].name()), pen=None, name="per round"
        )
        self.len_mean = pg.PlotDataItem(pen=pg.mkPen(theme.MEASURED, width=2), name=f"rolling mean ({ROLLING_WINDOW})")
        p.setYRange(0, 1.05, padding=0)
        self.tree_mode = False
        self.round_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.SELECT_COLOR, style=Qt.PenStyle.DashLine))
        p.addItem(self.round_line)
        # accepted length histogram
        p = self.plots["histogram"]
        _style(p, "accepted length", "rounds", "accepted + 1")
        self.hist = pg.BarGraphItem(x=[], height=[], width=0.8, brush=c or theme.KIND_EDGE[theme.ACCEPTED].name())
        p.addItem(self.hist)
        # per-position acceptance
        p = self.plots["positions"]
        _style(p, "acceptance by position", "P(accept | reached)", "draft position")
        self.pos_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=c or theme.P_COLOR)
        p.addItem(self.pos_bars)
        p.setYRange(0, 1.05, padding=0)
        # latency split
        p = self.plots["latency"]
        _style(p, "latency per round", "ms", "round")
        self._legend(p)
        self.lat_total = pg.PlotDataItem(
            pen=pg.mkPen(theme.VERIFY_TIME, width=1),
            fillLevel=0,
            brush=pg.mkBrush(theme.VERIFY_TIME + "90"),
            name="verify (on top)",
        )
        self.lat_draft = pg.PlotDataItem(
            pen=pg.mkPen(theme.DRAFT_TIME, width=1),
            fillLevel=0,
            brush=pg.mkBrush(theme.DRAFT_TIME + "c0"),
            name="draft",
        )
        p.addItem(self.lat_total)
        p.addItem(self.lat_draft)
        # throughput
        p = self.plots["throughput"]
        _style(p, "throughput", "tokens / s", "round")
        self._legend(p)
        self.tps_round = pg.PlotDataItem(
            pen=None, symbol="o", symbolSize=4, symbolBrush=pg.mkBrush(c or "#56b4e9"), symbolPen=None, name="per round"
        )
        self.tps_cum = pg.PlotDataItem(pen=pg.mkPen(theme.MEASURED, width=2), name="cumulative")
        p.addItem(self.tps_round)
        p.addItem(self.tps_cum)
        # cost model
        p = self.plots["cost"]
        _style(p, "cost model vs measured", "tokens / round", "round")
        self._legend(p)
        self.cost_meas = pg.PlotDataItem(pen=pg.mkPen(theme.MEASURED, width=2), name="measured")
        self.cost_alpha = pg.PlotDataItem(pen=pg.mkPen(theme.PREDICTED, width=2, style=Qt.PenStyle.DashLine), name="α")
        self.cost_pos = pg.PlotDataItem(
            pen=pg.mkPen(theme.PREDICTED_2, width=2, style=Qt.PenStyle.DotLine), name="positions"
        )
        for item in (self.cost_meas, self.cost_alpha, self.cost_pos):
            p.addItem(item)

    def _legend(self, plot: pg.PlotItem, offset: tuple[int, int] = (5, 1), columns: int = 3) -> None:
        """A one-row legend along the top of the plot; the y range keeps that strip free of
        data (_clear_legend_strips): a legend in a corner covered points and lines."""
        if self.legends:
            legend = plot.addLegend(
                offset=offset,
                labelTextSize="7pt",
                colCount=columns,
                brush=pg.mkBrush(255, 255, 255, 200),
                pen=None,
                horSpacing=2,
            )
            legend.layout.setContentsMargins(1, 0, 1, 0)  # one thin row: the strip it takes from a small plot
            legend.layout.setVerticalSpacing(0)

    def _on_plot_resized(self, *args) -> None:
        self._clear_legend_strips()

    def _clear_legend_strips(self) -> None:
        """Each y range from 0 to above the data's top (its 98th percentile, so that a warm-up
        spike does not flatten the rest, once there are 12 points) by the legend's strip."""
        for name in LEGEND_PLOTS:
            plot = self.plots[name]
            ys = [
                np.asarray(item.getData()[1], dtype=float)
                for item in plot.listDataItems()
                if item.getData()[1] is not None
            ]
            values = np.concatenate(ys) if ys else np.zeros(0)
            values = values[np.isfinite(values)]
            if not len(values):
                continue
            if name == "acceptance" and not self.tree_mode:
                top = 1.05
            else:
                top = float(np.percentile(values, 98) if len(values) >= 12 else values.max()) * 1.1
                top = max(top, 1.0 if name == "acceptance" else 1e-9)
            legend, height = plot.legend, plot.vb.height()
            strip = (legend.boundingRect().height() + 2) / height if legend is not None and height > 0 else 0.0
            plot.setYRange(0, top / (1 - min(strip, 0.5)), padding=0)

    # ------------------------------------------------------------------ refresh

    def mark_dirty(self, *args) -> None:
        self._dirty = True

    def _on_finished(self, *args) -> None:
        """The finished run's last picture now, not at the next throttled frame (the summary
        once read 31 rounds while the status bar had the finished run's 33)."""
        self.refresh()

    def _on_selection(self, rnd: int, pos: int) -> None:
        if self.model.source == "live" and self.model.stop_reason is None and self.model.rounds:
            # while rounds arrive, the next frame moves the line: an immediate move would
            # repaint all six plots each time the window follows the newest round
            self._line_at = rnd
            self._dirty = True
        else:
            self.round_line.setValue(rnd)

    def _tick(self) -> None:
        if self._dirty and self.isVisible():
            started = time.perf_counter()
            self.refresh()
            # this frame's paints come later: the paints since the last frame stand in for them
            cost_ms = 1e3 * (time.perf_counter() - started + self.graphics.paint_s)
            self.graphics.paint_s = 0.0
            self.timer.setInterval(int(min(MAX_FRAME_MS, max(FRAME_MS, FRAME_COST_SHARE * cost_ms))))

    def refresh(self) -> None:
        self._dirty = False
        self.frames += 1
        if self._line_at is not None:
            self.round_line.setValue(self._line_at)
            self._line_at = None
        m = self.model.metrics
        x = m["round"]
        self._fix_empty_axes(not len(m))
        self._set_tree_mode(m.tree_rounds > 0)
        if self.tree_mode:
            lengths = m["accepted_length"]
            self.len_scatter.setData(x, lengths)
            self.len_mean.setData(x, m["rolling_length"], connect="finite")
        else:
            acc = m["acceptance"]
            ok = np.isfinite(acc)  # rounds without a proposal have no acceptance rate
            self.acc_scatter.setData(x[ok], acc[ok])
            self.acc_mean.setData(x, m["rolling_acceptance"], connect="finite")
        hist = m.length_hist
        self.hist.setOpts(x=np.arange(len(hist), dtype=float), height=hist.astype(float))
        if len(hist):
            self.plots["histogram"].setXRange(0.4, max(len(hist) - 0.4, 2), padding=0)
            self.plots["histogram"].getAxis("bottom").setTicks([[(float(i), str(i)) for i in range(1, len(hist))]])
        rates = m.per_position()
        if self.tree_mode:  # depths past the deepest tried node are not positions of the tree
            rates = rates[: int(np.flatnonzero(m.visited)[-1]) + 1] if m.visited.any() else rates[:0]
        self.pos_bars.setOpts(x=np.arange(1, len(rates) + 1, dtype=float), height=np.nan_to_num(rates))
        self.plots["positions"].getAxis("bottom").setTicks([[(float(i), str(i)) for i in range(1, len(rates) + 1)]])
        self.lat_total.setData(x, (m["draft_s"] + m["verify_s"]) * 1e3)
        self.lat_draft.setData(x, m["draft_s"] * 1e3)
        self.tps_round.setData(x, m["tokens_per_s"], connect="finite")
        self.tps_cum.setData(x, m["cumulative_tokens_per_s"], connect="finite")
        self.cost_meas.setData(x, m["measured_mean"], connect="finite")
        # the cost model is a chain's (k drafts, i.i.d. acceptance): no prediction for a tree
        empty = x[:0]
        self.cost_alpha.setData(*((empty, empty) if self.tree_mode else (x, m["pred_alpha"])), connect="finite")
        self.cost_pos.setData(*((empty, empty) if self.tree_mode else (x, m["pred_positions"])), connect="finite")
        self._round_axes(len(m))
        self._clear_legend_strips()
        self.summary.setText(self.summary_html())

    def _round_axes(self, rounds: int) -> None:
        """The plots over rounds show rounds 0 to the last (at least 0..4), ticked at whole rounds."""
        if not rounds:
            return
        step = round_ticks(rounds)
        for name in ROUND_PLOTS:
            plot = self.plots[name]
            plot.setXRange(-0.5, max(rounds, MIN_ROUNDS_SHOWN) - 0.5, padding=0)
            plot.getAxis("bottom").setTickSpacing(step, step)

    def _fix_empty_axes(self, empty: bool) -> None:
        """Before any round, rounds 0..10 by 0..1 without the last run's position ticks
        (autoranging nothing but the round line once gave -400..400; a new run kept the last
        one's y ranges and histogram ticks); with rounds, the axes follow the data again."""
        if empty == self._empty_axes:
            return
        self._empty_axes = empty
        for name, plot in self.plots.items():
            if empty:
                plot.setXRange(0, 10, padding=0)
                plot.setYRange(0, 1.05 if name in ("acceptance", "positions") else 1, padding=0)
                if name in ("histogram", "positions"):
                    plot.getAxis("bottom").setTicks(None)
                if name in ROUND_PLOTS:
                    plot.getAxis("bottom").setTickSpacing()  # pyqtgraph's own again
            else:
                if name not in ROUND_PLOTS:  # those get whole rounds (_round_axes)
                    plot.enableAutoRange(axis="x")
                if name == "histogram":  # the other plots set their y range at each refresh
                    plot.enableAutoRange(axis="y")

    def _set_tree_mode(self, tree: bool) -> None:
        """Token trees: accepted length per round, and acceptance by depth (accepted / tried)."""
        if tree == self.tree_mode:
            return
        self.tree_mode = tree
        acc, pos = self.plots["acceptance"], self.plots["positions"]
        lengths, rates = (self.len_scatter, self.len_mean), (self.acc_scatter, self.acc_mean)
        shown, hidden = (lengths, rates) if tree else (rates, lengths)
        legend = acc.legend
        for item in hidden:
            acc.removeItem(item)
        for item in shown:
            acc.addItem(item)
        if legend is not None:  # removeItem/addItem keep the legend in step with the items
            legend.setOffset((5, 1))
        cost = self.plots["cost"]
        if cost.legend is not None:  # no prediction lines for a tree: none in the legend either
            for item in (self.cost_alpha, self.cost_pos):
                if tree:
                    cost.legend.removeItem(item)
                else:
                    cost.legend.addItem(item, item.name())
        if tree:
            _style(acc, "accepted length per round (tree)", "accepted + 1", "round")
            _style(pos, "acceptance by depth", "accepted / tried", "tree depth")
            _style(cost, "mean accepted length (no tree cost model)", "tokens / round", "round")
        else:
            _style(cost, "cost model vs measured", "tokens / round", "round")
            _style(acc, "acceptance per round", "accepted / drafted", "round")
            _style(pos, "acceptance by position", "P(accept | reached)", "draft position")

    def summary_html(self) -> str:
        m = self.model.metrics
        if not len(m):
            return "<i>no rounds yet: these plots fill as a run's rounds arrive</i>"
        est = m.cost_estimate()
        parts = [
            f"<b>{len(m)}</b> rounds",
            f"<b>{m.emitted_total}</b> tokens",
            f"acceptance <b>{m.acceptance_rate:.3f}</b>"
            if m.drafted_total
            else "acceptance <b>—</b> (nothing drafted yet)",
            f"mean accepted length <b>{m.mean_accepted_length:.2f}</b>",
        ]
        if m.time_total > 0:
            parts.append(f"{m.emitted_total / m.time_total:.1f} tok/s")
        if m.tree_rounds:
            parts.append(f"tree: {(m.drafted_total - m.accepted_total) / len(m):.1f} nodes discarded per round")
            est = None  # the cost model is a chain's (k drafts, i.i.d. acceptance): it does not predict trees
        if est is not None:
            parts.append(
                f"cost model (v = 1 verify, c = {est.c:.2f}, α = {est.alpha:.3f}, k = {est.k}): "
                f"E = <span style='color:{theme.PREDICTED}'>{est.expected_alpha:.2f}</span> predicted vs "
                f"<b>{est.measured:.2f}</b> measured; speedup "
                f"<span style='color:{theme.PREDICTED}'>{est.speedup_predicted:.2f}×</span> predicted vs "
                f"<b>{est.speedup_measured:.2f}×</b> measured"
            )
        return " · ".join(parts)
