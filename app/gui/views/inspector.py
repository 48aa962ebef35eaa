"""The round inspector: what happened at the selected position of the selected round.

- p (target) and q (draft) over the top tokens side by side, with min(p, q) outlined;
- the residual max(p - q, 0) (normalised) and its mass r at a rejection, the repair marked;
- the acceptance test: min(1, p/q) of the proposed token against the uniform draw u;
- the KV caches (kvview.KVCacheView): before / peak / after against the expected length,
  differences named in words.

The plots sit in a scroll area with a readable minimum height: a small window scrolls
instead of squashing them.

pyqtgraph items are created once and updated with setOpts/setData.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QBoxLayout, QFrame, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel, top_tokens, visible_text
from specscope.core.records import Round
from specscope.core.sampling.partial import known_ids

from .describe import COUPLED_REPAIR, after_accepted_eos, fmt, is_coupled, node_decision, tok
from .kvview import KVCacheView
from .navigator import place_words
from .tree_inspect import NodeResiduals, children_mode, decision_html, is_tree, node_residuals, updates_html

TOP_N = 10
PLOT_MIN_PX = 170  # the p/q plot's readable minimum height
SIDE_BY_SIDE_PX = 1000  # from this width the KV caches sit beside p/q
TICK_PX = 58  # width one bar's token label needs
MAX_LABEL = 7
AXIS_PX = 66  # the p/q plot's left axis: its label and ticks such as "0.0005"
RIGHT_SHARE = 0.4  # of the plots' width: the residual and acceptance-test column beside p/q
LAYOUT_SLACK_PX = 48  # the outer plot layouts' margins (9 px a side, twice) and the columns' spacing (6 px)


def _short(text: str) -> str:
    text = visible_text(text)
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


class RoundInspectorWidget(QWidget):
    """Shows the RunModel's selected (round, position)."""

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        self.model = model
        self.header = QLabel("Select a token in the timeline or a node in the draft tree.")
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setWordWrap(True)
        self.header.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self.header.setObjectName("inspectorHeader")
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground("w")
        self.graphics.setMinimumHeight(PLOT_MIN_PX + 40)
        self.kv = KVCacheView(model)
        body = QWidget()
        body_layout = self.body_layout = QVBoxLayout(body)
        body_layout.setContentsMargins(0, 0, 0, 0)
        body_layout.addWidget(self.graphics, 3)
        body_layout.addWidget(self.kv, 2)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setWidget(body)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.header)
        layout.addWidget(self.scroll, 1)
        self._build_plots()
        self._refit_timer = QTimer(self)  # the plot's width settles after a few resize steps
        self._refit_timer.setSingleShot(True)
        self._refit_timer.setInterval(50)
        self._refit_timer.timeout.connect(self._refit)
        self.pq_plot.vb.sigResized.connect(lambda *_: self._refit_timer.start())
        self.res_plot.vb.sigResized.connect(lambda *_: self._refit_timer.start())
        self.shown: tuple[int, int] = (-1, -1)
        self._fit_n = 0  # token bars the p/q plot was last drawn with
        self.values: dict[str, object] = {}  # what is displayed, for tests and export
        self.clear()
        model.selectionChanged.connect(self.show_position)
        model.reset.connect(self.clear)

    def resizeEvent(self, event) -> None:
        """Wide: the KV caches beside p/q, so both show without scrolling; narrow: below it."""
        super().resizeEvent(event)
        wide = self.width() >= SIDE_BY_SIDE_PX
        direction = QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom
        if self.body_layout.direction() != direction:
            self.body_layout.setDirection(direction)

    def _refit(self) -> None:
        """Redraw the shown position when a new width fits another number of token bars."""
        self._note_width()
        for plot in (self.res_plot, self.ratio_plot):
            self._wrap_title(plot)
        if self.shown[0] >= 0 and self._bars_fitting(self.pq_plot) != self._fit_n:
            self.show_position(*self.shown)

    # ------------------------------------------------------------------ plots

    def _build_plots(self) -> None:
        g = self.graphics
        top = g.addLayout(row=0, col=0)
        right = top.addLayout(row=0, col=1)
        right.layout.setContentsMargins(0, 0, 0, 0)  # nested: the outer layouts' margins suffice
        self.pq_plot = top.addPlot(row=0, col=0)
        self._pq_title("p")
        self.pq_plot.getAxis("left").enableAutoSIPrefix(False)
        self.pq_plot.setLabel("left", "probability")
        # room for the label and ticks as long as "0.0005" from the start: the axis widened
        # only after a paint, and the label overlapped the ticks until then
        self.pq_plot.getAxis("left").setWidth(AXIS_PX)
        self.p_bars = pg.BarGraphItem(x=[], height=[], width=0.38, brush=theme.P_COLOR, pen=None)
        self.q_bars = pg.BarGraphItem(x=[], height=[], width=0.38, brush=theme.Q_COLOR, pen=None)
        self.min_bars = pg.BarGraphItem(x=[], height=[], width=0.86, brush=None, pen=pg.mkPen(theme.MIN_COLOR, width=2))
        self.marker = pg.ScatterPlotItem(size=12, symbol="t", brush="#333333", pen=None)
        self.emit_marker = pg.ScatterPlotItem(
            size=13, symbol="star", brush=theme.KIND_EDGE[theme.REPAIRED].name(), pen=None
        )
        self.pq_note = pg.TextItem("", color="#777777", anchor=(0.5, 0.5))  # what the empty plot will show
        for item in (self.p_bars, self.q_bars, self.min_bars, self.marker, self.emit_marker, self.pq_note):
            self.pq_plot.addItem(item)
        self.pq_plot.setMouseEnabled(x=False, y=False)
        self.pq_plot.hideButtons()

        self.res_plot = right.addPlot(row=0, col=0)
        self.res_plot.getAxis("left").enableAutoSIPrefix(False)
        self.res_plot.getAxis("left").setWidth(AXIS_PX - 18)  # ticks, no label
        self._right_title(self.res_plot, "residual max(p − q, 0) / r")
        self.res_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=theme.RESIDUAL_COLOR, pen=None)
        self.res_plot.addItem(self.res_bars)
        self.res_text = pg.TextItem("", color="#555555", anchor=(0.5, 0.5))  # wrapped to the plot's width
        self.res_plot.addItem(self.res_text)
        self.res_plot.setMouseEnabled(x=False, y=False)
        self.res_plot.hideButtons()
        top.layout.setColumnStretchFactor(0, round(10 * (1 - RIGHT_SHARE)))
        top.layout.setColumnStretchFactor(1, round(10 * RIGHT_SHARE))

        self.ratio_plot = right.addPlot(row=1, col=0)
        self._right_title(
            self.ratio_plot, f"acceptance test: u vs <span style='color:{theme.ACCEPT_RATE}'>min(1, p/q)</span>"
        )
        self.accept_bar = pg.BarGraphItem(x0=[0], x1=[0], y=[0], height=0.5, brush=theme.ACCEPT_RATE, pen=None)
        self.reject_bar = pg.BarGraphItem(x0=[0], x1=[1], y=[0], height=0.5, brush="#f3d3d3", pen=None)
        self.ratio_plot.addItem(self.reject_bar)
        self.ratio_plot.addItem(self.accept_bar)
        self.u_line = pg.InfiniteLine(
            pos=0,
            angle=90,
            pen=pg.mkPen("#222222", width=2.5),
            label="u",
            labelOpts={"position": 0.92, "color": "#222222"},
        )
        self.ratio_plot.addItem(self.u_line)
        self.ratio_plot.setXRange(0, 1, padding=0.02)
        self.ratio_plot.setYRange(-0.5, 0.95, padding=0)
        self.ratio_plot.getAxis("left").setTicks([[(0, "accept")]])
        self.ratio_plot.setMouseEnabled(x=False, y=False)
        self.ratio_plot.hideButtons()

        right.layout.setRowStretchFactor(0, 3)
        right.layout.setRowStretchFactor(1, 2)
        self.pq_plot.setMinimumHeight(PLOT_MIN_PX)
        self.res_plot.setMinimumHeight(PLOT_MIN_PX * 3 // 5)
        self.ratio_plot.setMinimumHeight(PLOT_MIN_PX * 2 // 5)
        self.ratio_title = "acceptance test: u vs min(1, p/q)"

    # ------------------------------------------------------------------ update

    def clear(self) -> None:
        """Nothing selected: fixed 0..1 axes without token ticks, each plot saying what will
        appear in it (the residual's empty axes read -0.4..0.4, and a new run kept the last
        round's ranges and ticks; the acceptance test showed a rejection band and u = 0)."""
        self.shown = (-1, -1)
        self.values = {}
        self.header.setText("Select a token in the timeline or a node in the draft tree.")
        for bars in (self.p_bars, self.q_bars, self.min_bars, self.res_bars):
            bars.setOpts(x=[], height=[])
        self.marker.setData([], [])
        self.emit_marker.setData([], [])
        self.kv.clear()
        for plot in (self.pq_plot, self.res_plot):
            plot.getAxis("bottom").setTicks([[]])
            plot.setXRange(0, 1, padding=0)
            plot.setYRange(0, 1, padding=0)
        self.pq_note.setHtml(
            "<div style='text-align:center'>select a token: p (target) and q (draft)<br>"
            "over the likeliest tokens appear here</div>"
        )
        self.pq_note.setPos(0.5, 0.5)
        self.pq_note.show()
        self._right_title(self.res_plot, "residual max(p − q, 0) / r")
        self._note_width()
        self.res_text.setHtml(
            "<div style='text-align:center; color:#777777'>a rejected draft's residual "
            "(what its repair is drawn from) appears here</div>"
        )
        self.res_text.setPos(0.5, 0.5)
        self._ratio_title("acceptance test: u vs min(1, p/q)")  # longer, it widened the inspector past 1024 px
        self.accept_bar.setOpts(x0=[0], x1=[0], y=[0])
        self.reject_bar.hide()
        self.u_line.hide()
        self._pq_title("p")

    def show_position(self, round_index: int, pos: int) -> None:
        if not 0 <= round_index < len(self.model.rounds):
            self.clear()
            return
        r = self.model.full_round(round_index)
        self.shown = (round_index, pos)
        self._show(r, pos)

    def _show(self, r: Round, pos: int) -> None:
        is_bonus_pos = pos >= len(r.nodes)
        node = None if is_bonus_pos else r.nodes[pos]
        p, q = (node.p, node.q) if node is not None else (r.bonus_p, None)
        tree = self._tree_node(r, node)
        if tree is not None and tree.p_prime is not None:
            p = tree.p_prime  # a tree node is judged against its parent's running p'
        emitted_here, emitted_kind = _emitted_at(r, pos, is_bonus_pos)
        lines = self._header_lines(r, pos, node, emitted_here, emitted_kind)
        if tree is not None:
            decision = decision_html(tree, node, self.model.token_text)
            if decision is not None:
                lines[1] = decision  # the node's line: judged against p', not its parent's first p
            lines.append(updates_html(tree, self.model.token_text))
        self.header.setText("<br>".join(lines))
        self.pq_note.hide()
        self.reject_bar.show()
        self._pq_title("p′" if tree is not None and tree.p_prime is not None and tree.rank != 1 else "p")
        must = [t for t in (node.token if node is not None else None, emitted_here) if t is not None]
        ids, pv, qv, mins = self._show_pq(
            p, q, must, node.token if node is not None else None, emitted_here if emitted_kind != "accepted" else None
        )
        resid, mass = (r.residual, r.residual_mass) if (node is not None and r.rejected_node == pos) else (None, None)
        update = next((u for u in tree.updates if u.child == pos), None) if tree is not None else None
        if update is not None and update.p_after is not None:
            resid, mass = update.p_after, update.mass  # p' after this node's rejection
        self._show_residual(r, node, resid, emitted_here, mass)
        self._show_acceptance(r, node, tree)
        self.kv.show_round(r)
        self.values = {
            "round": r.index,
            "pos": pos,
            "tokens": ids,
            "p": [float(v) for v in pv],
            "q": [float(v) for v in qv],
            "min": [float(v) for v in mins],
            "ratio": node.ratio if node is not None else None,
            "u": node.u if node is not None else None,
            "status": node.status if node is not None else "bonus",
            "residual_mass": mass if resid is not None else None,
            "tree": None
            if tree is None
            else {
                "parent": tree.parent,
                "tried": tree.tried,
                "rank": tree.rank,
                "source": tree.source,
                "p_prime": tree.p_prime is not None,
                "accept_p": tree.accept_p,
                "updates": [(u.child, u.token, u.mass) for u in tree.updates],
            },
            "target_cache": (r.target_cache.before, r.target_cache.peak, r.target_cache.after, r.target_cache.pending),
            "draft_cache": (
                None
                if r.draft_cache is None
                else (r.draft_cache.before, r.draft_cache.peak, r.draft_cache.after, r.draft_cache.pending)
            ),
            "header": self.header.text(),
        }

    def _tree_node(self, r: Round, node) -> NodeResiduals | None:
        if node is None or not is_tree(r):
            return None
        params = self.model.config.proposer_params if self.model.config is not None else None
        return node_residuals(r, node.index, children_mode(params))

    def _pq_title(self, p_name: str) -> None:
        sq = "&#9632;"
        self.pq_plot.setTitle(
            f"<span style='color:{theme.P_COLOR}'>{sq} {p_name}</span> &nbsp;"
            f"<span style='color:{theme.Q_COLOR}'>{sq} q</span> &nbsp;"
            f"<span style='color:{theme.MIN_COLOR}'>&#9633; min({p_name},q)</span> &nbsp;"
            f"&#9660; proposed &nbsp;<span style='color:{theme.KIND_EDGE[theme.REPAIRED].name()}'>&#9733; "
            "emitted</span>",
            size="9pt",
        )

    def _header_lines(self, r: Round, pos: int, node, emitted_here: int | None, emitted_kind: str | None) -> list[str]:
        tt = self.model.token_text
        head = [
            f"<b>round {r.index}</b> · {place_words(r, pos)} · prefix {r.prefix_len}"
            f" · accepted length {r.accepted_length}"
        ]
        if node is not None and r.greedy:
            # a greedy draft records no q: what it believed is its own argmax, the token it proposed
            p_arg = float(node.p[node.target_argmax]) if node.p is not None else None
            head.append(
                f"draft believed {tok(node.token, tt)} (its argmax; greedy drafts keep no q): "
                f"p = {fmt(node.p_token)}; the target's argmax {tok(node.target_argmax, tt)} has p = "
                f"{fmt(p_arg)} — {node_decision(node, True, tt, after_accepted_eos(r, node))}"
            )
        elif node is not None:
            head.append(
                f"draft {tok(node.token, tt)}: p = {fmt(node.p_token)}, q = {fmt(node.q_token)}, "
                f"p/q = {fmt(node.ratio)} — "
                f"{node_decision(node, r.greedy, tt, after_accepted_eos(r, node), is_coupled(self.model.config))}"
            )
            if node.overlap is not None:
                head.append(f"Σ min(p, q) = {fmt(node.overlap)}")
        elif r.bonus is not None:
            head.append(f"all drafts accepted: bonus {tok(r.bonus.token, tt)} sampled from p")
        elif r.bonus_withheld:
            head.append("all drafts accepted; the bonus was withheld (budget reached)")
        else:
            head.append("no bonus in this round (a draft was rejected)")
        saved = _saved_without_full_vectors(
            node.p if node is not None else r.bonus_p, node.q if node is not None else None
        )
        if saved:
            head.append(saved)
        if emitted_here is not None and emitted_kind == "repaired":
            head.append(
                f"repair {tok(emitted_here, tt)} = target argmax"
                if r.greedy
                else f"repair {tok(emitted_here, tt)}: {COUPLED_REPAIR}"
                if is_coupled(self.model.config)
                else f"repair {tok(emitted_here, tt)} drawn from the residual (r = {fmt(r.residual_mass)})"
            )
        return head

    def _bars_fitting(self, plot) -> int:
        """How many token bars fit the plot's width without their labels colliding."""
        width = plot.vb.width() if plot.vb.width() > 0 else self.graphics.width() / 2
        return max(3, min(TOP_N, int(width // TICK_PX) + 1))

    def _show_pq(self, p, q, must: list[int], proposed: int | None, emitted: int | None):
        """The p vs q bars over the top tokens; (token ids, p, q, min(p, q)) as shown."""
        tt = self.model.token_text
        self._fit_n = self._bars_fitting(self.pq_plot)
        ids = (
            _cap(top_tokens([p, q], self._fit_n, must), self._fit_n, must)
            if p is not None
            else np.zeros(0, dtype=np.int64)
        )
        xs = np.arange(len(ids), dtype=float)
        pv = p[ids] if p is not None and len(ids) else np.zeros(len(ids))
        qv = q[ids] if q is not None and len(ids) else np.zeros(len(ids))
        self.p_bars.setOpts(x=xs - 0.2, height=pv)
        self.q_bars.setOpts(x=xs + 0.2, height=qv)
        mins = np.minimum(pv, qv) if q is not None else np.zeros(len(ids))
        self.min_bars.setOpts(x=xs, height=mins)
        ticks = [(float(i), _short(tt(int(t)))) for i, t in enumerate(ids)]
        self.pq_plot.getAxis("bottom").setTicks([ticks])
        top = float(max(pv.max() if len(pv) else 0, qv.max() if len(qv) else 0, 1e-6))
        self.pq_plot.setYRange(0, top * 1.18, padding=0)
        self.pq_plot.setXRange(-0.7, max(len(ids) - 0.3, 1), padding=0)
        ids_list = [int(t) for t in ids]
        for marker, token in ((self.marker, proposed), (self.emit_marker, emitted)):
            if token is not None and token in ids_list:
                j = ids_list.index(token)
                marker.setData([j], [max(pv[j], qv[j]) + top * 0.08])
            else:
                marker.setData([], [])
        return ids_list, pv, qv, mins

    def _show_residual(self, r: Round, node, resid, emitted_here: int | None, mass=None) -> None:
        tt = self.model.token_text
        if resid is not None:
            rids = top_tokens(
                [resid], self._bars_fitting(self.res_plot), [emitted_here] if emitted_here is not None else []
            )
            rv = resid[rids]
            brushes = [
                pg.mkBrush(theme.KIND_EDGE[theme.REPAIRED])
                if int(t) == emitted_here
                else pg.mkBrush(theme.RESIDUAL_COLOR)
                for t in rids
            ]
            self.res_bars.setOpts(x=np.arange(len(rids), dtype=float), height=rv, brushes=brushes)
            self.res_plot.getAxis("bottom").setTicks([[(float(i), _short(tt(int(t)))) for i, t in enumerate(rids)]])
            self._right_title(self.res_plot, f"residual max(p−q,0)/r, r = {fmt(mass, 3)}")
            self.res_plot.setYRange(0, float(max(rv.max(), 1e-6)) * 1.1, padding=0)
            self.res_plot.setXRange(-0.7, max(len(rids) - 0.3, 1), padding=0)
            self.res_text.setText("")
            return
        self.res_bars.setOpts(x=[], height=[], brushes=None)
        self.res_plot.getAxis("bottom").setTicks([[]])
        self._right_title(self.res_plot, "residual max(p − q, 0) / r")
        rejected = node is not None and node.status == "rejected"
        reason = (
            "greedy: the repair is the target argmax"
            if r.greedy and rejected
            else "coupled: the repair is the target's pick y_j, no residual"
            if rejected and is_coupled(self.model.config)
            else "no rejection at this position: residual unused"
        )
        self.res_plot.setXRange(0, 1, padding=0)
        self.res_plot.setYRange(0, 1, padding=0)
        self._note_width()
        self.res_text.setHtml(f"<div style='text-align:center; color:#555555'>{reason}</div>")
        self.res_text.setPos(0.5, 0.5)

    def _note_width(self) -> None:
        """The residual plot's note wraps inside the plot (one line of it was clipped on both
        sides of a narrow plot)."""
        width = self.res_plot.vb.width()
        self.res_text.setTextWidth(max(60.0, (width if width > 0 else 200.0) - 12))

    def _show_acceptance(self, r: Round, node, tree: NodeResiduals | None = None) -> None:
        # a tree node's test is min(1, p'(x)/q_c(x)), not the p/q of its parent's first p
        ratio = tree.accept_p if tree is not None and tree.accept_p is not None else (node.ratio if node else None)
        if node is not None and node.u is not None and ratio is not None:
            a = min(1.0, ratio)
            self.accept_bar.setOpts(x0=[0], x1=[a], y=[0])
            self.u_line.setValue(node.u)
            self.u_line.show()
            rel = "&lt;" if node.status == "accepted" else "≥"
            # the numbers are in the header and on the axis: the title stays short enough for a narrow plot
            test = "p′/q_c" if tree is not None and tree.accept_p is not None else "p/q"
            self._ratio_title(f"u {rel} min(1, {test}) → <b>{node.status}</b>")
        elif node is not None and ratio is not None and node.status in ("accepted", "rejected") and not r.greedy:
            self.accept_bar.setOpts(x0=[0], x1=[min(1.0, ratio)], y=[0])
            self.u_line.hide()  # transformers' generate() draws u inside its loop and keeps none
            self._ratio_title(f"u was not recorded; min(1, p/q) = {min(1.0, ratio):.2f} → <b>{node.status}</b>")
        elif node is not None and r.greedy:
            ok = node.status == "accepted"
            self.accept_bar.setOpts(x0=[0], x1=[1.0 if ok else 0.0], y=[0])
            self.u_line.hide()
            tt = self.model.token_text
            self._ratio_title(
                f"greedy: draft {_short(tt(node.token))} vs target argmax "
                f"{_short(tt(node.target_argmax))} → <b>{node.status}</b>"
            )
        else:
            self.accept_bar.setOpts(x0=[0], x1=[0], y=[0])
            self.u_line.hide()
            self._ratio_title(
                "bonus position: no acceptance test"
                if node is None
                else "not visited (after an accepted EOS): no test"
                if after_accepted_eos(r, node)
                else "never reached: no test"
            )

    def _ratio_title(self, text: str) -> None:
        self._right_title(self.ratio_plot, text)

    def _right_title(self, plot, text: str) -> None:
        """A title of the right column's plots, wrapped to the column's share of the width: set
        whole, a long one ("greedy: draft ... vs target argmax ... → rejected") widened the
        plots past the inspector, and the residual plot and its note were cut at 1024 px."""
        plot.setTitle(text, size="9pt")
        self._wrap_title(plot)

    def _wrap_title(self, plot) -> None:
        label = plot.titleLabel
        minimum = Qt.SizeHint.MinimumSize
        beside = (
            self.pq_plot.effectiveSizeHint(minimum).width() + plot.getAxis("left").effectiveSizeHint(minimum).width()
        )
        room = max(
            100,
            int(
                min(
                    self.graphics.viewport().width() * RIGHT_SHARE,
                    self.graphics.viewport().width() - beside - LAYOUT_SLACK_PX,
                )
            ),
        )
        label.item.setTextWidth(-1)
        if label.item.boundingRect().width() > room:
            label.item.setTextWidth(room)
        label.updateMin()
        label.resizeEvent(None)


def _cap(ids: np.ndarray, limit: int, must: list[int]) -> np.ndarray:
    """At most `limit` ids in their order (the union of two top-n lists can hold 2n), never
    dropping a `must` token."""
    if len(ids) <= limit:
        return ids
    keep = set(must)
    room = max(0, limit - len([t for t in ids if int(t) in keep]))
    out = []
    for t in ids:
        if int(t) in keep:
            out.append(t)
        elif room:
            out.append(t)
            room -= 1
    return np.asarray(out, dtype=np.int64)


def _emitted_at(r: Round, pos: int, is_bonus_pos: bool) -> tuple[int | None, str | None]:
    """(token, kind) emitted at a draft position (accepted or repaired there) or at the bonus position."""
    emitted_here = emitted_kind = None
    for e in r.emitted:
        if (e.kind in ("accepted", "repaired") and e.node == pos) or (e.kind == "bonus" and is_bonus_pos):
            emitted_here, emitted_kind = e.token, e.kind
    return emitted_here, emitted_kind


def _saved_without_full_vectors(p, q) -> str:
    """A line for distributions loaded from a trace that kept only their top-N: what the
    bars cannot show (how many tokens have mass, how much of it the stored entries hold)."""
    parts = []
    for name, dist in (("p", p), ("q", q)):
        ids = None if dist is None else known_ids(dist)  # None: a full vector
        stats = getattr(dist, "stats", None)
        if ids is not None and stats is not None:
            shown = float(np.asarray(dist)[ids].sum())
            parts.append(f"{name} has {stats.support} tokens &gt; 0, {shown:.3f} of its mass stored")
    return "<i>saved without full vectors:</i> " + "; ".join(parts) if parts else ""
