"""The live session: one run of the decoder, stepped by a worker thread, filling the
window's RunModel, recorded to the trace store. No widgets: the window shows it.

It also says what the worker is doing while the panel would otherwise only say "Paused":
loading the models, then computing round 0, then stepping.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from specscope.app.gui.model.runmodel import RunModel, has_distributions
from specscope.app.gui.model.settings import PanelSettings
from specscope.app.gui.model.traces import RecorderFactory, warm_up_trace_writer

from .hub import ModelHub
from .worker import IDLE, LOADING, PAUSED, RUNNING, RunController

log = logging.getLogger(__name__)

# While running, select the newest round at most 4 times a second: each selection redraws
# the round inspector's plots and the draft tree, and drawing holds the GIL the decoding
# thread needs (scripts/measure_live_overhead.py measures what a live run costs).
FOLLOW_MS = 250

# What the run panel and the status bar say while the worker imports torch and loads the
# run panel's target (the window shows before either: a Run meanwhile queues behind the load).
PRELOADING = "loading models: torch, then the run panel's target…"


def preloading_words(target: str, tiny: bool = False) -> str:
    """What the preload loads, in words: the run panel's target ("" = the bundled one, with
    its default draft); it said "the bundled pair" with Target smollm2."""
    if target:
        return f"loading models: torch, then target {target}…"
    return (
        "loading models: torch, then the tiny random models…"
        if tiny
        else "loading models: torch, then the bundled target and draft-small…"
    )


class LiveSession(QObject):
    """Start, run, step, pause and stop live runs; follow the newest round."""

    finished = Signal(str)  # stop reason
    activity = Signal(str)  # what the worker is doing, in words ("" = nothing special)
    stateChanged = Signal(str)
    failed = Signal(str, str)
    refused = Signal(object)  # {field: message}: the settings cannot run (the worker started nothing)
    _storeWaits = Signal(str)  # the writer's thread: a locked store keeps the run's rounds waiting
    begun = Signal(str)  # the run's description, once the worker has prepared it (its first round is on its way)
    noted = Signal(str)  # a warning about the run's models in words (tokenizers that differ but give the same ids)

    def __init__(self, model: RunModel, hub: ModelHub, store_path: str | None, record: bool = True, parent=None):
        super().__init__(parent)
        self.model = model
        self.hub = hub
        self.record = record
        self.recording = RecorderFactory(store_path)  # called on the worker's thread
        self.recording.on_wait = self._storeWaits.emit  # queued to this (the GUI) thread
        self._storeWaits.connect(self._say)
        self.recorded_path: str | None = None
        self.controller = RunController(hub, self.recording if record else None, self)
        if record:
            warm_up_trace_writer()
        self.active = True  # False while replay or another session owns the model
        self.follow_latest = True
        self._last_followed = -1
        self.settings: PanelSettings | None = None
        self.notes: list[str] = []  # the warnings about this run's models (noted), shown while it is
        self.activity_text = ""
        self.preloading_text = PRELOADING
        w = self.controller.worker
        w.prepared.connect(self._on_prepared)
        w.noted.connect(self._on_noted)
        w.roundReady.connect(self._on_round)
        w.laneFinished.connect(self._on_lane_finished)
        w.failed.connect(self.failed)
        w.refused.connect(lambda errors, _lane: self.refused.emit(errors))
        w.stateChanged.connect(self._on_state)
        w.recorded.connect(self._on_recorded)
        self.follow_timer = QTimer(self)
        self.follow_timer.setInterval(FOLLOW_MS)
        self.follow_timer.timeout.connect(self.follow)
        self.follow_timer.start()

    @property
    def state(self) -> str:
        return self.controller.state

    @property
    def busy(self) -> bool:
        return self.controller.busy

    def _say(self, text: str) -> None:
        self.activity_text = text
        self.activity.emit(text)

    def preloading(self, target: str = "") -> None:
        """The worker is importing torch and loading the run panel's target (no run yet)."""
        if (not self.activity_text or self.activity_text == self.preloading_text) and self.state == IDLE:
            self.preloading_text = preloading_words(target, self.hub.tiny)
            self._say(self.preloading_text)

    def preloaded(self) -> None:
        if self.activity_text == self.preloading_text:
            self._say("")

    # ------------------------------------------------------------------ control

    def start(self, settings: PanelSettings, run: bool = True) -> None:
        self.active = True
        self.settings = settings
        self.recording.prompt_text = settings.prompt
        self.notes = []
        self.follow_latest = True
        self._last_followed = -1
        # the previous run stays on screen until this one is prepared (_on_prepared): a start
        # that fails (a bad checkpoint) once left "No rounds yet" in every view
        self._say(f"loading models ({settings.proposer}, {settings.device})…")
        self.controller.start([settings], run=run)
        if not run:
            self.controller.step()

    def resume(self) -> None:
        self.follow_latest = True
        self.controller.run()

    def step(self) -> None:
        self.follow_latest = True
        if self.state == PAUSED:
            self._say(f"computing round {len(self.model.rounds)}…")
        self.controller.step()

    def pause(self) -> None:
        self.controller.pause()

    def stop(self) -> None:
        self.controller.stop()

    def close(self) -> None:
        self.follow_timer.stop()
        self.controller.close()
        self.recording.close()

    # ------------------------------------------------------------------ the window's keys
    #
    # The window routes Run, Step, Space, Right and the navigator's Play to the active
    # session; `start(run)` starts a new live run from the run panel (the window validates it).

    shows_run_state = True  # the run panel shows this session's state and activity

    @property
    def trace_path(self) -> str | None:
        return self.recorded_path

    def run_key(self, start: Callable[[bool], Any]) -> None:
        if self.state == PAUSED:
            self.resume()
        elif self.state == IDLE:
            start(True)

    def step_key(self, start: Callable[[bool], Any]) -> None:
        if self.state == PAUSED:
            self.step()
        elif self.state == IDLE:
            start(False)

    def space_key(self, start: Callable[[bool], Any]) -> None:
        if self.state == RUNNING:
            self.pause()
        else:
            self.run_key(start)

    def browses(self) -> bool:
        """Whether Right moves the selection (a finished run, not at its last round) instead of stepping."""
        return self.state == IDLE and bool(self.model.rounds) and self.model.selected[0] < len(self.model.rounds) - 1

    def can_play(self) -> bool:
        """Whether the navigator may play the rounds back (not while the worker owns the model)."""
        return self.state == IDLE

    # ------------------------------------------------------------------ worker signals

    def _on_state(self, state: str) -> None:
        if state == PAUSED and self.activity_text.startswith("loading") and not self.model.rounds:
            # prepared; a Step asked for round 0 and the worker now computes it
            self._say("computing round 0…")
        elif state in (IDLE, RUNNING) or (state == PAUSED and self.model.rounds):
            self._say("")
        self.stateChanged.emit(state)

    def _on_prepared(self, lane: int, config, token_text, label: str) -> None:
        if not self.active:  # a live run cancelled by opening a trace: not ours any more
            return
        self.model.begin(config, token_text, source="live", label=label)
        if self.recording.store is not None:
            lib_store = self.recording.store
            run_id = config.run_id
            self.model.loader = lambda i: lib_store.load_round(run_id, i, full=True)
        self.begun.emit(self.settings.describe() if self.settings is not None else label)

    def _on_noted(self, lane: int, text: str) -> None:
        if self.active:
            self.notes.append(text)
            self.noted.emit(text)

    def _on_round(self, lane: int, rnd) -> None:
        if not self.active or self.model.config is None or rnd.run_id != self.model.config.run_id:
            return  # a round of a run that was cancelled after it left the worker
        self.model.append(rnd)
        if self.activity_text and self.state != LOADING:
            self._say("")

    def _on_lane_finished(self, lane: int, reason: str, wall: float, result) -> None:
        if not self.active:
            return
        self.model.finish(reason, wall)
        self.follow(force=True)
        self.finished.emit(reason)

    def _on_recorded(self, lane: int, path: str) -> None:
        self.recorded_path = path

    # ------------------------------------------------------------------ following

    def user_selected(self, rnd: int, pos: int) -> None:
        self.follow_latest = rnd == len(self.model.rounds) - 1 and self.state == RUNNING

    def follow(self, force: bool = False) -> None:
        n = len(self.model.rounds)
        if self.active and self.follow_latest and n and (n - 1 != self._last_followed or force):
            self._last_followed = n - 1
            self.model.select(n - 1)

    # ------------------------------------------------------------------ the stored run

    def rounds_for_checking(self) -> list:
        """The run's rounds with whatever distributions are stored (without full vectors the
        checker works from the top-N entries and each vector's stored support, minimum and sum)."""
        rounds = self.model.rounds
        if not rounds or all(has_distributions(r) or not r.nodes for r in rounds):
            return list(rounds)
        if self.recording.store is not None and self.model.config is not None:
            try:
                return list(self.recording.store.iter_rounds(self.model.config.run_id, full=True))
            except Exception:
                log.exception("reading the recorded rounds failed")
        return [self.model.full_round(i) for i in range(len(rounds))]

    def store_and_run(self) -> tuple[Any, str] | None:
        """(trace store, run id) of the current run when it is recorded."""
        if self.recording.store is not None and self.model.config is not None:
            return self.recording.store, self.model.config.run_id
        return None

    def status_words(self) -> str:
        words = {IDLE: "idle", LOADING: "loading models", PAUSED: "paused", RUNNING: "running"}.get(
            self.state, self.state
        )
        if self.activity_text:
            words = self.activity_text.rstrip("…")
        if self.recorded_path:
            words += f" · recording to {os.path.basename(self.recorded_path)}"
        if self.notes:  # the whole text was in the message bar and the log
            words += " · tokenizers differ (same ids)"
        return words
