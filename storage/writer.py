"""TraceWriter: records a run's rounds from a background thread, in batches.

    config = decoder.run_config(prompt_ids, max_new_tokens)
    with TraceWriter(store, config, model_info={"target_hash": "..."}) as writer:
        gen = decoder.rounds(prompt_ids, max_new_tokens, config=config)
        result = writer.record(gen)          # or: writer.write(rnd) per round, writer.finish(result)

The run row is inserted (status 'running') before the constructor returns, so other readers
see the run at once. write() only puts the round on a queue; the thread encodes it
(top-N, compressed full vectors) and inserts every pending round in one transaction at
least every flush_interval seconds, together with a heartbeat and the run's aggregates. A
kill -9 therefore loses at most the rounds of the last flush interval, and the next
TraceStore opened on the file marks the run interrupted (see store.writer_is_dead).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping

from sqlalchemy import insert, select, update

from specscope.core.records import GenerationResult, Round, RunConfig

from .codec import VectorPolicy, round_to_rows
from .errors import RunExistsError, WriterError
from .info import ModelInfo, library_versions as collect_versions
from .schema import nodes_table, rounds_table, runs_table
from .store import HEARTBEAT_S, TraceStore, run_row, translate_errors

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
_live_lock = threading.Lock()
_live: "weakref.WeakSet[TraceWriter]" = weakref.WeakSet()


def live_writer_ids() -> frozenset[str]:
    """Run ids being written by TraceWriters of this process."""
    with _live_lock:
        return frozenset(w.run_id for w in _live if w._thread.is_alive())


@atexit.register
def _finish_forgotten_writers() -> None:
    with _live_lock:
        writers = list(_live)
    for w in writers:
        try:
            w.finish("interrupted", error="the process exited without finishing the run")
        except Exception:  # pragma: no cover - best effort at exit
            pass


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
    ):
        if not 0 < flush_interval <= 60:
            raise ValueError(f"flush_interval must be in (0, 60] seconds, got {flush_interval!r}")
        self.store = store
        self.config = config
        self.run_id = config.run_id
        self.policy = VectorPolicy.for_vocab(config.vocab_size, top_n, full_vectors, full_dtype)
        self.flush_interval = float(flush_interval)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._next_index = 0
        self._finished = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        # aggregates, owned by the thread
        self.rounds_written = 0
        self._drafted = 0
        self._accepted = 0
        self._tokens: list[int] = []
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
                conn.execute(insert(runs_table).values(**row))
        self._thread = threading.Thread(target=self._loop, name=f"TraceWriter-{self.run_id[:8]}", daemon=True)
        with _live_lock:
            _live.add(self)
        self._thread.start()

    # ------------------------------------------------------------------ producer side

    def write(self, rnd: Round) -> None:
        """Queue one round (never waits on the database)."""
        if self._finished:
            raise WriterError(f"run {self.run_id} is finished; no more rounds can be written")
        if self._error is not None:
            raise WriterError(f"the trace writer of run {self.run_id} failed: {self._error}") from self._error
        if rnd.run_id != self.run_id:
            raise ValueError(f"round of run {rnd.run_id!r} given to the writer of run {self.run_id!r}")
        if rnd.index != self._next_index:
            raise ValueError(f"round {rnd.index} written out of order: expected round {self._next_index}")
        self._next_index += 1
        self._queue.put(rnd)

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every round written so far is committed."""
        if self._finished or not self._thread.is_alive():
            self._raise_if_failed()
            return
        marker = _Flush()
        self._queue.put(marker)
        self._wake.set()
        while not marker.done.wait(0.05):
            if not self._thread.is_alive():
                break
            if timeout is not None:
                timeout -= 0.05
                if timeout <= 0:
                    raise WriterError(f"the trace writer of run {self.run_id} did not flush in time")
        self._raise_if_failed()

    def finish(self, outcome: GenerationResult | BaseException | str | None = None, *, error: str | None = None) -> None:
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
        self._queue.put(_Finish(values))
        self._wake.set()
        self._thread.join()
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

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriterError(f"the trace writer of run {self.run_id} failed: {self._error}") from self._error

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

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        # Sleep until woken (flush/finish) or until the flush interval has passed, then take
        # everything queued at once: one wake-up and one transaction per interval, so the
        # thread competes with the decoder for the GIL and the cores as little as possible.
        last_commit = time.monotonic()
        markers: list[_Flush] = []
        try:
            while True:
                self._wake.wait(timeout=self.flush_interval)
                self._wake.clear()
                rounds: list[dict] = []
                nodes: list[dict] = []
                tokens: list[int] = []
                drafted = accepted = 0
                markers: list[_Flush] = []
                final: _Finish | None = None
                while final is None:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, Round):
                        row, node_rows = round_to_rows(item, self.policy, self.run_id)
                        rounds.append(row)
                        nodes.extend(node_rows)
                        tokens.extend(e.token for e in item.emitted)
                        drafted += row["n_drafted"]
                        accepted += row["n_accepted"]
                    elif isinstance(item, _Flush):
                        markers.append(item)
                    elif isinstance(item, _Finish):
                        final = item
                if rounds or markers or final is not None or time.monotonic() - last_commit >= HEARTBEAT_S:
                    self._commit(rounds, nodes, tokens, drafted, accepted, final.values if final else None)
                    last_commit = time.monotonic()
                for marker in markers:
                    marker.done.set()
                if final is not None:
                    return
        except BaseException as exc:  # keep the error for the producer; mark the run failed
            self._error = exc
            log.exception("trace writer of run %s failed", self.run_id)
            try:
                with self.store.transaction() as conn:
                    conn.execute(update(runs_table).where(runs_table.c.run_id == self.run_id).values(
                        status="failed", error=f"trace writer failed: {type(exc).__name__}: {exc}",
                        ended_at=time.time(), heartbeat_at=time.time()))
            except Exception:
                pass
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

    def _commit(self, rounds: list[dict], nodes: list[dict], tokens: list[int], drafted: int, accepted: int,
                final: dict[str, Any] | None) -> None:
        now = time.time()
        self._tokens.extend(tokens)
        values: dict[str, Any] = {
            "heartbeat_at": now,
            "n_rounds": self.rounds_written + len(rounds),
            "drafted": self._drafted + drafted,
            "accepted": self._accepted + accepted,
            "new_tokens": list(self._tokens),
        }
        if final is not None:
            values.update(final)
            values["ended_at"] = now
            values.setdefault("wall_s", now - self.started_at)
        with translate_errors(f"writing run {self.run_id}"):
            with self.store.transaction() as conn:
                if rounds:
                    conn.execute(insert(rounds_table), rounds)
                if nodes:
                    conn.execute(insert(nodes_table), nodes)
                conn.execute(update(runs_table).where(runs_table.c.run_id == self.run_id).values(**values))
        self.rounds_written += len(rounds)
        self._drafted += drafted
        self._accepted += accepted
        self.flushes += 1


def record(store: TraceStore, decoder: Any, prompt_ids: Any, max_new_tokens: int = 32, *, run_id: str | None = None,
           **writer_kwargs: Any) -> GenerationResult:
    """Run `decoder` (a SpeculativeDecoder) on a prompt and store every round."""
    config = decoder.run_config(prompt_ids, max_new_tokens, run_id)
    with TraceWriter(store, config, **writer_kwargs) as writer:
        return writer.record(decoder.rounds(prompt_ids, max_new_tokens, config=config))
