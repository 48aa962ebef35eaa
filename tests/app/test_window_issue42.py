"""Issue 42 (the window with a real model): a failed start keeps the run on screen, the wheel
never turns a field of a scrolling panel, the words say what is loaded and what a round did."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import configure, wait_idle


def test_a_failed_start_keeps_the_previous_run_and_its_title(qtbot, make_window, tmp_path):
    """Item 8: a start that fails (a checkpoint folder whose weights are corrupt) wiped the
    timeline, tree and inspector to "No rounds yet", and the title named the run that never
    started."""
    w = make_window(record=False)
    configure(w, max_new_tokens="8")
    assert w.start_run()
    wait_idle(qtbot, w)
    rounds, title = len(w.model.rounds), w.windowTitle()
    assert rounds and "live:" in title
    w.model.select(1)
    bad = tmp_path / "bad-checkpoint"
    bad.mkdir()
    (bad / "config.json").write_text("{ this is not json")
    w.run_panel.set_texts({"proposer": f"draft:{bad}"})
    assert w.start_run()
    qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible(), timeout=20000)
    qtbot.wait(100)
    assert len(w.model.rounds) == rounds and w.model.stop_reason is not None
    assert w.timeline.model is w.model and w.timeline.model.rounds
    assert w.windowTitle() == title
    assert str(bad) not in w.windowTitle()


def _wheel(widget, steps=-1):
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_scrolling_the_run_panel_turns_no_field_it_passes_over_even_one_clicked_before(qtbot, make_window):
    """Item 9: scrolling the run panel at 1024x700 turned Children from topk to distinct: a box
    clicked earlier keeps the focus, and a focused box took the wheel as the panel scrolled
    past it. Every menu and number box of the run panel and the compare lanes, each enabled
    and each focused in turn, is scrolled over in the middle of a scroll."""
    from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QScrollArea

    w = make_window()
    w.resize(1024, 700)
    w.run_panel.set_texts({"tree": "3,2,1"})  # the Children menu is enabled for a tree
    qtbot.wait(200)
    area = next(a for a in w.findChildren(QScrollArea) if a.widget() is w.run_panel)
    boxes = w.run_panel.findChildren(QComboBox) + w.run_panel.findChildren(QAbstractSpinBox) + \
        w.compare.findChildren(QComboBox) + w.compare.findChildren(QAbstractSpinBox)
    assert w.run_panel.children_mode in boxes and len(boxes) >= 8
    for box in boxes:
        box.setEnabled(True)
        box.setFocus()  # clicked a while ago
        before = box.currentIndex() if isinstance(box, QComboBox) else box.text()
        _wheel(area.viewport(), -1)  # the panel scrolls...
        _wheel(box, -1)  # ...and the pointer passes over the box
        _wheel(box, -1)
        after = box.currentIndex() if isinstance(box, QComboBox) else box.text()
        assert after == before, (box.objectName() or type(box).__name__, box.toolTip()[:40])
    assert area.verticalScrollBar().value() > 0  # the panel scrolled instead
