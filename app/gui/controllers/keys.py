"""The stepping keys. Space runs or pauses wherever the focus is in the window: a field would
otherwise take it (it claims keys through a ShortcutOverride event), so an application event
filter withholds Space from every field but the free-text ones (the prompt, the checkpoint
path, the chat's system text, the stop strings and ids), where it still types. Right, Left, Home and End step only
where they edit nothing: in a text field they
move its cursor (a number field once lost End and Left to the rounds, and the next digit
landed somewhere else). The letter shortcut P (play the rounds back) yields to a focused menu
box or list, whose keyboard search it would otherwise steal (text fields type it already)."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractScrollArea,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

STEP_KEYS = (Qt.Key.Key_Space, Qt.Key.Key_Right, Qt.Key.Key_Left, Qt.Key.Key_Home, Qt.Key.Key_End)
CURSOR_KEYS = (Qt.Key.Key_Right, Qt.Key.Key_Left, Qt.Key.Key_Home, Qt.Key.Key_End)
TEXT_FIELDS = (QLineEdit, QAbstractSpinBox, QPlainTextEdit, QTextEdit)  # an editable combo box's is a QLineEdit
LETTER_KEYS = (Qt.Key.Key_P,)  # the window's plain-letter shortcuts
SEARCHING_FIELDS = (QComboBox, QAbstractItemView)  # a typed letter picks their entry starting with it


class StepKeys(QObject):
    """Withholds the stepping keys from the window's fields (but `typing_fields`, and the
    cursor keys from any text field), so the window's shortcuts get them."""

    def __init__(self, window, typing_fields, parent=None):
        super().__init__(parent)
        self.window = window
        self.typing_fields = tuple(typing_fields)

    def eventFilter(self, obj, event) -> bool:
        if event.type() != QEvent.Type.ShortcutOverride or event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            return False
        if event.key() in LETTER_KEYS:
            if isinstance(obj, SEARCHING_FIELDS) and obj.window() is self.window:
                event.accept()  # overridden: the box gets the key press, not the shortcut
                return True
            return False
        if event.key() not in STEP_KEYS:
            return False
        if not isinstance(obj, QWidget) or obj.window() is not self.window or obj in self.typing_fields:
            return False  # dialogs, and the prompt, keep their keys
        if event.key() in CURSOR_KEYS and isinstance(obj, TEXT_FIELDS):
            return False  # they move the field's cursor
        event.ignore()  # not overridden: the shortcut fires
        return True


class WheelGuard(QObject):
    """The mouse wheel scrolls the panel under it, never the value of a menu or number box it
    passes over: scrolling the run panel at 1024x700 switched the Proposer menu to the next
    entry (a new user's settings changed without a click). A box with the focus (clicked or
    tabbed into) still takes the wheel, but not while the panel is being scrolled: a wheel
    that scrolled the panel less than SCROLLING_S before passes over a focused box too (a
    Children menu picked a minute before turned from topk to distinct as the panel scrolled
    past it)."""

    SCROLLING_S = 0.8

    def __init__(self, window, parent=None):
        super().__init__(parent)
        self.window = window
        self.scrolled_at = float("-inf")  # monotonic time a wheel last scrolled something in the window
        for box in window.findChildren(QComboBox) + window.findChildren(QAbstractSpinBox):
            self._no_wheel_focus(box)

    @staticmethod
    def _no_wheel_focus(box) -> None:
        if box.focusPolicy() == Qt.FocusPolicy.WheelFocus:  # the wheel would focus it, then turn it
            box.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def eventFilter(self, obj, event) -> bool:
        kind = event.type()
        if kind not in (QEvent.Type.Wheel, QEvent.Type.Polish):
            return False
        if not isinstance(obj, (QComboBox, QAbstractSpinBox)):
            if kind == QEvent.Type.Wheel and isinstance(obj, QWidget) and obj.window() is self.window:
                self.scrolled_at = time.monotonic()  # the wheel scrolls a panel, a list or a plot
            return False
        if obj.window() is not self.window:
            return False
        if kind == QEvent.Type.Polish:
            self._no_wheel_focus(obj)
            return False
        if isinstance(obj, QComboBox) and obj.view().isVisible():
            return False
        if obj.hasFocus() and time.monotonic() - self.scrolled_at > self.SCROLLING_S:
            return False  # a box clicked or tabbed into, the panel not being scrolled: it takes the wheel
        area = obj.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is not None:
            QApplication.sendEvent(area.verticalScrollBar(), event)
        self.scrolled_at = time.monotonic()
        return True
