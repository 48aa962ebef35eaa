"""Colours, fonts and labels shared by every view, so a kind looks the same everywhere."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QFontDatabase

from specscope.core.records import NODE_STATUSES, TOKEN_KINDS

# Cell kinds of the token timeline. Emitted kinds first, then discarded draft tokens.
PROMPT, ACCEPTED, REPAIRED, BONUS, REJECTED, UNVISITED = range(6)
KIND_NAMES = {
    PROMPT: "prompt",
    ACCEPTED: "accepted",
    REPAIRED: "repaired",
    BONUS: "bonus",
    REJECTED: "rejected",
    UNVISITED: "discarded",
}
KIND_OF_EMITTED = dict(zip(TOKEN_KINDS, (ACCEPTED, REPAIRED, BONUS)))  # emitted token kind -> cell kind
KIND_OF_STATUS = dict(zip(NODE_STATUSES, (ACCEPTED, REJECTED, UNVISITED)))  # draft node status -> cell kind

# A colour-blind-friendly palette (Okabe-Ito based), light backgrounds with dark text.
KIND_FILL = {
    PROMPT: QColor("#e6e6e6"),
    ACCEPTED: QColor("#bfe6c8"),
    REPAIRED: QColor("#ffd19a"),
    BONUS: QColor("#b9d7f5"),
    REJECTED: QColor("#f7c6c6"),
    UNVISITED: QColor("#f2f2f2"),
}
KIND_EDGE = {
    PROMPT: QColor("#b0b0b0"),
    ACCEPTED: QColor("#009e73"),
    REPAIRED: QColor("#e69f00"),
    BONUS: QColor("#0072b2"),
    REJECTED: QColor("#d55e00"),
    UNVISITED: QColor("#b8b8b8"),
}
KIND_TEXT = {
    PROMPT: QColor("#555555"),
    ACCEPTED: QColor("#10301f"),
    REPAIRED: QColor("#4a2c00"),
    BONUS: QColor("#0b2a4a"),
    REJECTED: QColor("#9a2b00"),
    UNVISITED: QColor("#9a9a9a"),
}
EOS_COLOR = QColor("#cc0066")
SELECT_COLOR = QColor("#2b2bd6")
ROUND_LINE = QColor("#7a7a7a")
DIVERGENCE_COLOR = QColor("#e0006a")

# Plot pens/brushes (hex strings, as pyqtgraph takes them).
P_COLOR = "#0072b2"  # target p
Q_COLOR = "#e69f00"  # draft q
MIN_COLOR = "#009e73"  # min(p, q)
RESIDUAL_COLOR = "#cc79a7"  # max(p - q, 0)
DRAFT_TIME = "#e69f00"
VERIFY_TIME = "#0072b2"
BOOK_TIME = "#999999"
MEASURED = "#222222"
PREDICTED = "#d55e00"
PREDICTED_2 = "#cc79a7"
ACCEPT_RATE = "#009e73"
CACHE_KEPT = "#0072b2"
CACHE_NEW = "#56b4e9"
CACHE_CROPPED = "#d55e00"
CACHE_PENDING = "#f0e442"
SIDE_COLORS = ("#0072b2", "#d55e00", "#cc79a7")  # compare mode: A, B, C (Okabe-Ito blue, vermillion, purple)


def mono_font(point_size: int = 10) -> QFont:
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setPointSize(point_size)
    return font


def kind_legend_html() -> str:
    """A one-line HTML legend of the timeline's cell kinds."""
    parts = []
    for kind in (PROMPT, ACCEPTED, REPAIRED, BONUS, REJECTED, UNVISITED):
        fill, edge, text = KIND_FILL[kind].name(), KIND_EDGE[kind].name(), KIND_TEXT[kind].name()
        label = KIND_NAMES[kind]
        style = f"background:{fill}; color:{text}; border:1px solid {edge}; padding:0 4px;"
        if kind in (REJECTED, UNVISITED):
            label = f"<s>{label}</s>"
        parts.append(f"<span style='{style}'>&nbsp;{label}&nbsp;</span>")
    parts.append(f"<span style='color:{EOS_COLOR.name()}; font-weight:bold'>&nbsp;&#9632; EOS</span>")
    parts.append(f"<span style='color:{ROUND_LINE.name()}'>&nbsp;&#9474; round boundary</span>")
    return "&nbsp;".join(parts)
