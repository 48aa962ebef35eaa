"""The recording process's side of the writer process (see writer_child).

One child per recording process serves all its TraceWriters (any number of runs and
databases), so a run does not pay the child's start-up (about half a second of imports)
after the first. Two daemon threads talk to it: a sender that pickles queued messages and
writes them to the child's stdin (the GIL is held only while pickling; the vectors go out
of band), and a receiver that dispatches the child's answers to the writers.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, cast

from specscope.storage.errors import WriterError
from specscope.storage.writer.frames import read_frame, write_frame

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # imports on a loaded machine can take a while
_CLOSE = object()


class WriterProcess:
    """A running writer child and the two threads that talk to it."""

    def __init__(self, start_timeout: float = START_TIMEOUT_S):
        self.owner_pid = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specscope.storage.writer.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        _widen_pipe(self.proc.stdin)
        self._handlers: dict[str, Callable[[tuple[Any, ...]], None]] = {}
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready = threading.Event()
        self.dead_reason: str | None = None
        self._receiver = threading.Thread(target=self._receive, name="specscope-writer-in", daemon=True)
        self._receiver.start()
        if not self._ready.wait(start_timeout) or self.dead_reason is not None:
            reason = self.dead_reason or f"no answer within {start_timeout:.0f} s"
            self._kill()
            raise WriterError(f"the trace writer process did not start: {reason}")
        self._sender = threading.Thread(target=self._send, name="specscope-writer-out", daemon=True)
        self._sender.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.owner_pid == os.getpid()

    def register(self, run_id: str, handler: Callable[[tuple[Any, ...]], None]) -> None:
        with self._lock:
            self._handlers[run_id] = handler

    def unregister(self, run_id: str) -> None:
        with self._lock:
            self._handlers.pop(run_id, None)

    def send(self, message: tuple[Any, ...]) -> None:
        if self.dead_reason is not None:
            raise WriterError(f"the trace writer process has stopped: {self.dead_reason}")
        self._outbox.put(message)

    def close(self, timeout: float = 60.0) -> None:
        """End the child's input; it commits what it has and exits."""
        if self.dead_reason is None and self.owner_pid == os.getpid():
            self._outbox.put(_CLOSE)
            self._sender.join(timeout)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()

    # ------------------------------------------------------------------ threads

    def _send(self) -> None:
        stdin = cast(IO[bytes], self.proc.stdin)  # Popen(stdin=PIPE): never None
        try:
            while True:
                item = self._outbox.get()
                batch = []
                while item is not _CLOSE:
                    batch.append(item)
                    try:
                        item = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    write_frame(stdin, batch)
                if item is _CLOSE:
                    stdin.close()
                    return
        except (BrokenPipeError, OSError, ValueError) as exc:
            self._died(f"its input pipe broke ({type(exc).__name__})")

    def _receive(self) -> None:
        try:
            stdout = cast(io.BufferedReader, self.proc.stdout)  # Popen(stdout=PIPE), buffered: never None
            while (messages := read_frame(stdout)) is not None:
                for m in messages:
                    if m[0] == "ready":
                        self._ready.set()
                        continue
                    with self._lock:
                        handler = self._handlers.get(m[1])
                    if handler is not None:
                        handler(m)
        except Exception as exc:
            log.exception("reading the trace writer process failed")
            self._died(f"{type(exc).__name__}: {exc}")
            return
        code = self.proc.wait()
        self._died(f"it exited with code {code}" if code else "it exited")

    def _died(self, reason: str) -> None:
        with self._lock:
            if self.dead_reason is None:
                self.dead_reason = reason
            handlers = list(self._handlers.values())
            self._handlers.clear()
        self._ready.set()
        for handler in handlers:
            handler(("died", None, self.dead_reason))

    def _kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - already gone
            pass


def _widen_pipe(stream: Any) -> None:
    """A 1 MiB pipe (Linux) so the sender rarely waits for the writer process to read."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass


_service: WriterProcess | None = None
_service_lock = threading.Lock()


def writer_process() -> WriterProcess:
    """This process's writer child, started (or restarted) on demand."""
    global _service
    with _service_lock:
        if _service is None or not _service.alive:
            _service = WriterProcess()
        return _service


def close_writer_process() -> None:
    global _service
    with _service_lock:
        service, _service = _service, None
    if service is not None and service.owner_pid == os.getpid():
        service.close()
