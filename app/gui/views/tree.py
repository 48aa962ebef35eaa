"""The draft-tree view: the selected round's draft as a tree.

The committed prefix is the root; each draft node hangs off its parent. The accepted path
is drawn thick, the rejected node red, unvisited nodes greyed and dashed, the repair token
as a sibling of the rejected node (same parent, same depth) and the bonus as the child of
the last accepted node. Chain drafts are the tree of one branch. In a token tree each tried
node is captioned with its place in its siblings' tried order and its draw ("#2 u=0.41"),
a rejected node's tooltip says how much its rejection took off its parent's p', and the
title counts the nodes off the accepted path.

The tree fills its pane: drawn sideways (depth across) or downwards (depth down, siblings side
by side), whichever fits larger, scaled to the pane (never below a readable MIN_SCALE: then it
scrolls). Ctrl+wheel zooms, the wheel alone scrolls, a double click fits it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen, QTransform
from PySide6.QtWidgets import (
    QGraphicsPathItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel, visible_text
from specscope.core.records import Round

from .describe import after_accepted_eos, describe_node, fmt, tok

DX = 104  # room for the edges of wide trees to fan out
# a node's tag below it ("rejected") and the next sibling's note above it ("#2 u=0.59") both fit
# between, off the borders (13 px each)
DY = 58
NODE_W = 78
NODE_H = 30
# Drawn downwards (depth down the pane, siblings side by side), for a tree wider than deep in
# a wide, low pane: a 16-node dynamic tree drawn sideways filled the left third of the pane
# with 7 px labels and scrolled.
DOWN_DX = NODE_W + 12
DOWN_DY = NODE_H + 44  # the note above a node and the tag below its parent fit between
MIN_SCALE = 0.6  # smaller, and the node labels cannot be read: the tree scrolls instead
MAX_FIT = 1.25  # a small tree is drawn up to this much larger to fill its pane
ZOOM_STEP = 1.15  # Ctrl+wheel: per notch
ZOOM_RANGE = (0.4, 4.0)  # of the fitted size


@dataclass
class TreeNode:
    key: str  # "root", "n<i>", "repair", "bonus"
    label: str
    kind: int
    parent: str | None
    depth: int
    pos: int  # position to select on click (-1: none)
    tooltip: str
    y: float = 0.0
    note: str = ""  # token trees: the tried order and the draw


EMPTY_NOTE = (
    "select a round: its draft tree appears here (each drafted token accepted or rejected, the repair or bonus)"
)


def build_tree(r: Round, token_text, prompt_tail: str) -> list[TreeNode]:
    """The nodes to draw for one round, with their parents (pure, testable)."""
    nodes = [
        TreeNode(
            "root",
            prompt_tail,
            theme.PROMPT,
            None,
            0,
            -1,
            f"committed prefix ({r.prefix_len} tokens), ends with “{prompt_tail}”",
        )
    ]
    notes = tree_notes(r)
    for n in r.nodes:
        parent = "root" if n.parent < 0 else f"n{n.parent}"
        nodes.append(
            TreeNode(
                f"n{n.index}",
                visible_text(token_text(n.token)),
                theme.KIND_OF_STATUS[n.status],
                parent,
                n.depth,
                n.index,
                describe_node(r, n, token_text) + _update_tip(r, n.index),
                note=notes.get(n.index, ""),
            )
        )
    rep = r.repair
    if rep is not None and rep.node is not None and rep.node < len(r.nodes):
        rejected = r.nodes[rep.node]
        parent = "root" if rejected.parent < 0 else f"n{rejected.parent}"
        tip = f"<b>repair</b> {tok(rep.token, token_text)} replaces {tok(rejected.token, token_text)}<br>" + (
            "greedy: the target argmax"
            if r.greedy
            else f"drawn from max(p − q, 0)/r, r = {fmt(r.residual_mass)}, u = {fmt(rep.draw)}"
        )
        nodes.append(
            TreeNode(
                "repair", visible_text(token_text(rep.token)), theme.REPAIRED, parent, rejected.depth, rep.node, tip
            )
        )
    bonus = r.bonus
    if bonus is not None:
        accepted = [n for n in r.nodes if n.status == "accepted"]
        last = max(accepted, key=lambda n: n.depth) if accepted else None
        parent = f"n{last.index}" if last is not None else "root"
        depth = (last.depth if last is not None else 0) + 1
        p = r.bonus_p
        p_txt = fmt(float(p[bonus.token])) if p is not None and bonus.token < len(p) else "—"
        tip = (
            f"<b>bonus</b> {tok(bonus.token, token_text)}: every draft accepted, one more token from "
            f"the target's p (p(x) = {p_txt}, u = {fmt(bonus.draw)})"
        )
        nodes.append(
            TreeNode("bonus", visible_text(token_text(bonus.token)), theme.BONUS, parent, depth, len(r.nodes), tip)
        )
    _layout(nodes)
    return nodes


def is_tree(r: Round) -> bool:
    return any(n.parent != n.index - 1 for n in r.nodes)


def shape(r: Round) -> str:
    """A token tree's size: its nodes, depth and width (the most nodes at one depth)."""
    per_depth: dict[int, int] = {}
    for n in r.nodes:
        per_depth[n.depth] = per_depth.get(n.depth, 0) + 1
    return f"{len(r.nodes)} nodes, depth {max(per_depth, default=0)}, width {max(per_depth.values(), default=0)}"


def tree_notes(r: Round) -> dict[int, str]:
    """Token trees: node -> "#rank u=draw", rank = its place among its tried siblings."""
    if not is_tree(r):
        return {}
    notes: dict[int, str] = {}
    rank: dict[int, int] = {}
    for n in r.nodes:  # siblings are tried in index order
        if n.status == "unvisited":
            continue
        rank[n.parent] = rank.get(n.parent, 0) + 1
        notes[n.index] = f"#{rank[n.parent]}" + ("" if n.u is None else f" u={n.u:.2f}")
    return notes


def _update_tip(r: Round, index: int) -> str:
    tree = getattr(r, "tree", None)
    update = next((u for u in getattr(tree, "updates", ()) if u.child == index), None)
    if update is None:
        return ""
    return f"<br>rejected: p′ at its parent ← normalise(max(p′ − q, 0)), mass kept {fmt(float(update.mass))}"


def _layout(nodes: list[TreeNode]) -> None:
    """y by depth-first leaf order; parents centred over their children."""
    children: dict[str, list[TreeNode]] = {}
    for n in nodes:
        if n.parent is not None:
            children.setdefault(n.parent, []).append(n)
    # draft nodes first, in index order (the tried order: "n10" after "n9"), the repair
    # below its rejected sibling
    order = {"repair": 1, "bonus": 0}
    for kids in children.values():
        kids.sort(key=lambda n: (order.get(n.key, 0), n.pos))
    next_leaf = [0.0]

    def place(n: TreeNode) -> float:
        kids = children.get(n.key, [])
        if not kids:
            n.y = next_leaf[0]
            next_leaf[0] += 1
            return n.y
        ys = [place(k) for k in kids]
        n.y = ys[0]  # the main branch stays on one line
        return n.y

    place(nodes[0])


class _NodeItem(QGraphicsPathItem):
    def __init__(self, node: TreeNode, selected: bool):
        path = QPainterPath()
        path.addRoundedRect(QRectF(-NODE_W / 2, -NODE_H / 2, NODE_W, NODE_H), 7, 7)
        super().__init__(path)
        self.node = node
        fill = theme.KIND_FILL[node.kind]
        edge = theme.KIND_EDGE[node.kind]
        self.setBrush(QBrush(fill))
        pen = QPen(theme.SELECT_COLOR if selected else edge, 3 if selected else 1.5)
        if node.kind == theme.UNVISITED:
            pen.setStyle(Qt.PenStyle.DashLine)
        self.setPen(pen)
        self.setToolTip(node.tooltip)
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        label = node.label if len(node.label) <= 9 else node.label[:8] + "…"
        text = QGraphicsSimpleTextItem(label, self)
        text.setFont(theme.mono_font(10))
        text.setBrush(QBrush(theme.KIND_TEXT[node.kind]))
        br = text.boundingRect()
        text.setPos(-br.width() / 2, -br.height() / 2)
        if node.kind in (theme.REJECTED, theme.UNVISITED):
            strike = QGraphicsPathItem(self)
            sp = QPainterPath()
            sp.moveTo(-br.width() / 2 - 2, 0)
            sp.lineTo(br.width() / 2 + 2, 0)
            strike.setPath(sp)
            strike.setPen(QPen(edge, 1.5))
        tag = {theme.REPAIRED: "repair", theme.BONUS: "bonus", theme.REJECTED: "rejected"}.get(node.kind)
        if tag:
            t = QGraphicsSimpleTextItem(tag, self)
            t.setFont(theme.mono_font(8))
            t.setBrush(QBrush(edge))
            t.setPos(-NODE_W / 2 + 3, NODE_H / 2 + 1)  # clear of the border (it cut the text's top)
        if node.note:
            n = QGraphicsSimpleTextItem(node.note, self)
            n.setFont(theme.mono_font(8))
            n.setBrush(QBrush(edge))
            n.setPos(-NODE_W / 2 + 3, -NODE_H / 2 - n.boundingRect().height() - 1)  # above the border, not on it


class DraftTreeView(QWidget):
    """The selected round's draft tree; clicking a node selects that position."""

    nodeClicked = Signal(int, int)
    heightWanted = Signal(int)  # the pane height that shows the round's tree 1:1 (the page grows it)

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        self.model = model
        self.title = QLabel("Draft tree")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)  # a tree's long legend wraps instead of widening the window past 1024 px
        self.scene = QGraphicsScene(self)
        self.view = QGraphicsView(self.scene)
        self.view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.view.setBackgroundBrush(QColor("#ffffff"))
        self.view.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.view.setToolTip("")
        self.view.mousePressEvent = self._view_press  # type: ignore[method-assign]
        self.view.wheelEvent = self.wheel  # type: ignore[method-assign]
        self.view.mouseDoubleClickEvent = lambda _e: self.reset_zoom()  # type: ignore[method-assign]
        self.view.resizeEvent = self._view_resized  # type: ignore[method-assign]
        self.zoom = 1.0  # Ctrl+wheel, on top of the fit to the pane (kept from round to round)
        self.down = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addWidget(self.view, 1)
        self.nodes: list[TreeNode] = []
        self.items: dict[str, _NodeItem] = {}
        self.shown: tuple[int, int] = (-1, -1)
        self.clear()
        model.selectionChanged.connect(self.show_round)
        model.reset.connect(self.clear)

    def clear(self) -> None:
        """No round: the pane says what it will show (it was a blank box)."""
        self.scene.clear()
        self.nodes, self.items = [], {}
        self.shown = (-1, -1)
        self.title.setText("Draft tree")
        note = self.scene.addText(EMPTY_NOTE)
        note.setDefaultTextColor(QColor("#777777"))
        self.scene.setSceneRect(note.boundingRect())
        self.view.resetTransform()

    def show_round(self, round_index: int, pos: int) -> None:
        if not 0 <= round_index < len(self.model.rounds):
            self.clear()
            return
        r = self.model.rounds[round_index]
        self.shown = (round_index, pos)
        tt = self.model.token_text
        prefix_ids = list(self.model.config.prompt_ids) if self.model.config else []
        out = self.model.output_tokens
        prefix_ids.extend(out[: r.emitted_before])
        tail = visible_text(tt(prefix_ids[-1])) if prefix_ids else "prefix"
        self.nodes = build_tree(r, tt, tail)
        self.scene.clear()
        self.items = {}
        by_key = {n.key: n for n in self.nodes}
        self.down = self._draw_down(self.nodes)
        accepted_keys = {f"n{n.index}" for n in r.nodes if n.status == "accepted"} | {"root", "bonus"}
        for n in self.nodes:
            if n.parent is None:
                continue
            par = by_key[n.parent]
            (px, py), (cx, cy) = self.place(par), self.place(n)
            if self.down:
                path = QPainterPath(QPointF(px, py + NODE_H / 2))
                mid = (py + cy) / 2
                path.cubicTo(QPointF(px, mid), QPointF(cx, mid), QPointF(cx, cy - NODE_H / 2))
            else:
                path = QPainterPath(QPointF(px + NODE_W / 2, py))
                mid = (px + cx) / 2
                path.cubicTo(QPointF(mid, py), QPointF(mid, cy), QPointF(cx - NODE_W / 2, cy))
            edge = QGraphicsPathItem(path)
            on_path = n.key in accepted_keys or n.key == "repair"
            color = theme.KIND_EDGE[n.kind] if on_path else QColor("#bbbbbb")
            pen = QPen(color, 3 if on_path else 1.2)
            if n.kind == theme.UNVISITED:
                pen.setStyle(Qt.PenStyle.DashLine)
            edge.setPen(pen)
            edge.setZValue(-1)
            self.scene.addItem(edge)
        for n in self.nodes:
            item = _NodeItem(n, selected=(n.pos == pos and n.key != "root"))
            item.setPos(*self.place(n))
            self.scene.addItem(item)
            self.items[n.key] = item
        eos_cut = any(after_accepted_eos(r, n) for n in r.nodes)
        legend = (
            f"<b>round {r.index}</b> draft tree · "
            f"{r.accepted}/{r.drafted} accepted · "
            + ("drafts after an accepted EOS discarded · " if eos_cut else "")
            + (f"{shape(r)} · {r.drafted - r.accepted} off the accepted path · " if is_tree(r) else "")
            + " ".join(
                f"<span style='color:{theme.KIND_EDGE[k].name()}'>■ {theme.KIND_NAMES[k]}</span>"
                for k in (theme.ACCEPTED, theme.REJECTED, theme.UNVISITED, theme.REPAIRED, theme.BONUS)
            )
        )
        self.title.setText(legend)
        rect = self.scene.itemsBoundingRect().adjusted(-10, -4, 10, 4)  # the notes and tags are inside already
        self.scene.setSceneRect(rect)
        self.heightWanted.emit(self.wanted_height())
        self._fit()

    def place(self, n: TreeNode) -> tuple[float, float]:
        """A node's centre in the scene: depth across and leaves down, or (self.down) depth
        down and leaves across."""
        return (n.y * DOWN_DX, n.depth * DOWN_DY) if self.down else (n.depth * DX, n.y * DY)

    def _draw_down(self, nodes: list[TreeNode]) -> bool:
        """Whether the tree fits its pane larger drawn downwards than sideways (a bushy tree
        in a wide, low pane); a chain stays a line across."""
        depth = max((n.depth for n in nodes), default=0) + 1
        leaves = max((n.y for n in nodes), default=0) + 1
        if leaves <= 2:
            return False
        vp = self.view.viewport().size()
        w, h = max(vp.width(), 1), max(vp.height(), 1)
        across = min(w / (depth * DX), h / (leaves * DY))
        down = min(w / (leaves * DOWN_DX), h / (depth * DOWN_DY + 20))
        return down > across

    def wheel(self, event) -> None:
        """Ctrl+wheel zooms the tree (about the pointer); the wheel alone scrolls it."""
        if not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            QGraphicsView.wheelEvent(self.view, event)
            return
        notches = event.angleDelta().y() / 120
        if notches:
            low, high = ZOOM_RANGE
            self.zoom = min(high, max(low, self.zoom * ZOOM_STEP**notches))
            self.view.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
            self._fit(center=False)
            self.view.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        event.accept()

    def reset_zoom(self) -> None:
        self.zoom = 1.0
        if self.nodes:
            self._fit()

    def scale(self) -> float:
        """How much the tree is drawn larger (>1) or smaller than 1:1."""
        return self.view.transform().m11()

    def wanted_height(self) -> int:
        """The height showing title and tree whole at 1:1."""
        margins = self.layout().contentsMargins()
        title = self.title.heightForWidth(max(self.width(), 200))
        frame = 2 * self.view.frameWidth() + 4
        return int(self.scene.sceneRect().height()) + max(title, 0) + margins.top() + margins.bottom() + frame + 4

    def _fit(self, center: bool = True) -> None:
        """Scaled to fill the pane (up to MAX_FIT), not below a readable MIN_SCALE (a big
        token tree scrolls then, the selected node in view), times the Ctrl+wheel zoom."""
        rect = self.scene.sceneRect()
        vp = self.view.viewport().size()
        fit = min(MAX_FIT, vp.width() / max(rect.width(), 1), vp.height() / max(rect.height(), 1))
        scale = max(MIN_SCALE, fit) * self.zoom
        self.view.setTransform(QTransform.fromScale(scale, scale))
        if not center:
            return
        selected = next(
            (
                self.items[n.key]
                for n in self.nodes
                if n.pos == self.shown[1] and n.key != "root" and n.key in self.items
            ),
            None,
        )
        if selected is not None:
            self.view.centerOn(selected)

    def _view_resized(self, event) -> None:
        """The pane, or the title above the tree (a legend wrapping to another line), changed
        the tree's room: fit it again."""
        QGraphicsView.resizeEvent(self.view, event)
        if self.nodes and 0 <= self.shown[0] < len(self.model.rounds):
            if self._draw_down(self.nodes) != self.down:
                self.show_round(*self.shown)  # the other way round fits the new shape better
            else:
                self._fit()

    def _view_press(self, event) -> None:
        item = self.view.itemAt(event.position().toPoint())
        while item is not None and not isinstance(item, _NodeItem):
            item = item.parentItem()
        if isinstance(item, _NodeItem) and item.node.pos >= 0 and self.shown[0] >= 0:
            self.click_node(item.node.key)
        QGraphicsView.mousePressEvent(self.view, event)

    def click_node(self, key: str) -> None:
        node = next((n for n in self.nodes if n.key == key), None)
        if node is None or node.pos < 0:
            return
        self.model.select(self.shown[0], node.pos)
        self.nodeClicked.emit(self.shown[0], node.pos)
