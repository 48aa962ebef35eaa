"""Where a TraceWriter's rounds are encoded and committed: two backends behind one interface.

  ThreadBackend    a thread of this process runs a RunSink on the store's engine.
  ProcessBackend   the writer process shared by this process's writers (storage.writer.process,
                   storage.writer.child) runs the RunSink; this side sends rounds and waits
                   for its answers.

A TraceWriter picks one when it starts and only talks to it through `Backend`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Engine

from specscope.core.records import Round
from specscope.storage.codec import VectorPolicy
from specscope.storage.errors import WriterError
from specscope.storage.liveness import HEARTBEAT_S
from specscope.storage.writer.process import START_TIMEOUT_S, writer_process
from specscope.storage.writer.sink import LockWait, RunSink, WaitReports

log = logging.getLogger(__name__)

# The thread commits every COMMIT_MARGIN of the flush interval or more often, so that the
# time the encoding and the commit take and wake-up delays under load stay inside it.
COMMIT_MARGIN = 0.8
COMMIT_SLACK_S = 0.005  # a wake-up this early still commits
RETRY_S = 0.2  # a commit the store's lock refused is tried again this soon (after the busy timeout it waited)
_tokens = itertools.count(1)


def commit_period(flush_interval: float, work_s: float) -> float:
    """Seconds between the writer thread's commits when encoding and committing a period's
    rounds took `work_s`: at most COMMIT_MARGIN of the interval, shorter when the work is
    long (full vectors under load), so that no round waits longer than the interval."""
    return max(0.25 * flush_interval, min(COMMIT_MARGIN * flush_interval, flush_interval - 2 * work_s - 0.02))


class Backend(Protocol):
    mode: str  # "thread" | "process"
    error: BaseException | None  # what made it stop storing rounds
    rounds_written: int  # committed so far (as last reported)
    flushes: int

    @property
    def alive(self) -> bool:
        """Whether rounds submitted now will still be stored."""

    def submit(self, rnd: Round) -> None:
        """Queue one round (never waits on the database)."""

    def flush(self, timeout: float | None) -> bool:
        """Wait until every submitted round is committed; False when it took too long."""

    def finish(self, values: dict[str, Any], timeout: float | None) -> None:
        """Commit what is left and close the run with `values` (status, stop_reason, error, wall_s)."""

    def give_up(self) -> None:
        """Stop waiting for a locked store: the run goes to its JSONL file (storage.writer.spill)."""

    @property
    def spilled_to(self) -> str | None:
        """The JSONL file the run went to when its store stayed locked; None otherwise."""

    @property
    def lock_state(self) -> LockWait | None:
        """The last wait for a locked store (None when it never waited)."""


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Finish:
    values: dict[str, Any]


class _BackendBase:
    mode = ""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.error: BaseException | None = None
        self.rounds_written = 0
        self.flushes = 0

    @property
    def alive(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def _wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait for `event` while whoever must set it is alive."""
        waited = 0.0
        while not event.wait(0.05):
            if not self.alive and not event.is_set():
                return self.error is not None or event.is_set()
            waited += 0.05
            if timeout is not None and waited >= timeout:
                return False
        return True


class ThreadBackend(_BackendBase):
    """Encodes and commits in a thread of this process."""

    mode = "thread"

    def __init__(self, sink: RunSink, flush_interval: float, on_wait: Callable[[LockWait], None] | None = None):
        super().__init__(sink.run_id)
        self._sink = sink
        self._reports = WaitReports(on_wait)
        if sink.spill is not None:  # the store was locked past the wait when the run started: said at once
            self._reports.after(sink, True)
        self._flush_interval = flush_interval
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"TraceWriter-{self.run_id[:8]}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, rnd: Round) -> None:
        self._queue.put(rnd)

    def flush(self, timeout: float | None) -> bool:
        marker = _Flush()
        self._queue.put(marker)
        self._wake.set()
        return self._wait(marker.done, timeout)

    def finish(self, values: dict[str, Any], timeout: float | None) -> None:
        self._queue.put(_Finish(values))
        self._wake.set()
        try:
            self._thread.join(timeout)
        except KeyboardInterrupt:  # interrupted while it waits for a locked store: the rounds go to a file now
            self.give_up()
            self._thread.join(30.0)
            raise

    def give_up(self) -> None:
        """Stop waiting for a locked store: the run goes to its JSONL file at the next try."""
        self._sink.give_up = True
        self._wake.set()

    @property
    def spilled_to(self) -> str | None:
        spill = self._sink.spill
        return str(spill.path) if spill is not None else None

    @property
    def lock_state(self) -> LockWait | None:
        sink = self._sink
        if sink.spill is None and sink.waiting_since is None and not sink.last_wait_s:
            return None  # it never waited
        return sink.lock_state(
            "spilled" if sink.spill is not None else "waiting" if sink.waiting_since is not None else "resumed"
        )

    def _take(self) -> tuple[list[Round], list[_Flush], _Finish | None]:
        """What is queued, up to a finish."""
        batch: list[Round] = []
        markers: list[_Flush] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, markers, None
            if isinstance(item, Round):
                batch.append(item)
            elif isinstance(item, _Flush):
                markers.append(item)
            elif isinstance(item, _Finish):
                return batch, markers, item

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
        final: _Finish | None = None
        commit_every = commit_period(self._flush_interval, 0.0)
        next_due = time.monotonic() + commit_every
        sink = self._sink
        try:
            while True:
                self._wake.wait(timeout=max(0.0, next_due - time.monotonic()))
                self._wake.clear()
                batch, new_markers, new_final = self._take()
                markers += new_markers
                final = final or new_final
                started = time.monotonic()
                if batch:
                    sink.add(batch)
                now = time.monotonic()
                since_commit = now - sink.last_commit
                if (
                    markers
                    or final is not None
                    or since_commit >= HEARTBEAT_S
                    or sink.waiting_since is not None
                    or (sink.pending and since_commit >= commit_every - COMMIT_SLACK_S)
                ):
                    stored = sink.commit((), final.values if final else None)
                    self._reports.after(sink, stored)
                    if not stored:  # the store is locked: the rounds wait in memory; try again soon
                        next_due = time.monotonic() + min(commit_every, RETRY_S)
                        continue
                    self.rounds_written, self.flushes = sink.rounds_written, sink.flushes
                    # A round written just after this wake-up waits a period plus the next
                    # encode and commit, which take about as long as these did.
                    commit_every = commit_period(self._flush_interval, time.monotonic() - started)
                # pending rounds are due a period after the last commit; otherwise wake a
                # period from now
                next_due = sink.last_commit + commit_every if sink.pending else now + commit_every
                for marker in markers:
                    marker.done.set()
                markers = []
                if final is not None:
                    return
        except BaseException as exc:  # keep the error for the producer; mark the run failed
            # The producer's next write(), flush() or finish() raises it (a WriterError with
            # this message): no traceback here, whose chain (sqlite3, SQLAlchemy, the store's
            # error) told a user of a full disk the same thing three times. -v shows it.
            self.error = exc
            log.info("trace writer of run %s failed", self.run_id, exc_info=True)
            sink.mark("failed", f"trace writer failed: {type(exc).__name__}: {exc}")
            self._release(markers)

    def _release(self, markers: list[_Flush]) -> None:
        """Set every flush marker, queued or taken, so that nobody waits on a dead thread."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Flush):
                item.done.set()
        for marker in markers:
            marker.done.set()


class ProcessBackend(_BackendBase):
    """Sends rounds to this process's writer process, which encodes and commits them.
    Raises WriterError when the writer process cannot be started."""

    mode = "process"

    def __init__(
        self,
        url: str,
        engine: Engine,
        run_id: str,
        policy: VectorPolicy,
        started_at: float,
        flush_interval: float,
        on_wait: Callable[[LockWait], None] | None = None,
    ):
        super().__init__(run_id)
        self._on_wait = WaitReports(on_wait)
        self._lock_state: LockWait | None = None
        self._engine = engine
        self._policy = policy
        self._started_at = started_at
        self._flushes_waiting: dict[int, _Flush] = {}
        self._closed = threading.Event()
        self._opened = threading.Event()
        self.service = writer_process()
        self.service.register(run_id, self._on_message)
        self.service.send(
            ("open", run_id, url, (policy.top_n, policy.full, policy.full_dtype), started_at, flush_interval)
        )
        # Wait until the writer process holds the run (its database driver imported and a
        # connection made: seconds on a loaded machine at its lower priority), so that the
        # flush-interval promise starts from the first round written and an open error is
        # raised here, not later.
        if not self._wait(self._opened, START_TIMEOUT_S) or self.error is not None:
            self.service.unregister(run_id)
            if self.service.alive:  # it may still open the run later: it must not write it
                self.service.send(("abandon", run_id, url))
            reason = self.error or f"no answer within {START_TIMEOUT_S:.0f} s"
            raise WriterError(f"the trace writer process could not open run {run_id}: {reason}")

    @property
    def alive(self) -> bool:
        return not self._closed.is_set() and self.service.alive

    def submit(self, rnd: Round) -> None:
        self.service.send(("rounds", self.run_id, [rnd]))

    def flush(self, timeout: float | None) -> bool:
        marker = _Flush()
        token = next(_tokens)
        self._flushes_waiting[token] = marker
        self.service.send(("flush", self.run_id, token))
        return self._wait(marker.done, timeout)

    def finish(self, values: dict[str, Any], timeout: float | None) -> None:
        try:
            self.service.send(("finish", self.run_id, values))
        except WriterError as exc:  # the writer process has gone: _on_message("died") closed us
            self._fail(exc)
        try:
            closed = self._wait(self._closed, timeout)
        except KeyboardInterrupt:  # interrupted while it waits for a locked store: the rounds go to a file now
            self.give_up()
            self._wait(self._closed, 30.0)
            raise
        if not closed:
            raise WriterError(f"the trace writer of run {self.run_id} did not finish in time")
        self.service.unregister(self.run_id)

    def give_up(self) -> None:
        """Stop waiting for a locked store: the run goes to its JSONL file at the next try."""
        try:
            self.service.send(("give_up", self.run_id))
        except WriterError:
            pass

    @property
    def spilled_to(self) -> str | None:
        return self._lock_state.path if self._lock_state is not None else None

    @property
    def lock_state(self) -> LockWait | None:
        return self._lock_state

    def _on_message(self, m: tuple[Any, ...]) -> None:
        """Called on the receiving thread with each answer of the writer process."""
        kind = m[0]
        if kind == "lock":
            self._lock_state = LockWait(**m[2])
            self._on_wait.tell(self._lock_state)
        elif kind == "opened":
            self._opened.set()
        elif kind == "committed":
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
            if self._opened.is_set():  # before that, the writer falls back to a thread
                RunSink(self._engine, self.run_id, self._policy, self._started_at).mark(
                    "failed", f"trace writer process stopped: {m[2]}"
                )
            self._closed.set()
        if kind in ("error", "died", "finished"):
            self._opened.set()
            for marker in list(self._flushes_waiting.values()):
                marker.done.set()
