"""TraceWriter: records a run's rounds in batches, off the decoding thread.

    config = decoder.run_config(prompt_ids, max_new_tokens)
    with TraceWriter(store, config, model_info={"target_hash": "..."}) as writer:
        gen = decoder.rounds(prompt_ids, max_new_tokens, config=config)
        result = writer.record(gen)          # or: writer.write(rnd) per round, writer.finish(result)

The run row is inserted (status 'running') before the constructor returns, so other readers
see the run at once. write() only queues the round. Encoding (top-N with the whole-vector
facts, full vectors when kept) and inserting happen elsewhere, in one transaction per flush
interval together with a heartbeat and the run's aggregates:

  mode "thread" (the default): in a thread of this process. It wakes every 0.8 flush
      intervals, or more often when encoding and committing take long (commit_period),
      encodes what is queued in one vectorised pass and commits it, so that no round waits
      longer than the interval.
  mode "process": in a writer process shared by all writers of this process
      (storage.writer_process); the decoding process only pickles each round, with its
      vectors out of band. When the recording process dies, the writer process still
      stores every round it received and marks the run interrupted. On the 2-core machine
      of BENCHMARKS.md it cost more decoding time than the thread (the pickling and the
      extra process compete with torch's threads), so it is opt-in. In-memory SQLite,
      which another process cannot open, always uses the thread.

The environment variable SPECSCOPE_TRACE_WRITER=thread|process sets the default mode.
A kill -9 of the recording process loses at most the rounds of the last flush interval;
the next TraceStore opened on the file marks the run interrupted (store.writer_is_dead),
unless a writer process already did.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping

from sqlalchemy import insert, select
from sqlalchemy.engine import make_url

from specscope.core.records import GenerationResult, Round, RunConfig

from .codec import VectorPolicy, covering_top_n
from .errors import RunExistsError, WriterError
from .info import ModelInfo, library_versions as collect_versions
from .schema import runs_table
from .sink import RunSink
from .store import HEARTBEAT_S, TraceStore, run_row, translate_errors
from .writer_process import close_writer_process, writer_process

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
# The thread commits every COMMIT_MARGIN of the flush interval or more often, so that the
# time the encoding and the commit take and wake-up delays under load stay inside it.
COMMIT_MARGIN = 0.8
COMMIT_SLACK_S = 0.005  # a wake-up this early still commits


def commit_period(flush_interval: float, work_s: float) -> float:
    """Seconds between the writer thread's commits when encoding and committing a period's
    rounds took `work_s`: at most COMMIT_MARGIN of the interval, shorter when the work is
    long (full vectors under load), so that no round waits longer than the interval."""
    return max(0.25 * flush_interval, min(COMMIT_MARGIN * flush_interval, flush_interval - 2 * work_s - 0.02))


WRITER_MODES = ("auto", "process", "thread")
MODE_ENV = "SPECSCOPE_TRACE_WRITER"
_live_lock = threading.Lock()
_live: "weakref.WeakSet[TraceWriter]" = weakref.WeakSet()
_tokens = itertools.count(1)


def live_writer_ids() -> frozenset[str]:
    """Run ids being written by TraceWriters of this process."""
    with _live_lock:
        return frozenset(w.run_id for w in _live if w.alive)


@atexit.register
def _finish_forgotten_writers() -> None:
    with _live_lock:
        writers = list(_live)
    for w in writers:
        try:
            w.finish("interrupted", error="the process exited without finishing the run")
        except Exception:  # pragma: no cover - best effort at exit
            pass
    close_writer_process()


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Finish:
    values: dict[str, Any]


def _outcome(outcome: Any, error: str | None) -> tuple[str, str | None, str | None, GenerationResult | None]:
    """(status, stop_reason, error, result) from what finish() was given."""
    if outcome is None:
        return ("completed" if error is None else "failed"), None, error, None
    if isinstance(outcome, GenerationResult):
        status = "completed" if outcome.stop_reason in ("eos", "budget") else "interrupted"
        return status, outcome.stop_reason, error, outcome
    if isinstance(outcome, (KeyboardInterrupt, GeneratorExit)):
        return "interrupted", "cancelled", error or type(outcome).__name__, None
    if isinstance(outcome, BaseException):
        return "failed", None, error or f"{type(outcome).__name__}: {outcome}", None
    if outcome in ("completed", "interrupted", "failed"):
        return outcome, None, error, None
    raise ValueError(f"finish() takes a GenerationResult, an exception or one of completed|interrupted|failed, got {outcome!r}")


def default_mode() -> str:
    """The mode of writers created with mode='auto': SPECSCOPE_TRACE_WRITER, else 'thread'."""
    mode = os.environ.get(MODE_ENV, "thread").strip().lower() or "thread"
    if mode not in ("process", "thread"):
        raise ValueError(f"{MODE_ENV} must be 'process' or 'thread', got {mode!r}")
    return mode


def choose_mode(store: TraceStore, mode: str = "auto") -> str:
    """'process' or 'thread' for a writer on `store` (see the module docstring)."""
    if mode not in WRITER_MODES:
        raise ValueError(f"mode must be one of {', '.join(WRITER_MODES)}, got {mode!r}")
    if mode == "auto":
        mode = default_mode()
    shareable = store.path is not None or make_url(store.url).get_backend_name() != "sqlite"
    return mode if shareable else "thread"


class TraceWriter:
    """Writes one run. See the module docstring."""

    def __init__(
        self,
        store: TraceStore,
        config: RunConfig,
        *,
        model_info: ModelInfo | Mapping[str, Any] | None = None,
        prompt_text: str | None = None,
        top_n: int = 20,
        full_vectors: bool | None = None,
        full_dtype: str = "float32",
        flush_interval: float = FLUSH_INTERVAL_S,
        library_versions: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        mode: str = "auto",
    ):
        if not 0 < flush_interval <= 60:
            raise ValueError(f"flush_interval must be in (0, 60] seconds, got {flush_interval!r}")
        self.store = store
        self.config = config
        self.run_id = config.run_id
        self.policy = VectorPolicy.for_vocab(config.vocab_size, covering_top_n(top_n, config.sampling.top_k), full_vectors,
                                             full_dtype)
        self.flush_interval = float(flush_interval)
        self.mode = choose_mode(store, mode)
        self._next_index = 0
        self._finished = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.rounds_written = 0  # committed so far (as last reported by the thread or process)
        self.flushes = 0

        self.started_at = time.time()
        row = run_row(
            config,
            status="running",
            started_at=self.started_at,
            models=ModelInfo.coerce(model_info),
            library_versions=library_versions if library_versions is not None else collect_versions(),
            top_n=self.policy.top_n,
            full_vectors=self.policy.full,
            full_dtype=self.policy.full_dtype,
            prompt_text=prompt_text,
            extra=extra,
            writer_host=socket.gethostname(),
            writer_pid=os.getpid(),
        )
        with translate_errors(f"starting run {self.run_id}"):
            with store.transaction() as conn:
                if conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == self.run_id)).first():
                    raise RunExistsError(f"a run with id {self.run_id} is already stored")
                conn.execute(insert(runs_table), row)  # parameters, not .values(): compiled once, cached
        if self.mode == "process":
            try:
                self._start_process()
            except WriterError as exc:
                log.warning("%s; recording run %s from a thread instead", exc, self.run_id)
                self.mode = "thread"
        if self.mode == "thread":
            self._start_thread()
        with _live_lock:
            _live.add(self)

    # ------------------------------------------------------------------ producer side

    def write(self, rnd: Round) -> None:
        """Queue one round (never waits on the database)."""
        if self._finished:
            raise WriterError(f"run {self.run_id} is finished; no more rounds can be written")
        self._raise_if_failed()
        if rnd.run_id != self.run_id:
            raise ValueError(f"round of run {rnd.run_id!r} given to the writer of run {self.run_id!r}")
        if rnd.index != self._next_index:
            raise ValueError(f"round {rnd.index} written out of order: expected round {self._next_index}")
        self._next_index += 1
        if self.mode == "process":
            self._service.send(("rounds", self.run_id, [rnd]))
        else:
            self._queue.put(rnd)

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every round written so far is committed."""
        if self._finished or not self.alive:
            self._raise_if_failed()
            return
        marker = _Flush()
        if self.mode == "process":
            token = next(_tokens)
            self._flushes_waiting[token] = marker
            self._service.send(("flush", self.run_id, token))
        else:
            self._queue.put(marker)
            self._wake.set()
        if not self._wait(marker.done, timeout):
            raise WriterError(f"the trace writer of run {self.run_id} did not flush in time")
        self._raise_if_failed()

    def finish(self, outcome: GenerationResult | BaseException | str | None = None, *, error: str | None = None,
               timeout: float | None = None) -> None:
        """Flush everything and close the run.

        outcome: a GenerationResult (status completed, or interrupted when cancelled), an
        exception (failed; KeyboardInterrupt: interrupted), a status string
        ('completed' | 'interrupted' | 'failed') or None (completed). Idempotent.
        """
        with self._lock:
            if self._finished:
                return
            self._finished = True
        status, stop_reason, error, result = _outcome(outcome, error)
        values: dict[str, Any] = {"status": status, "stop_reason": stop_reason, "error": error}
        if result is not None:
            values["wall_s"] = float(result.wall_s)
        try:
            if self.mode == "process":
                try:
                    self._service.send(("finish", self.run_id, values))
                except WriterError as exc:  # the writer process has gone: _on_message("died") closed us
                    self._fail(exc)
                if not self._wait(self._closed, timeout):
                    raise WriterError(f"the trace writer of run {self.run_id} did not finish in time")
                self._service.unregister(self.run_id)
            else:
                self._queue.put(_Finish(values))
                self._wake.set()
                self._thread.join(timeout)
        finally:
            with _live_lock:
                _live.discard(self)
        self._raise_if_failed()

    def record(self, rounds: Generator[Round, None, GenerationResult]) -> GenerationResult:
        """Drive a decoder's rounds() generator, writing every round; finish with its result."""
        try:
            while True:
                try:
                    rnd = next(rounds)
                except StopIteration as stop:
                    result = stop.value
                    break
                self.write(rnd)
        except BaseException as exc:
            rounds.close()
            if not self._finished:
                try:
                    self.finish(exc)
                except WriterError:
                    pass
            raise
        self.finish(result)
        return result

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def alive(self) -> bool:
        """Whether rounds written now will still be stored."""
        if self.mode == "process":
            return not self._closed.is_set() and self._service.alive
        return self._thread.is_alive()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterError(f"the trace writer of run {self.run_id} failed: {self._error}") from self._error

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait for `event` while whoever must set it is alive."""
        waited = 0.0
        while not event.wait(0.05):
            if not self.alive and not event.is_set():
                return self._error is not None or event.is_set()
            waited += 0.05
            if timeout is not None and waited >= timeout:
                return False
        return True

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if not self._finished:
            if exc is not None:
                try:
                    self.finish(exc)
                except WriterError:
                    log.exception("trace writer failed while finishing after %r", exc)
            else:
                self.finish()

    # ------------------------------------------------------------------ process mode

    def _start_process(self) -> None:
        self._flushes_waiting: dict[int, _Flush] = {}
        self._closed = threading.Event()
        self._service = writer_process()
        self._service.register(self.run_id, self._on_message)
        p = self.policy
        self._service.send(("open", self.run_id, self.store.url, (p.top_n, p.full, p.full_dtype), self.started_at,
                            self.flush_interval))

    def _on_message(self, m: tuple) -> None:
        """Called on the receiving thread with each answer of the writer process."""
        kind = m[0]
        if kind == "committed":
            self.rounds_written, self.flushes = m[2], m[3]
        elif kind == "flushed":
            marker = self._flushes_waiting.pop(m[2], None)
            if marker is not None:
                marker.done.set()
        elif kind == "error":
            self._fail(WriterError(m[2]))
        elif kind == "finished":
            self._closed.set()
        elif kind == "died":
            self._fail(WriterError(f"the trace writer process stopped: {m[2]}"))
            RunSink(self.store.engine, self.run_id, self.policy, self.started_at).mark(
                "failed", f"trace writer process stopped: {m[2]}")
            self._closed.set()
        if kind in ("error", "died", "finished"):
            for marker in list(self._flushes_waiting.values()):
                marker.done.set()

    # ------------------------------------------------------------------ thread mode

    def _start_thread(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._sink = RunSink(self.store.engine, self.run_id, self.policy, self.started_at)
        self._thread = threading.Thread(target=self._loop, name=f"TraceWriter-{self.run_id[:8]}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Sleep until the next commit is due (or flush/finish wakes the thread), then encode
        # everything queued in one vectorised pass and commit it. While torch keeps both
        # cores busy every wake-up of this thread slows the decoder more than its CPU time:
        # encoding five times per commit period cost ~1 point more decoding time than once,
        # and waking at each round ~5 points more (BENCHMARKS.md), so the thread wakes once
        # per commit period.
        # It keeps the normal priority: at nice 10 it was starved while torch kept both cores
        # busy (commits up to 0.6 s apart instead of 0.25 s), and SCHED_IDLE never committed
        # before the end of a 2 s run.
        markers: list[_Flush] = []
        commit_every = commit_period(self.flush_interval, 0.0)
        next_due = time.monotonic() + commit_every
        try:
            while True:
                self._wake.wait(timeout=max(0.0, next_due - time.monotonic()))
                self._wake.clear()
                batch: list[Round] = []
                markers = []
                final: _Finish | None = None
                while final is None:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, Round):
                        batch.append(item)
                    elif isinstance(item, _Flush):
                        markers.append(item)
                    elif isinstance(item, _Finish):
                        final = item
                started = time.monotonic()
                if batch:
                    self._sink.add(batch)
                now = time.monotonic()
                since_commit = now - self._sink.last_commit
                if (markers or final is not None or since_commit >= HEARTBEAT_S
                        or (self._sink.pending and since_commit >= commit_every - COMMIT_SLACK_S)):
                    self._sink.commit((), final.values if final else None)
                    self.rounds_written, self.flushes = self._sink.rounds_written, self._sink.flushes
                    # A round written just after this wake-up waits a period plus the next
                    # encode and commit, which take about as long as these did.
                    commit_every = commit_period(self.flush_interval, time.monotonic() - started)
                # pending rounds are due a period after the last commit; otherwise wake a
                # period from now
                next_due = self._sink.last_commit + commit_every if self._sink.pending else now + commit_every
                for marker in markers:
                    marker.done.set()
                if final is not None:
                    return
        except BaseException as exc:  # keep the error for the producer; mark the run failed
            self._error = exc
            log.exception("trace writer of run %s failed", self.run_id)
            self._sink.mark("failed", f"trace writer failed: {type(exc).__name__}: {exc}")
            # release anyone waiting on a flush marker
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Flush):
                    item.done.set()
            for marker in markers:
                marker.done.set()


def record(store: TraceStore, decoder: Any, prompt_ids: Any, max_new_tokens: int = 32, *, run_id: str | None = None,
           **writer_kwargs: Any) -> GenerationResult:
    """Run `decoder` (a SpeculativeDecoder) on a prompt and store every round."""
    config = decoder.run_config(prompt_ids, max_new_tokens, run_id)
    with TraceWriter(store, config, **writer_kwargs) as writer:
        return writer.record(decoder.rounds(prompt_ids, max_new_tokens, config=config))
