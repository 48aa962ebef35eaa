"""Whether a run's writer is still alive: the writers of this process, other processes
through their pid (and /proc), other hosts through the run's heartbeat."""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from typing import Protocol

HEARTBEAT_S = 1.0  # a live writer touches runs.heartbeat_at at least this often
STALE_AFTER_S = 30.0  # a 'running' run without a heartbeat for this long is dead


class LiveWriter(Protocol):
    run_id: str

    @property
    def alive(self) -> bool: ...


_live_lock = threading.Lock()
_live: weakref.WeakSet[LiveWriter] = weakref.WeakSet()


def register_writer(writer: LiveWriter) -> None:
    """Count `writer` among this process's writers until unregister_writer()."""
    with _live_lock:
        _live.add(writer)


def unregister_writer(writer: LiveWriter) -> None:
    with _live_lock:
        _live.discard(writer)


def live_writers() -> list[LiveWriter]:
    """The registered writers of this process (finished or not)."""
    with _live_lock:
        return list(_live)


def live_writer_ids() -> frozenset[str]:
    """Run ids being written by TraceWriters of this process."""
    with _live_lock:
        return frozenset(w.run_id for w in _live if w.alive)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # e.g. Windows without that pid
        return False
    try:  # a zombie has exited: its writer thread is gone
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def writer_is_dead(
    run_id: str,
    host: str | None,
    pid: int | None,
    heartbeat_at: float | None,
    started_at: float,
    now: float | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> bool:
    """Whether a 'running' run's writer is gone.

    This process: dead unless one of its TraceWriters is writing that run. Same host, other
    pid: dead when the process no longer exists (or is a zombie), or when it exists but has
    not beaten for stale_after_s (pid reused, or a hung writer). Another host, or no pid:
    dead when the heartbeat is older than stale_after_s.
    """
    now = time.time() if now is None else now
    last = heartbeat_at if heartbeat_at is not None else started_at
    stale = now - last > stale_after_s
    if host == socket.gethostname() and pid is not None:
        if pid == os.getpid():
            return run_id not in live_writer_ids()
        return (not pid_alive(pid)) or stale
    return stale
