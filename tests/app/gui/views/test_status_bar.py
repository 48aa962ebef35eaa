"""The status bar's message never runs into the run's state text (issue 32: "…length 2.5idle")."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QMainWindow

from specscope.app.gui.views.status_bar import GAP_PX, ElidingStatusBar

LONG = "Run finished (budget): 160 tokens in 64 rounds, mean accepted length 2.50 tokens a round"
STATE = "idle · recording to traces.sqlite · 64 rounds · 160 tokens · acceptance 0.38 · 1 torch thread"


def _window(qtbot, width: int):
    window = QMainWindow()
    bar = ElidingStatusBar(window)
    window.setStatusBar(bar)
    qtbot.addWidget(window)
    window.resize(width, 300)
    window.show()
    qtbot.waitExposed(window)
    bar.set_state(STATE)
    return window, bar


def _drawn(bar) -> str:
    from PySide6.QtWidgets import QStatusBar

    return QStatusBar.currentMessage(bar)


def test_long_message_is_elided_before_the_state_text(qtbot):
    window, bar = _window(qtbot, 1024)
    bar.showMessage(LONG, 5000)
    drawn = _drawn(bar)
    assert drawn != LONG and drawn.endswith("…")
    width = bar.fontMetrics().horizontalAdvance(drawn)
    assert width + GAP_PX <= bar.state_label.geometry().left()  # a gap, not "2.5idle"
    assert bar.currentMessage() == LONG and bar.toolTip() == LONG  # the whole text stays readable


def test_message_fits_again_when_the_window_widens(qtbot):
    window, bar = _window(qtbot, 1024)
    bar.showMessage(LONG)
    window.resize(2400, 300)
    qtbot.waitUntil(lambda: _drawn(bar) == LONG)


def test_new_state_text_refits_the_message(qtbot):
    window, bar = _window(qtbot, 1400)
    bar.set_state("idle")
    bar.showMessage(LONG)
    assert _drawn(bar) == LONG
    bar.set_state(STATE + " · " + STATE)
    assert _drawn(bar).endswith("…")


def test_expired_message_clears(qtbot):
    window, bar = _window(qtbot, 1024)
    bar.showMessage(LONG, 200)
    qtbot.waitUntil(lambda: bar.currentMessage() == "", timeout=3000)
    assert bar.toolTip() == ""
