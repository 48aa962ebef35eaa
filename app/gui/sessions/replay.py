"""The replay session: one stored run of a trace store, read in batches into the window's
RunModel and played back round by round. No widgets: the window shows it and asks the
questions (which run, stop the live run?)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.traces import TraceLibrary, describe_run, replay_tokenizer

from .hub import ModelHub

log = logging.getLogger(__name__)

REPLAY_MS = 180
REPLAY_BATCH = 256


def run_tokenizer(hub: ModelHub, info: Any) -> tuple[Any | None, str | None]:
    """(the tokenizer a stored run recorded, or None; why not) through the hub's caches
    (traces.replay_tokenizer): the window's views, the run picker and the run panel decode a
    run's ids with it, never with another model's."""
    from specscope.core.loading.models import bundled_path

    def load(folder: str) -> Any:
        return hub.cached(("tokenizer", str(folder)), lambda: hub.load_tokenizer(folder))

    try:
        return replay_tokenizer(info, hub.tokenizer, bundled_path("target"), load)
    except Exception as exc:  # noqa: BLE001 - fall back to ids, and say so
        return None, f"cannot load this run's tokenizer ({exc}): showing token ids"


def run_token_text(hub: ModelHub, info: Any, say: Callable[[str], None] | None = None) -> Any:
    """Token text for a stored run, decoded with the tokenizer the run recorded
    (traces.replay_tokenizer); where it is not here, the ids, and `say` is told why."""
    tok, why = run_tokenizer(hub, info)
    if why and say is not None:
        say(why)
    return hub.token_text(tok)


class ReplaySession(QObject):
    """Open a run of a trace store, load its rounds without blocking, play them."""

    loaded = Signal()  # every round is in the model
    progress = Signal(int)  # rounds loaded so far
    failed = Signal(str)
    playingChanged = Signal(bool)

    def __init__(self, model: RunModel, token_text_for: Callable[[Any], Any], parent=None):
        super().__init__(parent)
        self.model = model
        self.token_text_for = token_text_for  # RunInfo -> token_text (the window's tokenizer choice)
        self.library: TraceLibrary | None = None
        self.trace_path: str | None = None
        self.run_id: str | None = None
        self.info: Any = None
        self.active = False
        self.loaded_all = False
        self._batches = None
        self.timer = QTimer(self)
        self.timer.setInterval(REPLAY_MS)
        self.timer.timeout.connect(self._tick)

    # ------------------------------------------------------------------ opening

    def open(self, library: TraceLibrary, path: str, info: Any) -> None:
        """Replay `info`'s run of `library` (which the session now owns)."""
        self.close()
        self.library = library
        self.trace_path = path
        self.run_id = info.run_id
        self.info = info
        self.active = True
        self.loaded_all = False
        self.model.begin(info.config, self.token_text_for(info), source=path, label=describe_run(info))
        self.model.loader = library.loader(info.run_id)
        self._batches = library.batches(info.run_id, REPLAY_BATCH)
        QTimer.singleShot(0, self._load_next)

    def close(self) -> None:
        self.stop_playing()
        self._batches = None
        if self.library is not None:
            self.library.close()
            self.library = None
        self.active = False

    def _load_next(self) -> None:
        if self._batches is None:
            return
        try:
            batch = next(self._batches, None)
        except Exception as exc:  # noqa: BLE001
            self._batches = None
            self.loaded_all = True
            self.failed.emit(f"Reading the trace failed: {exc}")
            return
        if batch is None:
            self._done()
            return
        self.model.extend(batch)
        if self.model.selected[0] < 0 and self.model.rounds:
            self.model.select(0)
        self.progress.emit(len(self.model.rounds))
        QTimer.singleShot(0, self._load_next)

    def _done(self) -> None:
        self._batches = None
        self.loaded_all = True
        info = self.library.run(self.run_id) if self.library else None
        self.info = info or self.info
        self.model.finish(info.stop_reason or info.status if info else "replay", info.wall_s if info else None)
        if self.model.rounds and self.model.selected[0] < 0:
            self.model.select(0)
        self.loaded.emit()

    # ------------------------------------------------------------------ playing

    @property
    def playing(self) -> bool:
        return self.timer.isActive()

    def toggle_play(self) -> None:
        if not self.model.rounds:
            return
        if self.timer.isActive():
            self.stop_playing()
            return
        if self.model.selected[0] >= len(self.model.rounds) - 1:
            self.model.select(0)
        self.timer.start()
        self.playingChanged.emit(True)

    def stop_playing(self) -> None:
        if self.timer.isActive():
            self.timer.stop()
            self.playingChanged.emit(False)

    def _tick(self) -> None:
        cur = self.model.selected[0]
        if cur >= len(self.model.rounds) - 1:
            self.stop_playing()
            return
        self.model.select(cur + 1)

    # ------------------------------------------------------------------ the window's keys
    #
    # As LiveSession's: Run, Space and Step start a new live run from the run panel; Right,
    # P and the play button browse the stored rounds.

    shows_run_state = False  # the run panel keeps its settings, not a run state

    def run_key(self, start: Callable[[bool], Any]) -> None:
        start(True)

    def step_key(self, start: Callable[[bool], Any]) -> None:
        start(False)

    def space_key(self, start: Callable[[bool], Any]) -> None:
        start(True)  # Space runs, as everywhere: the replay plays with P or the play button

    def browses(self) -> bool:
        return True

    def can_play(self) -> bool:
        return True

    # ------------------------------------------------------------------ the stored run

    def rounds_for_checking(self) -> Any:
        if self.library is not None and self.run_id:
            # streamed: the checker and the recompute hold a few rounds, never the whole run
            return self.library.store.iter_rounds(self.run_id, full=True)
        return list(self.model.rounds)

    def store_and_run(self) -> tuple[Any, str] | None:
        if self.library is not None and self.run_id:
            return self.library.store, self.run_id
        return None

    def status_words(self) -> str:
        return f"replay {os.path.basename(self.trace_path)}" if self.trace_path else "replay"
