"""The writer process: commits the rounds that the TraceWriters of one recording process send.

Started by storage.writer.process as `python -m specscope.storage.writer.child`; it imports
neither torch nor Qt. stdin carries frames (storage.writer.frames) of messages:

    ("open", run_id, url, (top_n, full, full_dtype), started_at, flush_interval)
    ("rounds", run_id, [Round, ...])
    ("flush", run_id, token)
    ("finish", run_id, {status, stop_reason, error, wall_s})
    ("abandon", run_id, url)       drop the run unwritten (its recorder no longer waits for it)
    ("give_up", run_id)            stop waiting for a locked store: write the run to its JSONL file

and stdout answers with ("ready", pid), ("opened", run_id), ("committed", run_id, rounds_written, flushes),
("flushed", run_id, token), ("finished", run_id, error | None), ("error", run_id, message) and
("lock", run_id, LockWait as a dict) while a locked store keeps the rounds waiting (sink.WaitReports).

Rounds are encoded as they arrive and committed at least every EAGER_COMMIT_S (and every
flush interval) while they arrive; a run's heartbeat is touched at least every HEARTBEAT_S.
The process runs at a lower priority (NICENESS), so that on a machine whose cores the
decoder keeps busy it works in the decoder's gaps rather than slowing it down. End of stdin means the recording
process has gone (or closed the service): what was received is committed, and runs that
were never finished are marked interrupted.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from specscope.storage.codec import VectorPolicy
from specscope.storage.engine import make_engine
from specscope.storage.liveness import HEARTBEAT_S
from specscope.storage.writer.frames import read_frame, write_frame
from specscope.storage.writer.sink import RunSink, WaitReports

# Commit at least this often while rounds arrive (and at least every flush interval): small
# transactions keep what a flush or finish has to insert, after decoding ended, small.
EAGER_COMMIT_S = 0.1
IDLE_ENGINES = 4  # engines of finished runs kept open for the next run on the same database
NICENESS = 10  # the writer yields the cores to the decoding process when both want them


@dataclass
class _Run:
    sink: RunSink
    url: str
    flush_interval: float
    tokens: list[Any] = field(default_factory=list)  # flush tokens to acknowledge after the next commit
    final: dict[str, Any] | None = None
    error: str | None = None
    reports: WaitReports = field(default_factory=lambda: WaitReports(None))


class _Engines:
    """One engine per database URL; a few idle ones stay open for the next run."""

    def __init__(self) -> None:
        self._engines: dict[str, list[Any]] = {}  # url -> [engine, runs using it, last release]

    def acquire(self, url: str) -> Engine:
        entry = self._engines.get(url)
        if entry is None:
            entry = self._engines[url] = [make_engine(url), 0, 0.0]
        entry[1] += 1
        engine: Engine = entry[0]
        return engine

    def release(self, url: str) -> None:
        entry = self._engines[url]
        entry[1] -= 1
        entry[2] = time.monotonic()
        idle = sorted((e[2], u) for u, e in self._engines.items() if e[1] == 0)
        for _, old in idle[: max(0, len(idle) - IDLE_ENGINES)]:
            self._engines.pop(old)[0].dispose()


def serve(stdin: Any, stdout: Any, parent_pid: int | None = None) -> None:
    _Server(stdout, parent_pid).run(stdin)


class _Server:
    """The writer process's loop: messages in, commits when due, answers out."""

    def __init__(self, stdout: Any, parent_pid: int | None):
        self.stdout = stdout
        self.parent_pid = parent_pid
        self.inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.wake = threading.Event()
        self.engines = _Engines()
        self.runs: dict[str, _Run] = {}
        self.eof = False

    def run(self, stdin: Any) -> None:
        threading.Thread(target=self._read_loop, args=(stdin,), name="frames-in", daemon=True).start()
        write_frame(self.stdout, [("ready", os.getpid())])
        while not (self.eof and not self.runs):
            self.wake.wait(min([r.flush_interval for r in self.runs.values()] + [HEARTBEAT_S]))
            self.wake.clear()
            replies: list[tuple[Any, ...]] = []
            while True:
                try:
                    m = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._receive(m, replies)
            for run_id, run in list(self.runs.items()):
                self._commit_if_due(run_id, run, replies)
            if replies:
                try:
                    write_frame(self.stdout, replies)
                except (BrokenPipeError, OSError):  # nobody listens any more; keep committing
                    pass

    def _read_loop(self, stdin: Any) -> None:
        try:
            while (messages := read_frame(stdin)) is not None:
                for m in messages:
                    self.inbox.put(m)
                self.wake.set()
        except Exception as exc:  # noqa: BLE001 - a torn frame (the parent died mid-write) fails in many ways; eof follows
            print(f"specscope writer process: {type(exc).__name__}: {exc}", file=sys.stderr)
        self.inbox.put(("eof",))
        self.wake.set()

    def _receive(self, m: tuple[Any, ...], replies: list[tuple[Any, ...]]) -> None:
        kind = m[0]
        if kind == "eof":
            self.eof = True
        elif kind == "open":
            _, run_id, url, (top_n, full, full_dtype), started_at, flush_interval = m
            try:
                engine = self.engines.acquire(url)
            except Exception as exc:  # noqa: BLE001 - any failure is sent to the recording process as the run's error
                replies.append(("error", run_id, f"{type(exc).__name__}: {exc}"))
                return
            try:  # connect now (driver, pool, dialect): the first commit is then as quick as the rest
                engine.connect().close()
                sink = RunSink(engine, run_id, VectorPolicy(top_n, full, full_dtype), started_at)
            except Exception as exc:  # noqa: BLE001 - any failure is sent to the recording process as the run's error
                self.engines.release(url)
                replies.append(("error", run_id, f"{type(exc).__name__}: {exc}"))
                return
            self.runs[run_id] = _Run(sink, url, flush_interval)
            replies.append(("opened", run_id))
        elif kind == "abandon":  # the recording process gave up waiting and records from a thread
            if self.runs.pop(m[1], None) is not None:
                self.engines.release(url=m[2])
        elif m[1] in self.runs:
            run = self.runs[m[1]]
            if kind == "give_up":
                run.sink.give_up = True
            elif kind == "rounds":
                if run.error is None:
                    try:  # encode on arrival: a flush or finish then only inserts
                        run.sink.add(m[2])
                    except Exception as exc:  # noqa: BLE001 - any failure fails this run only; the process serves the others
                        self._failed(m[1], run, exc, replies)
            elif kind == "flush":
                run.tokens.append(m[2])
            elif kind == "finish":
                run.final = m[2]
        elif kind == "flush":  # a run that failed to open: answer, so that nobody waits
            replies.append(("flushed", m[1], m[2]))
        elif kind == "finish":
            replies.append(("finished", m[1], "the run was never opened by the writer process"))

    def _commit_if_due(self, run_id: str, run: _Run, replies: list[tuple[Any, ...]]) -> None:
        if self.eof and run.final is None:
            who = f"the recording process (pid {self.parent_pid})" if self.parent_pid else "the recording process"
            run.final = {
                "status": "interrupted",
                "stop_reason": None,
                "error": f"{who} ended without finishing the run; the writer process stored every round it "
                "had received",
            }
        since = time.monotonic() - run.sink.last_commit
        due = (
            run.tokens
            or run.final is not None
            or since >= HEARTBEAT_S
            or (run.sink.pending and since >= min(run.flush_interval, EAGER_COMMIT_S))
        )
        if not due:
            return
        if run.error is None:
            run.reports.on_wait = lambda state: replies.append(("lock", run_id, dataclasses.asdict(state)))
            try:
                stored = run.sink.commit(final=run.final)
                run.reports.after(run.sink, stored)
                if not stored:  # the store is locked: keep the rounds, the flushes and the finish; try again
                    return
                replies.append(("committed", run_id, run.sink.rounds_written, run.sink.flushes))
            except Exception as exc:  # noqa: BLE001 - any failure fails this run only; the process serves the others
                self._failed(run_id, run, exc, replies)
        replies.extend(("flushed", run_id, token) for token in run.tokens)
        run.tokens = []
        if run.final is not None:
            replies.append(("finished", run_id, run.error))
            del self.runs[run_id]
            self.engines.release(run.url)

    @staticmethod
    def _failed(run_id: str, run: _Run, exc: Exception, replies: list[tuple[Any, ...]]) -> None:
        run.error = f"{type(exc).__name__}: {exc}"
        run.sink.mark("failed", f"trace writer failed: {run.error}")
        replies.append(("error", run_id, run.error))


def main() -> None:
    try:
        os.nice(NICENESS)
    except (AttributeError, OSError):  # not on this platform
        pass
    # Ctrl-C in a terminal reaches the whole process group, this process too: the recording
    # process handles it (it finishes its runs as cancelled through this process), so a
    # KeyboardInterrupt here would only lose their last rounds and print a traceback. The
    # end of stdin still ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the frames
    parent = os.getppid() if hasattr(os, "getppid") else None
    serve(sys.stdin.buffer, stdout, parent)


if __name__ == "__main__":
    main()
