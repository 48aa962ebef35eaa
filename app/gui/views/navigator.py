"""Round navigation: first / previous / slider / next / last, and play: the rounds shown, played
back one by one (a replay, or a finished live run). Play is enabled only when there are rounds
and the window's `can_play` allows it (not while a live run owns them)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QStyle, QToolButton, QWidget

from specscope.app.gui.model.runmodel import RunModel


class RoundNavigatorWidget(QWidget):
    playToggled = Signal()

    def __init__(self, model: RunModel, parent=None):
        super().__init__(parent)
        self.model = model
        self.can_play: Callable[[], bool] = lambda: True  # the window's: whether its session may play now
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        style = self.style()

        def button(icon, tip, slot):
            b = QToolButton()
            b.setIcon(style.standardIcon(icon))
            b.setToolTip(tip)
            b.setAutoRaise(True)
            b.clicked.connect(slot)
            layout.addWidget(b)
            return b

        self.first_button = button(QStyle.StandardPixmap.SP_MediaSkipBackward, "First round (Home)", self.first)
        self.prev_button = button(QStyle.StandardPixmap.SP_MediaSeekBackward, "Previous round (Left)", self.prev)
        self.play_button = button(QStyle.StandardPixmap.SP_MediaPlay, "Play the rounds back (P)", self.playToggled.emit)
        self.next_button = button(QStyle.StandardPixmap.SP_MediaSeekForward, "Next round (Right)", self.next)
        self.last_button = button(QStyle.StandardPixmap.SP_MediaSkipForward, "Last round (End)", self.last)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.setToolTip("Round")
        self.slider.valueChanged.connect(self._slid)
        layout.addWidget(self.slider, 1)
        self.label = QLabel("no rounds")
        self.label.setMinimumWidth(150)
        layout.addWidget(self.label)
        self._updating = False
        model.reset.connect(self._sync)
        model.appended.connect(self._sync)
        model.selectionChanged.connect(self._sync)
        self._sync()

    def set_playing(self, playing: bool) -> None:
        icon = QStyle.StandardPixmap.SP_MediaPause if playing else QStyle.StandardPixmap.SP_MediaPlay
        self.play_button.setIcon(self.style().standardIcon(icon))

    def _sync(self, *args) -> None:
        n = len(self.model.rounds)
        self._updating = True
        self.slider.setRange(0, max(0, n - 1))
        cur = self.model.selected[0]
        if cur >= 0:
            self.slider.setValue(cur)
        self._updating = False
        enabled = n > 0
        for w in (self.first_button, self.prev_button, self.next_button, self.last_button, self.slider):
            w.setEnabled(enabled)
        self.refresh_play()
        if not n:
            self.label.setText("no rounds")
        else:
            pos = self.model.selected[1]
            place = place_words(self.model.rounds[cur], pos) if 0 <= cur < n else ""
            self.label.setText(f"round {max(cur, 0)} / {n - 1}" + (f" · {place}" if place else ""))

    def refresh_play(self) -> None:
        """Play only with rounds to play and while the session allows it."""
        self.play_button.setEnabled(bool(self.model.rounds) and self.can_play())

    def _slid(self, value: int) -> None:
        if not self._updating:
            self.model.select(value)

    def first(self) -> None:
        self.model.select(0)

    def last(self) -> None:
        self.model.select(len(self.model.rounds) - 1)

    def prev(self) -> None:
        cur = self.model.selected[0]
        self.model.select(max(0, cur - 1) if cur >= 0 else 0)

    def next(self) -> None:
        cur = self.model.selected[0]
        self.model.select(cur + 1 if cur >= 0 else 0)


def output_token(r, pos: int) -> int | None:
    """The output position (index among the run's new tokens, as the findings and `specscope
    check` number them) of the token emitted at draft node `pos` (accepted or repaired there)
    or at the bonus position (`pos` = the number of nodes); None when nothing was emitted there."""
    bonus = pos == len(r.nodes)
    for j, e in enumerate(r.emitted):
        if (bonus and e.kind == "bonus") or (not bonus and e.kind != "bonus" and e.node == pos):
            return r.emitted_before + j
    return None


def place_words(r, pos: int) -> str:
    """One numbering of a place, shown everywhere (navigator, inspector, findings): the draft
    node as recorded (0-based, the findings' "node") and the output token it became (0-based,
    the findings' "output token"); it was "position 14" here, "position 3 of 4 drafted" in the
    inspector and "position 14" in the findings, three numberings of one place."""
    if pos < 0:
        return ""
    out = output_token(r, pos)
    where = "bonus" if pos == len(r.nodes) else f"node {pos} (of {len(r.nodes)} drafted)"
    return where + (f" · output token {out}" if out is not None else " · not emitted")
