"""TraceWriter: records a run's rounds in batches, off the decoding thread.

    config = decoder.run_config(prompt_ids, max_new_tokens)
    with TraceWriter(store, config, model_info={"target_hash": "..."}) as writer:
        gen = decoder.rounds(prompt_ids, max_new_tokens, config=config)
        result = writer.record(gen)          # or: writer.write(rnd) per round, then
                                             # writer.finish_with(result) | writer.fail(exc) |
                                             # writer.finish(status, stop_reason=..., error=...)

The run row is inserted (status 'running') before the constructor returns, so other readers
see the run at once. write() only queues the round. Encoding (top-N with the whole-vector
facts, full vectors when kept) and inserting happen elsewhere, in one transaction per flush
interval together with a heartbeat and the run's aggregates, by one of two backends
(storage.writer.backends), chosen when the writer starts:

  mode "thread" (the default): in a thread of this process. It wakes every 0.8 flush
      intervals, or more often when encoding and committing take long (commit_period),
      encodes what is queued in one vectorised pass and commits it, so that no round waits
      longer than the interval.
  mode "process": in a writer process shared by all writers of this process
      (storage.writer.process); the decoding process only pickles each round, with its
      vectors out of band. When the recording process dies, the writer process still
      stores every round it received and marks the run interrupted. On the 2-core machine
      of BENCHMARKS.md it cost more decoding time than the thread (the pickling and the
      extra process compete with torch's threads), so it is opt-in. In-memory SQLite,
      which another process cannot open, always uses the thread.

The environment variable SPECSCOPE_TRACE_WRITER=thread|process sets the default mode.
A store locked by another connection for longer than SQLite's busy timeout loses nothing: the
backend keeps the rounds in memory and tries again (decoding goes on), telling `on_wait`
how long it has waited and how many rounds wait; when the lock clears, every kept round is
stored. Past the writer's wait ($SPECSCOPE_LOCK_WAIT_S, default 300 s), or when the recording
is interrupted while it waits, the whole run goes to a JSONL trace next to the store
(storage.writer.spill; `spilled_to` names it) that `specscope import` takes. A store locked
when the run starts is waited for in the constructor, before anything is decoded; past the
writer's wait the run row goes to that file instead of the store, and so does every round
(from a thread, whatever the mode), told to `on_wait` as a lock met later is.

A kill -9 of the recording process loses at most the rounds of the last flush interval;
the next TraceStore opened on the file marks the run interrupted (liveness.writer_is_dead),
unless a writer process already did.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, get_args

from sqlalchemy import insert, select

from specscope.core.decode.run import RunHandle, as_run
from specscope.core.records import GenerationResult, Round, RunConfig
from specscope.core.settings.vocab import StopReason
from specscope.storage.codec import VectorPolicy, covering_top_n
from specscope.storage.engine import is_sqlite
from specscope.storage.errors import RunExistsError, WriterError
from specscope.storage.info import ModelInfo
from specscope.storage.info import library_versions as collect_versions
from specscope.storage.liveness import live_writers, register_writer, unregister_writer
from specscope.storage.rows import run_row
from specscope.storage.schema import runs_table
from specscope.storage.store import TraceStore
from specscope.storage.transactions import is_busy, translate_errors
from specscope.storage.writer.backends import COMMIT_MARGIN, Backend, ProcessBackend, ThreadBackend, commit_period
from specscope.storage.writer.process import close_writer_process
from specscope.storage.writer.sink import LockWait, RunSink, lock_wait_s

__all__ = [
    "COMMIT_MARGIN",
    "FLUSH_INTERVAL_S",
    "MODE_ENV",
    "WRITER_MODES",
    "TraceWriter",
    "choose_mode",
    "commit_period",
    "default_mode",
    "record",
]

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
WRITER_MODES = ("auto", "process", "thread")
MODE_ENV = "SPECSCOPE_TRACE_WRITER"
from specscope.core.settings.vocab import ENDED_STATUSES as RUN_STATUSES  # noqa: E402 (a finished run's, defined once)

STOP_REASONS = get_args(StopReason)


@atexit.register
def finish_forgotten_writers() -> None:
    """Every writer still open ends its run as interrupted (at exit; also called directly by a
    process that ends without its exit handlers)."""
    for w in live_writers():
        try:
            w.give_up_waiting()  # type: ignore[attr-defined]  # a locked store is not waited for at exit
            w.finish("interrupted", error="the process exited without finishing the run")  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - best effort at exit: one writer's failure must not stop the others  # pragma: no cover
            pass
    close_writer_process()


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
    shareable = store.path is not None or not is_sqlite(store.url)
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
        on_wait: Callable[[LockWait], None] | None = None,
    ):
        if not 0 < flush_interval <= 60:
            raise ValueError(f"flush_interval must be in (0, 60] seconds, got {flush_interval!r}")
        self.store = store
        self.config = config
        self.run_id = config.run_id
        self.policy = VectorPolicy.for_vocab(
            config.vocab_size, covering_top_n(top_n, config.sampling.top_k), full_vectors, full_dtype
        )
        self.flush_interval = float(flush_interval)
        chosen = choose_mode(store, mode)
        self.on_wait = on_wait
        self.lock_wait = lock_wait_s()
        self._next_index = 0
        self._finished = False
        self._lock = threading.Lock()
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
        refused = self._insert_run(row)
        self.run_stored = refused is None  # False: the store never got the run, its file has it all
        self._backend = self._start_backend(chosen) if refused is None else self._spill_backend(row, *refused)
        register_writer(self)

    def _insert_run(self, row: dict[str, Any]) -> tuple[float, str] | None:
        """Insert the run row; a store locked by another connection is waited for (up to the
        writer's wait, telling on_wait), before anything is decoded. None once inserted; past
        the wait, how long it waited and the lock's error (the run then goes to a file)."""
        started = time.monotonic()
        while True:
            try:
                with translate_errors(f"starting run {self.run_id}"), self.store.transaction() as conn:
                    if conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == self.run_id)).first():
                        raise RunExistsError(f"a run with id {self.run_id} is already stored")
                    conn.execute(insert(runs_table), row)  # parameters, not .values(): compiled once, cached
                return None
            except WriterError:
                raise
            except Exception as exc:
                waited = time.monotonic() - started
                if not is_busy(exc):
                    raise
                reason = str(getattr(exc.__cause__, "orig", None) or exc)
                if waited >= self.lock_wait:
                    return waited, reason
                if self.on_wait is not None:
                    self.on_wait(LockWait(self.run_id, "waiting", waited, self.lock_wait, 0, 0, reason=reason))
                time.sleep(0.2)

    def _spill_backend(self, row: dict[str, Any], waited_s: float, reason: str) -> Backend:
        """A thread that writes the whole run to its JSONL file, the store having stayed locked
        past the writer's wait when the run started (a lock met later ends the same way); the
        writer process would only pass the rounds on to the same file."""
        sink = RunSink(self.store.engine, self.run_id, self.policy, self.started_at, self.lock_wait)
        try:
            sink.spill_from_start(row, waited_s, reason)
        except OSError as exc:  # no folder to write to: the run cannot be recorded anywhere
            raise WriterError(
                f"starting run {self.run_id}: the store stayed locked ({reason}) and the run cannot go to a "
                f"file either: {exc}"
            ) from exc
        return ThreadBackend(sink, self.flush_interval, self.on_wait)

    def _start_backend(self, mode: str) -> Backend:
        if mode == "process":
            try:
                return ProcessBackend(
                    self.store.url,
                    self.store.engine,
                    self.run_id,
                    self.policy,
                    self.started_at,
                    self.flush_interval,
                    self.on_wait,
                )
            except WriterError as exc:
                log.warning("%s; recording run %s from a thread instead", exc, self.run_id)
        return ThreadBackend(
            RunSink(self.store.engine, self.run_id, self.policy, self.started_at, self.lock_wait),
            self.flush_interval,
            self.on_wait,
        )

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
        self._backend.submit(rnd)

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every round written so far is committed."""
        if self._finished or not self.alive:
            self._raise_if_failed()
            return
        if not self._backend.flush(timeout):
            raise WriterError(f"the trace writer of run {self.run_id} did not flush in time")
        self._raise_if_failed()

    def finish(
        self,
        status: str = "completed",
        *,
        stop_reason: str | None = None,
        error: str | None = None,
        wall_s: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Flush everything and close the run with `status` (completed | interrupted |
        failed), the decoder's `stop_reason` (eos | stop | budget | cancelled, or None), an `error`
        message and the run's `wall_s` (default: the time since the writer started).
        Idempotent: only the first call closes the run."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {'|'.join(RUN_STATUSES)}, got {status!r}")
        if stop_reason is not None and stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be None or one of {'|'.join(STOP_REASONS)}, got {stop_reason!r}")
        with self._lock:
            if self._finished:
                return
            self._finished = True
        values: dict[str, Any] = {"status": status, "stop_reason": stop_reason, "error": error}
        if wall_s is not None:
            values["wall_s"] = float(wall_s)
        try:
            self._backend.finish(values, timeout)
        finally:
            unregister_writer(self)
        self._raise_if_failed()

    def finish_with(self, result: GenerationResult, *, timeout: float | None = None) -> None:
        """Close the run with a decoder's result: completed when it stopped at EOS, a stop
        string or sequence, or the budget; interrupted (stop reason cancelled) otherwise."""
        status = "completed" if result.stop_reason in ("eos", "stop", "budget") else "interrupted"
        self.finish(status, stop_reason=result.stop_reason, wall_s=result.wall_s, timeout=timeout)

    def fail(self, exc: BaseException, *, timeout: float | None = None) -> None:
        """Close the run after `exc` stopped it: KeyboardInterrupt and GeneratorExit (a
        cancelled generator) as interrupted with stop reason cancelled (the error: the
        exception's message, else its type's name; a store locked by another connection is
        then not waited for: the run goes to its JSONL file), anything else as failed with the
        exception as the error."""
        if isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
            self.give_up_waiting()  # a cancelled run does not wait for a locked store: its rounds go to the file
            self.finish("interrupted", stop_reason="cancelled", error=str(exc) or type(exc).__name__, timeout=timeout)
        else:
            self.finish("failed", error=f"{type(exc).__name__}: {exc}", timeout=timeout)

    def record(self, rounds: RunHandle | Generator[Round, None, GenerationResult]) -> GenerationResult:
        """Drive a run (a RunHandle or a decoder's rounds() generator), writing every round;
        finish with its result, or fail() with what stopped it."""
        run = as_run(rounds)
        try:
            result = run.drain(self.write)
        except BaseException as exc:
            if not self._finished:
                try:
                    self.fail(exc)
                except WriterError:
                    pass
            raise
        self.finish_with(result)
        return result

    def stored_status(self) -> str | None:
        """The run's status as the store has it now (running | completed | interrupted |
        failed), or None when it cannot be read. After a failure of the writer it tells
        whether the run could still be marked failed."""
        try:
            with self.store.engine.connect() as conn:
                return conn.execute(select(runs_table.c.status).where(runs_table.c.run_id == self.run_id)).scalar()
        except Exception:  # noqa: BLE001 - after a writer failure anything may be wrong with the store: None says unreadable
            return None

    @property
    def spilled_to(self) -> str | None:
        """The JSONL file holding the whole run when the store stayed locked past the writer's
        wait (or the recording was interrupted while it waited); None while the store has it."""
        return self._backend.spilled_to

    @property
    def lock_state(self) -> LockWait | None:
        """The last wait for a locked store (None when the store never made it wait)."""
        return self._backend.lock_state

    def spill_note(self, where: str | None = None) -> str:
        """Where a run whose store stayed locked went, and how to add it to the store ("" when
        the store has it)."""
        path = self.spilled_to
        if not path:
            return ""
        where = where or self.store.location
        if not self.run_stored:  # locked when the run started: the run can go in under its own id
            return (
                f"{where} was locked when run {self.run_id} started, so the whole run went to {path} (the store "
                f"holds none of it); add it with: specscope import {path} --db {where}"
            )
        n = self.rounds_written
        return (
            f"{where} stayed locked, so run {self.run_id} went whole to {path} (the store keeps its first "
            f"{n} round{'' if n == 1 else 's'}, marked interrupted); add it with: specscope import {path} "
            f"--db {where} --run-id NEW_ID"
        )

    def give_up_waiting(self) -> None:
        """Stop waiting for a locked store now: the run goes to its JSONL file."""
        self._backend.give_up()

    @property
    def mode(self) -> str:
        """'thread' or 'process': the backend in use."""
        return self._backend.mode

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def error(self) -> BaseException | None:
        return self._backend.error

    @property
    def alive(self) -> bool:
        """Whether rounds written now will still be stored."""
        return self._backend.alive

    @property
    def rounds_written(self) -> int:
        """Rounds committed so far (as last reported by the backend)."""
        return self._backend.rounds_written

    @property
    def flushes(self) -> int:
        return self._backend.flushes

    def _raise_if_failed(self) -> None:
        error = self._backend.error
        if error is not None:
            raise WriterError(f"the trace writer of run {self.run_id} failed: {error}") from error

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._finished:
            return
        if exc is None:
            self.finish()
            return
        try:
            self.fail(exc)
        except WriterError:
            log.exception("trace writer failed while finishing after %r", exc)


def record(
    store: TraceStore,
    decoder: Any,
    prompt_ids: Any,
    max_new_tokens: int = 32,
    *,
    run_id: str | None = None,
    keep_rounds: bool = False,
    **writer_kwargs: Any,
) -> GenerationResult:
    """Run `decoder` (a SpeculativeDecoder) on a prompt and store every round. The result
    carries the tokens and the summary; its `rounds` too with `keep_rounds=True` (the store
    has them either way)."""
    config = decoder.run_config(prompt_ids, max_new_tokens, run_id)
    with TraceWriter(store, config, **writer_kwargs) as writer:
        # start(): a run handle, which an engine may drain in this thread (core/engines)
        return writer.record(decoder.start(prompt_ids, max_new_tokens, config=config, keep_rounds=keep_rounds))
