"""The window's status bar: a transient message on the left, the run's state on the right.

QStatusBar draws a long message up to the permanent widget and cuts it there, mid-word and
touching the state text ("…length 2.5idle"). This one elides the message with "…" to leave a
gap, keeps the whole text as its tooltip, and elides again when the window is resized. The
state text is elided to the bar's width too (whole in its tooltip): a label's text is its
minimum width, and a long one (three compare lanes' proposers) widened the window past 1024 px.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStatusBar

GAP_PX = 24  # between the message's end and the state text


class ElidingStatusBar(QStatusBar):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.full_message = ""
        self.full_state = ""
        self._deadline: float | None = None  # monotonic time the message expires; None: until replaced
        self.state_label = QLabel("")
        self.state_label.setTextInteractionFlags(Qt.TextInteractionFlag.NoTextInteraction)
        self.addPermanentWidget(self.state_label)
        self.messageChanged.connect(self._on_message_changed)

    def showMessage(self, text: str, timeout: int = 0) -> None:
        self.full_message = text
        self._deadline = time.monotonic() + timeout / 1000 if timeout > 0 else None
        super().showMessage(self._elided(text), timeout)
        self.setToolTip(text)

    def currentMessage(self) -> str:
        """The whole message shown (Qt's own holds the elided text drawn)."""
        return self.full_message if super().currentMessage() else ""

    def _on_message_changed(self, text: str) -> None:
        if not text:  # timed out or cleared
            self.full_message = ""
            self.setToolTip("")

    def room(self) -> int:
        """Pixels the message may use: the bar less the state text and the gap."""
        state = self.state_label.sizeHint().width() if self.state_label.text() else 0
        return max(40, self.width() - state - GAP_PX - 16)

    def _elided(self, text: str) -> str:
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.room())

    def set_state(self, text: str) -> None:
        """The state text on the right (the message is elided again to leave it room)."""
        if text != self.full_state:
            self.full_state = text
            self._fit_state()
            self.refit()

    def _fit_state(self) -> None:
        room = max(80, self.width() - 2 * GAP_PX)
        shown = self.fontMetrics().elidedText(self.full_state, Qt.TextElideMode.ElideRight, room)
        self.state_label.setText(shown)
        self.state_label.setToolTip(self.full_state if shown != self.full_state else "")

    def refit(self) -> None:
        """Elide the message shown again (after a resize or a new state text), keeping its expiry."""
        if not (self.full_message and QStatusBar.currentMessage(self)):
            return
        left_ms = 0
        if self._deadline is not None:
            left_ms = int((self._deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return  # about to expire: Qt's own timer clears it
        QStatusBar.showMessage(self, self._elided(self.full_message), left_ms)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.full_state:
            self._fit_state()
        self.refit()
