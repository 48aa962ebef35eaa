"""The stepping keys (Space, Right, Left, Home, End) step wherever the focus is in the window:
a text field would otherwise take them (it claims them through a ShortcutOverride event), so
an application event filter withholds them from every field but the prompt (and the
checkpoint path), where they still type."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QWidget

STEP_KEYS = (Qt.Key.Key_Space, Qt.Key.Key_Right, Qt.Key.Key_Left, Qt.Key.Key_Home, Qt.Key.Key_End)


class StepKeys(QObject):
    """Withholds the stepping keys from the window's fields (but `typing_fields`), so the
    window's shortcuts get them."""

    def __init__(self, window, typing_fields, parent=None):
        super().__init__(parent)
        self.window = window
        self.typing_fields = tuple(typing_fields)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt API)
        if event.type() != QEvent.Type.ShortcutOverride or event.key() not in STEP_KEYS:
            return False
        if event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            return False
        if not isinstance(obj, QWidget) or obj.window() is not self.window or obj in self.typing_fields:
            return False  # dialogs, and the prompt, keep their keys
        event.ignore()  # not overridden: the shortcut fires
        return True
