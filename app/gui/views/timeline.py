"""The token timeline: every token of the run as a coloured cell, painted by hand.

One custom-painted scroll area; only the cells in the visible rows are painted, and the
layout is extended incrementally as rounds arrive, so runs of many thousands of tokens
stay fluid. Two layouts:

- flow (the main view): variable-width cells in reading order; each round shows its
  accepted drafts, its discarded drafts struck through, then the repair or bonus; a token
  tree's round shows its accepted path, then one badge counting its discarded nodes;
- aligned (compare mode): one fixed-width cell per output position, so position n sits at
  the same place in two timelines of the same width; discarded drafts appear as a red
  corner mark on the repair cell.
"""

from __future__ import annotations

import bisect

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QMouseEvent, QPainter, QPen, QPolygon
from PySide6.QtWidgets import QAbstractScrollArea, QToolTip

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import RunModel

from .describe import badge_text, describe_cell, describe_tree_round, is_coupled, is_tree_run

PAD_X = 4
PAD_Y = 2
GAP = 2
ROUND_GAP = 7
MARGIN = 6
MAX_CELL_CHARS = 16
ALIGNED_CHARS = 7
ALIGNED_MIN_SCALE = 0.65  # an aligned cell draws a long token down to this share of the font size
DISCARDED = (theme.REJECTED, theme.UNVISITED)
# what an empty timeline says: which key and which button start a run
EMPTY_TEXT = (
    "No rounds yet.\nPress Space, or the Run button at the top of the Run panel, to start a run;\n"
    "Right runs one round at a time. Ctrl+O opens a stored trace."
)


class TokenTimelineWidget(QAbstractScrollArea):
    """Paints the cells of a RunModel; click selects (round, position), hover explains."""

    cellClicked = Signal(int, int)  # round, position

    def __init__(self, model: RunModel, aligned: bool = False, parent=None):
        super().__init__(parent)
        self.model = model
        self.aligned = aligned
        self.empty_text = EMPTY_TEXT  # what the timeline says before its first round (a compare lane's own)
        self.setFont(theme.mono_font(10))
        self.setMouseTracking(True)
        self.viewport().setMouseTracking(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        self.setMinimumHeight(80)
        self.follow = True  # keep the newest row in view while a run streams in
        self.marker_pos: int | None = None  # output position to mark (first divergence)
        self._hover = -1
        self._width_cache: dict[str, int] = {}
        self._fit_cache: dict[tuple[str, int], tuple[str, QFont | None]] = {}
        self._reset_layout()
        self._ends_seen, self._end_out, self._stop_outs, self._ends_config = 0, None, set(), None
        model.reset.connect(self._on_reset)
        model.appended.connect(self._on_appended)
        model.selectionChanged.connect(self._on_selection)

    # ------------------------------------------------------------------ geometry

    def _reset_layout(self) -> None:
        self._laid = 0  # cells laid out so far (indices into model.cells)
        self._idx: list[int] = []  # cell index of each laid-out slot
        self._x: list[int] = []
        self._w: list[int] = []
        self._row: list[int] = []
        self._row_start: list[int] = []  # first slot of each row
        self._slot_of: dict[int, int] = {}  # cell index -> slot (aligned layout)
        self._cursor_x = MARGIN
        self._last_round = None
        self._layout_width = self._available_width()
        # token trees: a round's discarded nodes are one badge ("✗13"), not a cell each
        self._tree_run = is_tree_run(self.model)
        self.badges: dict[int, tuple[int, int]] = {}  # badge cell -> (first discarded cell, count)

    def _available_width(self) -> int:
        return max(120, self.viewport().width() - 2 * MARGIN)

    @property
    def row_height(self) -> int:
        return QFontMetrics(self.font()).height() + 2 * PAD_Y + 6

    def _text_width(self, text: str) -> int:
        w = self._width_cache.get(text)
        if w is None:
            fm = QFontMetrics(self.font())
            shown = text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"
            w = fm.horizontalAdvance(shown) + 2 * PAD_X
            w = max(w, fm.horizontalAdvance("00") + 2 * PAD_X)
            self._width_cache[text] = w
        return w

    def cell_text(self, text: str, room: int) -> tuple[str, QFont | None]:
        """What a cell shows of its token, and the smaller font it needs (None: the view's).
        A flow cell shows up to MAX_CELL_CHARS characters. An aligned cell has a fixed width:
        a longer token is drawn smaller (down to ALIGNED_MIN_SCALE) before it is elided
        (compare lanes read "·boun…" for "·boundary")."""
        if not self.aligned:
            return (text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"), None
        key = (text, room)
        hit = self._fit_cache.get(key)
        if hit is None:
            width = QFontMetrics(self.font()).horizontalAdvance(text)
            if width <= room:
                hit = (text, None)
            else:
                font = QFont(self.font())
                scale = max(ALIGNED_MIN_SCALE, room / width)
                if font.pointSizeF() > 0:
                    font.setPointSizeF(font.pointSizeF() * scale)
                else:  # a font sized in pixels
                    font.setPixelSize(max(1, int(font.pixelSize() * scale)))
                hit = (QFontMetrics(font).elidedText(text, Qt.TextElideMode.ElideRight, room), font)
            if len(self._fit_cache) > 4096:
                self._fit_cache.clear()
            self._fit_cache[key] = hit
        return hit

    def _aligned_cell_width(self) -> int:
        return QFontMetrics(self.font()).horizontalAdvance("0" * ALIGNED_CHARS) + 2 * PAD_X

    def aligned_columns(self) -> int:
        return max(1, self._available_width() // (self._aligned_cell_width() + GAP))

    def _extend_layout(self) -> None:
        cells = self.model.cells
        n = len(cells)
        width = self._layout_width
        right = MARGIN + width
        if self.aligned:
            cw = self._aligned_cell_width()
            cols = self.aligned_columns()
            for i in range(self._laid, n):
                p = cells.out_pos[i]
                if p < 0:
                    continue
                row, col = divmod(p, cols)
                while len(self._row_start) <= row:
                    self._row_start.append(len(self._idx))
                self._slot_of[i] = len(self._idx)
                self._idx.append(i)
                self._x.append(MARGIN + col * (cw + GAP))
                self._w.append(cw)
                self._row.append(row)
            self._laid = n
            return
        i = self._laid
        while i < n:
            if self._tree_run and cells.kind[i] in DISCARDED:
                i = self._place_badge(i, n, width)
                continue
            self._place(i, min(self._text_width(cells.text[i]), width), right)
            i += 1
        self._laid = n

    def _place(self, i: int, w: int, right: int) -> int:
        """Lay cell i out after the last one (a new row when it does not fit); its x."""
        rnd = self.model.cells.round[i]
        new_round = self._last_round is not None and rnd != self._last_round
        x = self._cursor_x + (ROUND_GAP if new_round else 0)
        if not self._row_start or x + w > right:
            self._row_start.append(len(self._idx))
            x = MARGIN
        self._idx.append(i)
        self._x.append(x)
        self._w.append(w)
        self._row.append(len(self._row_start) - 1)
        self._cursor_x = x + w + GAP
        self._last_round = rnd
        return x

    def _place_badge(self, first: int, n: int, width: int) -> int:
        """A tree round's discarded cells as one badge on the last; the others lie under it
        with no width (a cell is its slot). Returns the cell after them."""
        cells = self.model.cells
        rnd = cells.round[first]
        last = first
        while last + 1 < n and cells.round[last + 1] == rnd and cells.kind[last + 1] in DISCARDED:
            last += 1
        self.badges[last] = (first, last - first + 1)
        w = min(self._text_width(badge_text(last - first + 1)), width)
        x = self._place(last, w, MARGIN + width)
        for h in range(first, last):  # slots before the badge's (slot = cell), on its row
            for lst, value in ((self._idx, h), (self._x, x), (self._w, 0), (self._row, self._row[-1])):
                lst.insert(len(lst) - 1, value)
        return last + 1

    def _update_scrollbar(self) -> None:
        rows = len(self._row_start)
        total = rows * self.row_height + 2 * MARGIN
        bar = self.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        bar.setRange(0, max(0, total - self.viewport().height()))
        bar.setPageStep(self.viewport().height())
        bar.setSingleStep(self.row_height)
        if self.follow and at_end:
            bar.setValue(bar.maximum())

    def relayout(self) -> None:
        self._reset_layout()
        self._extend_layout()
        self._update_scrollbar()
        self.viewport().update()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._available_width() != self._layout_width:
            self.relayout()
        else:
            self._update_scrollbar()

    def sizeHint(self) -> QSize:
        return QSize(700, 220)

    # ------------------------------------------------------------------ model signals

    def ends(self) -> tuple[int | None, frozenset[int]]:
        """(output position of the run's first end: an EOS or the token completing a stop, or
        None; the output positions completing a stop). Tokens past the end leaked (a bug the
        checker finds: eos, stop-leak); scanned once per round as rounds arrive."""
        rounds = self.model.rounds
        if self._ends_seen > len(rounds) or self._ends_config is not self.model.config:
            self._ends_seen, self._end_out, self._stop_outs = 0, None, set()
            self._ends_config = self.model.config
        eos = self.model.config.eos_ids if self.model.config is not None else frozenset()
        for i in range(self._ends_seen, len(rounds)):
            r = rounds[i]
            stop = getattr(r, "stop", None)
            if stop is not None and r.emitted:
                at = r.emitted_before + min(max(stop.position, 0), len(r.emitted) - 1)
                self._stop_outs.add(at)
                self._end_out = at if self._end_out is None else min(self._end_out, at)
            if self._end_out is None and eos:
                hit = next((j for j, e in enumerate(r.emitted) if e.token in eos), None)
                if hit is not None:
                    self._end_out = r.emitted_before + hit
        self._ends_seen = len(rounds)
        return self._end_out, frozenset(self._stop_outs)

    def _on_reset(self) -> None:
        self._hover = -1
        self.marker_pos = None
        self.relayout()
        self.verticalScrollBar().setValue(0)

    def _on_appended(self, first: int, count: int) -> None:
        if not self._tree_run and is_tree_run(self.model):
            self._reset_layout()  # a run found to be a tree only now: lay it out again
        self._extend_layout()
        self._update_scrollbar()
        self.viewport().update()

    def _on_selection(self, rnd: int, pos: int) -> None:
        self.ensure_round_visible(rnd)
        self.viewport().update()

    def set_marker(self, out_pos: int | None) -> None:
        self.marker_pos = out_pos
        if out_pos is not None and 0 <= out_pos < len(self.model.cells.out_cell):
            self.ensure_cell_visible(self.model.cells.out_cell[out_pos])
        self.viewport().update()

    # ------------------------------------------------------------------ lookup

    def slot_of_cell(self, cell: int) -> int | None:
        if self.aligned:
            return self._slot_of.get(cell)
        return cell if cell < len(self._idx) else None

    def cell_rect(self, cell: int) -> QRect | None:
        """Rectangle of a cell in viewport coordinates (None when not laid out)."""
        slot = self.slot_of_cell(cell)
        if slot is None:
            return None
        rh = self.row_height
        y = MARGIN + self._row[slot] * rh - self.verticalScrollBar().value()
        return QRect(self._x[slot], y, self._w[slot], rh - 6)

    def ensure_cell_visible(self, cell: int) -> None:
        slot = self.slot_of_cell(cell)
        if slot is None:
            return
        rh = self.row_height
        top = MARGIN + self._row[slot] * rh
        bar = self.verticalScrollBar()
        if top < bar.value() or top + rh > bar.value() + self.viewport().height():
            bar.setValue(max(0, top - self.viewport().height() // 3))

    def ensure_round_visible(self, rnd: int) -> None:
        firsts = self.model.cells.round_first
        if 0 <= rnd < len(firsts):
            self.ensure_cell_visible(firsts[rnd])

    def cell_at(self, point: QPoint) -> int:
        """Cell index under a viewport point, or -1."""
        rh = self.row_height
        y = point.y() + self.verticalScrollBar().value() - MARGIN
        if y < 0:
            return -1
        row = y // rh
        if row >= len(self._row_start) or y - row * rh > rh - 6:
            return -1
        lo = self._row_start[row]
        hi = self._row_start[row + 1] if row + 1 < len(self._row_start) else len(self._idx)
        xs = self._x[lo:hi]
        j = bisect.bisect_right(xs, point.x()) - 1
        if j < 0:
            return -1
        slot = lo + j
        if point.x() > self._x[slot] + self._w[slot]:
            return -1
        return self._idx[slot]

    # ------------------------------------------------------------------ painting

    def paintEvent(self, event) -> None:  # long: one paint pass over the visible tokens, their marks and the stop bars
        painter = QPainter(self.viewport())
        painter.fillRect(self.viewport().rect(), QColor("#ffffff"))
        if not self._row_start:
            painter.setPen(QColor("#888888"))
            # wrapped: a compare lane's half width cut the lines at both ends
            painter.drawText(
                self.viewport().rect().adjusted(6, 4, -6, -4),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                self.empty_text,
            )
            painter.end()
            return
        cells = self.model.cells
        rh = self.row_height
        scroll = self.verticalScrollBar().value()
        first_row = max(0, (scroll - MARGIN) // rh)
        last_row = min(len(self._row_start) - 1, (scroll + self.viewport().height()) // rh + 1)
        lo = self._row_start[first_row]
        hi = self._row_start[last_row + 1] if last_row + 1 < len(self._row_start) else len(self._idx)
        fm = QFontMetrics(self.font())
        ascent = fm.ascent()
        sel_round, sel_pos = self.model.selected
        text_h = rh - 6
        strike_pen = QPen(theme.KIND_EDGE[theme.REJECTED], 1.4)
        round_pen = QPen(theme.ROUND_LINE, 1.5)
        prev_round = cells.round[self._idx[lo - 1]] if lo > 0 else None
        painter.setFont(self.font())
        end_out, stop_outs = self.ends()
        leak_brush = QBrush(theme.EOS_COLOR, Qt.BrushStyle.BDiagPattern)
        for slot in range(lo, hi):
            i = self._idx[slot]
            kind = cells.kind[i]
            rnd = cells.round[i]
            x = self._x[slot]
            y = MARGIN + self._row[slot] * rh - scroll
            w = self._w[slot]
            rect = QRect(x, y, w, text_h)
            # Round boundary: a vertical tick before the first cell of each round.
            starts_round = rnd >= 0 and rnd != prev_round
            if starts_round and (self.aligned or prev_round is not None):
                painter.setPen(round_pen)
                bx = x - (ROUND_GAP // 2 + 1 if not self.aligned else 1)
                painter.drawLine(bx, y - 2, bx, y + text_h + 2)
            prev_round = rnd
            if not w or i in self.badges:  # a tree round's discarded nodes: one badge
                if w:
                    self._paint_badge(painter, i, rect, ascent, sel_round, sel_pos)
                continue
            painter.fillRect(rect, theme.KIND_FILL[kind])
            if rnd == sel_round and rnd >= 0:
                painter.fillRect(QRect(x, y + text_h + 1, w, 3), theme.SELECT_COLOR)
            edge = theme.KIND_EDGE[kind]
            painter.setPen(QPen(edge, 1))
            painter.drawRect(rect.adjusted(0, 0, -1, -1))
            text, font = self.cell_text(cells.text[i], w - 2 * PAD_X)
            painter.setPen(theme.KIND_TEXT[kind])
            if font is not None:
                painter.setFont(font)
            painter.drawText(x + PAD_X, y + PAD_Y + ascent, text)
            if font is not None:
                painter.setFont(self.font())
            if kind in (theme.REJECTED, theme.UNVISITED):
                painter.setPen(strike_pen if kind == theme.REJECTED else QPen(theme.KIND_EDGE[kind], 1.2))
                my = y + text_h // 2
                painter.drawLine(x + 2, my, x + w - 3, my)
            if self.aligned and kind == theme.REPAIRED:
                painter.setBrush(theme.KIND_EDGE[theme.REJECTED])
                painter.setPen(Qt.PenStyle.NoPen)
                painter.drawPolygon(QPolygon([QPoint(x + w - 7, y), QPoint(x + w, y), QPoint(x + w, y + 7)]))
                painter.setBrush(Qt.BrushStyle.NoBrush)
            out_pos = cells.out_pos[i]
            if end_out is not None and out_pos > end_out:  # leaked: emitted after the run's end
                painter.fillRect(rect.adjusted(1, 1, -1, -1), leak_brush)
                painter.setPen(QPen(theme.EOS_COLOR, 1.5, Qt.PenStyle.DashLine))
                painter.drawRect(rect.adjusted(0, 0, -1, -1))
            if cells.eos[i] or (out_pos >= 0 and out_pos in stop_outs):
                painter.setPen(QPen(theme.EOS_COLOR, 2.5))
                painter.drawRect(rect.adjusted(1, 1, -2, -2))
                painter.fillRect(QRect(x + w - 5, y + text_h - 5, 5, 5), theme.EOS_COLOR)
            if out_pos >= 0 and out_pos in stop_outs:  # a stop marker: a bar after the completing token
                painter.fillRect(QRect(x + w + 1, y - 2, 3, text_h + 4), theme.EOS_COLOR)
            if rnd == sel_round and cells.pos[i] == sel_pos and rnd >= 0 and kind != theme.UNVISITED:
                painter.setPen(QPen(theme.SELECT_COLOR, 2))
                painter.drawRect(rect.adjusted(-1, -1, 0, 0))
            if self.marker_pos is not None and cells.out_pos[i] == self.marker_pos:
                painter.setPen(QPen(theme.DIVERGENCE_COLOR, 3))
                painter.drawRect(rect.adjusted(-2, -2, 1, 1))
            if i == self._hover:
                painter.setPen(QPen(QColor("#000000"), 1, Qt.PenStyle.DotLine))
                painter.drawRect(rect.adjusted(-1, -1, 0, 0))
        painter.end()

    def _paint_badge(self, painter: QPainter, i: int, rect: QRect, ascent: int, sel_round: int, sel_pos: int) -> None:
        """A tree round's discarded nodes: grey, dashed, their count; outlined when one is selected."""
        cells = self.model.cells
        first, count = self.badges[i]
        painter.fillRect(rect, theme.KIND_FILL[theme.UNVISITED])
        painter.setPen(QPen(theme.KIND_EDGE[theme.REJECTED], 1, Qt.PenStyle.DashLine))
        painter.drawRect(rect.adjusted(0, 0, -1, -1))
        painter.setPen(theme.KIND_TEXT[theme.REJECTED])
        painter.drawText(rect.x() + PAD_X, rect.y() + PAD_Y + ascent, badge_text(count))
        if cells.round[i] == sel_round and any(cells.pos[h] == sel_pos for h in range(first, first + count)):
            painter.setPen(QPen(theme.SELECT_COLOR, 2))
            painter.drawRect(rect.adjusted(-1, -1, 0, 0))

    # ------------------------------------------------------------------ mouse

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        i = self.cell_at(event.position().toPoint())
        if i != self._hover:
            self._hover = i
            self.viewport().update()
            if i >= 0:
                QToolTip.showText(event.globalPosition().toPoint(), self.tooltip_for(i), self.viewport())
            else:
                QToolTip.hideText()
        super().mouseMoveEvent(event)

    def leaveEvent(self, event) -> None:
        self._hover = -1
        self.viewport().update()
        super().leaveEvent(event)

    def tooltip_for(self, cell: int) -> str:
        c = self.model.cells.cell(cell)
        r = self.model.rounds[c.round] if 0 <= c.round < len(self.model.rounds) else None
        if cell in self.badges and r is not None:
            return describe_tree_round(r, self.model.token_text)
        words = describe_cell(r, c, self.model.token_text, is_coupled(self.model.config))
        end_out, stop_outs = self.ends()
        if c.out_pos >= 0 and c.out_pos in stop_outs:
            words += "<br><b>stop</b>: this token completes a stop; the output ends here"
        elif end_out is not None and c.out_pos > end_out:
            words += (
                f"<br><b>leaked</b>: emitted after the output ended at output token {end_out} "
                "(EOS or a stop): nothing should follow it"
            )
        return words

    def mousePressEvent(self, event: QMouseEvent) -> None:
        i = self.cell_at(event.position().toPoint())
        if i >= 0 and event.button() == Qt.MouseButton.LeftButton:
            self.click_cell(i)
        super().mousePressEvent(event)

    def click_cell(self, cell: int) -> None:
        c = self.model.cells.cell(cell)
        if c.round < 0:
            return
        if cell in self.badges:  # the badge selects the round's first rejected node
            first, count = self.badges[cell]
            kinds = self.model.cells.kind
            cell = next((h for h in range(first, first + count) if kinds[h] == theme.REJECTED), first)
            c = self.model.cells.cell(cell)
        self.follow = False
        self.model.select(c.round, c.pos)
        self.cellClicked.emit(c.round, c.pos)

    def wheelEvent(self, event) -> None:
        super().wheelEvent(event)
        bar = self.verticalScrollBar()
        self.follow = bar.value() >= bar.maximum() - 2
