"""The Help menu's pages."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from specscope.app.gui import theme
from specscope.app.gui.views.compare import COUPLING_HTML
from specscope.app.gui.views.kvview import HELP_HTML as KV_HELP

LEGEND_AND_KEYS = (
    "<p><b>Timeline</b>: {legend}</p>"
    "<p><b>Keys</b>: Space run/pause (also from a replay: a new run; it types in the free-text fields: prompt, "
    "checkpoint, system text, stops), "
    "Right step one round (a finished run or a replay: next round), Left previous round, Home/End "
    "first/last round (in a text field these four move its cursor), P play the rounds back (a focused menu box takes "
    "it for its search), "
    "Ctrl+. stop, Ctrl+O open a trace.</p>"
    "<p>Hover a token for p, q, p/q, u and the decision; click it to inspect its round.</p>"
    "<p><b>Threads</b>: torch's CPU threads for decoding (run panel); the status bar shows the value.</p>"
)


def show_legend(parent) -> None:
    QMessageBox.information(parent, "specscope", LEGEND_AND_KEYS.format(legend=theme.kind_legend_html()))


def show_kv_help(parent) -> None:
    QMessageBox.information(parent, "KV caches", KV_HELP)


def show_coupling_help(parent) -> None:
    QMessageBox.information(parent, "Coupled lanes", COUPLING_HTML)
