"""The decode worker: advances core runs (RunHandle) one round at a time in a QThread.

The worker owns no widgets; it emits Round records through queued signals. A run has one
or two lanes (two in compare mode, advanced alternately round by round). Controls:

- run: keep advancing until paused, stopped or finished;
- step: advance exactly one round (per lane) and pause;
- pause: stop advancing after the round in progress;
- stop: close the runs at the next round boundary (the core's cancellation).

pause/stop only set flags (thread-safe), so they take effect at the next round even while
the worker is inside a round. Exceptions never escape: they become `failed(message)`.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer, Signal, Slot

from specscope.app.gui.model.settings import DEFAULT_PROPOSER, PanelSettings
from specscope.core import RunHandle, parse_spec
from specscope.core.decode.settings import SettingsError

from .hub import ModelHub, Prepared
from .vllm import build_vllm  # the vllm engine's lanes (vLLM's own process)

log = logging.getLogger(__name__)

IDLE, LOADING, PAUSED, RUNNING, STOPPING = "idle", "loading", "paused", "running", "stopping"

NO_RESULT = 0  # sent instead of None through object signals (PySide6 refcounts None badly)

# recorder_factory(config, model_info) -> object with write(round) and finish(result_or_None, stop_reason)
RecorderFactory = Callable[[Any], Any]


@dataclass
class _Lane:
    prepared: Prepared
    run: RunHandle
    recorder: Any = None
    done: bool = False
    rounds: int = 0
    started: float = field(default_factory=time.perf_counter)


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class DecodeWorker(QObject):
    prepared = Signal(int, object, object, str)  # lane, RunConfig, token_text, label
    noted = Signal(int, str)  # lane, a warning about its models in words (Prepared.notes), after `prepared`
    baseline = Signal(object)  # session.PlainCost of plain decoding (compare mode)
    roundReady = Signal(int, object)  # lane, Round
    laneFinished = Signal(int, str, float, object)  # lane, stop reason, wall seconds, GenerationResult | None
    finished = Signal()
    failed = Signal(str, str)  # message, details
    refused = Signal(
        object, int
    )  # {field: message}, lane: settings that cannot run (core SettingsError); nothing started
    stateChanged = Signal(str)
    recorded = Signal(int, str)  # lane, where the trace is being written
    devicesFound = Signal(object)  # tuple of device names, once torch is imported (the preload's first step)
    preloaded = Signal(str)  # a status line once the default models are in memory
    preloading = False  # True while preload imports torch and loads the models (nothing to save if cut short)
    referenced = Signal(int, object)  # lane, core.check.diverge.Divergence or the error's text

    def __init__(self, hub: ModelHub, recorder_factory: RecorderFactory | None = None):
        super().__init__()
        self.hub = hub
        self.recorder_factory = recorder_factory
        self.lanes: list[_Lane] = []
        self.state = IDLE
        self._want_running = False
        self.session = 0  # id of the run being prepared/advanced
        self.cancelled_upto = 0  # runs with session <= this are cancelled (written by the GUI)
        self._step_budget = 0
        self._scheduled = False
        self.threads: int | None = None  # torch threads set by the last prepare

    # ------------------------------------------------------------------ state

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.stateChanged.emit(state)

    # called from the GUI thread: flags only
    def request_pause(self) -> None:
        self._want_running = False

    def request_stop(self, session: int | None = None) -> None:
        self._want_running = False
        self.cancelled_upto = max(self.cancelled_upto, self.session if session is None else session)

    def _cancelled(self) -> bool:
        return self.cancelled_upto >= self.session

    # ------------------------------------------------------------------ slots (worker thread)

    @Slot(str, str)
    def preload(self, device: str, target: str = "") -> None:
        """Import torch (the window is built without it), say which devices there are, then load
        the run panel's target (`target`: "" = the bundled one) and, for the bundled target, the
        default proposer's draft ahead of the first Run (errors surface at Run). `device` is the
        run panel's; cpu when it is not available here. The status line names what loaded."""
        self.preloading = True
        try:
            devices = self.hub.detect_devices()
            self.devicesFound.emit(devices)
            if device not in devices:
                device = "cpu"
            self.hub.target(device, target)
            loaded = [f"target {target}" if target else self.hub.bundled_words]
            model_ref = parse_spec(DEFAULT_PROPOSER).model_ref
            if model_ref is not None and not target:  # the bundled drafts draft for the bundled target only
                self.hub.draft_loader(device)(model_ref)
                loaded.append(f"draft-{model_ref.removeprefix('draft-')}")
        except Exception as exc:  # noqa: BLE001
            self.preloading = False
            log.warning("preloading the models failed: %s", exc)
            self.preloaded.emit(f"Models not preloaded: {exc}")
            return
        self.preloading = False
        self.preloaded.emit(f"Models ready ({' and '.join(loaded)}, on {device}).")

    @Slot(object)
    def reference(self, lanes: list) -> None:
        """Compare mode's reference lane: each finished greedy lane, (lane, settings, config,
        rounds), against plain greedy decoding of its target, the first difference classified
        as a near tie or a logic bug (core.check.diverge)."""
        from specscope.core.check.diverge import diverge_report

        for lane, settings, config, rounds in lanes:
            try:
                result: Any = diverge_report(config, rounds, self.hub.models(settings).target)
            except Exception as exc:  # noqa: BLE001 - shown in the lane's summary, never a traceback
                log.warning("comparing lane %d with plain greedy decoding failed: %s", lane, exc)
                result = str(exc) or type(exc).__name__
            self.referenced.emit(lane, result)

    @Slot(object, bool, int)
    def prepare(self, settings_list: list[PanelSettings], measure_baseline: bool = False, session: int = 0) -> None:
        self._close_all("cancelled")
        self.session = session
        self._want_running = False
        self._step_budget = 0
        if self._cancelled():  # stopped before it started
            self.state = IDLE
            self.stateChanged.emit(IDLE)
            self.finished.emit()
            return
        self._set_state(LOADING)
        building = 0  # the lane whose settings a refusal is about
        try:
            from specscope.app.threads import apply_threads

            # torch's thread count is process-wide: the first lane's setting rules
            self.threads = apply_threads(settings_list[0].threads if settings_list else None)
            lanes = []
            for i, settings in enumerate(settings_list):
                building = i
                if settings.engine == "vllm":  # vLLM's own process (sessions/vllm.py)
                    prep = build_vllm(self.hub, settings, cancelled=self._cancelled)
                else:
                    prep = self.hub.build(settings)
                recorder = None
                if self.recorder_factory is not None:
                    try:
                        recorder = self.recorder_factory(prep.config, prep.model_info)
                    except Exception as exc:
                        log.exception("cannot record the run")
                        self.failed.emit(f"The run is not being recorded: {_message(exc)}", traceback.format_exc())
                if getattr(
                    recorder, "full_vectors", False
                ):  # a store that keeps full vectors (else top-N above 4096 tokens)
                    prep.decoder.keep_full_vectors()
                run = prep.decoder.start(prep.prompt_ids, config=prep.config)
                lanes.append(_Lane(prep, run, recorder))
                self.prepared.emit(i, prep.config, prep.token_text, prep.label)
                for note in prep.notes:
                    self.noted.emit(i, note)
                if recorder is not None:
                    self.recorded.emit(i, str(getattr(recorder, "path", "")))
            self.lanes = lanes
            if measure_baseline and lanes:
                self.baseline.emit(self.hub.measure_plain(settings_list[0], lanes[0].prepared.prompt_ids))
        except Exception as exc:
            self.lanes = []
            self._set_state(IDLE)
            if self._cancelled():  # stopped while a lane was being prepared (vLLM's run): nothing failed
                self.finished.emit()
                return
            if isinstance(exc, SettingsError):  # shown under the run panel's fields, as the CLI refuses them
                self.refused.emit(dict(exc.errors), building)
            else:
                log.exception("cannot start the run")
                self.failed.emit(_message(exc), traceback.format_exc())
            return
        self._set_state(PAUSED)

    @Slot()
    def run(self) -> None:
        if not self.lanes:
            return
        self._want_running = True
        self._set_state(RUNNING)
        self._schedule()

    @Slot()
    def step(self) -> None:
        if not self.lanes:
            return
        self._want_running = False
        self._step_budget = 1
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            QTimer.singleShot(0, self._tick)

    @Slot()
    def _tick(self) -> None:
        self._scheduled = False
        if not self.lanes:
            return
        if self._cancelled():
            self._close_all("cancelled")
            return
        if not (self._want_running or self._step_budget > 0):
            if self.state == RUNNING:
                self._set_state(PAUSED)
            return
        self._step_budget = max(0, self._step_budget - 1)
        for i, lane in enumerate(self.lanes):
            if lane.done:
                continue
            if self._cancelled():
                break
            self._advance(i, lane)
        if all(lane.done for lane in self.lanes):
            self._finish_all()
            return
        if self._cancelled():
            self._close_all("cancelled")
            return
        if self._want_running:
            time.sleep(0)  # hand the GIL to the GUI thread between rounds (keeps painting smooth)
            self._schedule()
        else:
            self._set_state(PAUSED)

    def _advance(self, i: int, lane: _Lane) -> None:
        try:
            rnd = lane.run.step()
        except Exception as exc:
            log.exception("round failed")
            lane.done = True
            self._finish_recorder(lane, None, "error")
            self.laneFinished.emit(i, "error", time.perf_counter() - lane.started, NO_RESULT)
            self.failed.emit(f"Round {lane.rounds} failed — {_message(exc)}", traceback.format_exc())
            return
        if rnd is None:
            self._lane_done(i, lane)
            return
        lane.rounds += 1
        if lane.recorder is not None:
            try:
                lane.recorder.write(rnd)
            except Exception as exc:
                log.exception("recording failed")
                self.failed.emit(f"Recording stopped: {_message(exc)}", traceback.format_exc())
                lane.recorder = None
        self.roundReady.emit(i, rnd)

    def _lane_done(self, i: int, lane: _Lane) -> None:
        result = lane.run.result
        lane.done = True
        self._finish_recorder(lane, result, result.stop_reason if result else "budget")
        self.laneFinished.emit(
            i,
            result.stop_reason if result else "budget",
            result.wall_s if result else time.perf_counter() - lane.started,
            result if result is not None else NO_RESULT,
        )

    def _finish_recorder(self, lane: _Lane, result: Any, reason: str) -> None:
        rec, lane.recorder = lane.recorder, None
        if rec is None:
            return
        try:
            rec.finish(result, reason)
        except Exception as exc:
            log.exception("closing the trace failed")
            self.failed.emit(f"Closing the trace failed: {_message(exc)}", traceback.format_exc())

    def _finish_all(self) -> None:
        self.lanes = []
        self._want_running = False
        self._set_state(IDLE)
        self.finished.emit()

    def _close_all(self, reason: str) -> None:
        if not self.lanes:
            return
        for i, lane in enumerate(self.lanes):
            if lane.done:
                continue
            lane.done = True
            try:
                lane.run.close()
            except Exception:
                log.exception("closing the run failed")
            self._finish_recorder(lane, None, reason)
            self.laneFinished.emit(i, reason, time.perf_counter() - lane.started, NO_RESULT)
        self._finish_all()

    @Slot()
    def shutdown(self) -> None:
        self.cancelled_upto = max(self.cancelled_upto, self.session)
        self._close_all("cancelled")


# Decoder threads that did not stop when their controller closed (RunController.close).
_STILL_RUNNING: list[tuple[QThread, QObject]] = []


def decoder_threads_running() -> bool:
    """Whether a decoder thread left to finish (RunController.close's timeout) still runs."""
    return any(thread.isRunning() for thread, _ in _STILL_RUNNING)


class RunController(QObject):
    """GUI-thread handle on a DecodeWorker living in its own QThread."""

    _prepare = Signal(object, bool, int)
    _run = Signal()
    _step = Signal()
    _shutdown = Signal()
    _preload = Signal(str, str)
    _reference = Signal(object)

    def __init__(self, hub: ModelHub, recorder_factory: RecorderFactory | None = None, parent=None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("specscope-decoder")
        self.worker = DecodeWorker(hub, recorder_factory)
        self.worker.moveToThread(self.thread)
        self._prepare.connect(self.worker.prepare)
        self._run.connect(self.worker.run)
        self._step.connect(self.worker.step)
        self._shutdown.connect(self.worker.shutdown)
        self._preload.connect(self.worker.preload)
        self._reference.connect(self.worker.reference)
        self.worker.stateChanged.connect(self._on_state)
        self.state = IDLE
        self._session = 0
        self._closed = False
        self.thread.start()
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.close)

    def _on_state(self, state: str) -> None:
        self.state = state

    @property
    def busy(self) -> bool:
        return self.state in (LOADING, RUNNING, PAUSED, STOPPING)

    def start(self, settings_list: list[PanelSettings], run: bool = True, measure_baseline: bool = False) -> None:
        self.worker.request_stop(self._session)  # cancel whatever runs now
        self._session += 1
        self.state = LOADING
        self._prepare.emit(list(settings_list), measure_baseline, self._session)
        if run:
            self._run.emit()

    def preload(self, device: str = "cpu", target: str = "") -> None:
        self._preload.emit(device, target)

    def reference(self, lanes: list) -> None:
        """Queue DecodeWorker.reference for (lane, settings, config, rounds) each."""
        self._reference.emit(list(lanes))

    def run(self) -> None:
        self._run.emit()

    def step(self) -> None:
        self._step.emit()

    def pause(self) -> None:
        self.worker.request_pause()

    def stop(self) -> None:
        self.worker.request_stop(self._session)
        self._step.emit()  # wake the worker so it closes the generators at the boundary

    def close(self, timeout_ms: int = 30000) -> None:
        # The worker stops at the next round boundary or after the model load in progress;
        # on a loaded 2-core machine a load has taken more than 5 s, and a QThread destroyed
        # while running aborts the process, so the wait is generous.
        if self._closed:
            return
        self._closed = True
        self.worker.request_stop(self._session)
        self._shutdown.emit()
        self.thread.quit()
        if not self.thread.wait(timeout_ms):
            # Still inside a model load or torch's import, which nothing can interrupt. Keep the
            # thread and its worker referenced for the life of the process: a QThread destroyed
            # while running aborts the interpreter (the window's quit ends the process anyway).
            log.warning("the decoder thread did not stop within %d ms; it is left to finish", timeout_ms)
            _STILL_RUNNING.append((self.thread, self.worker))
