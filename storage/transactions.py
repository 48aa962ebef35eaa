"""Database errors as TraceStoreErrors, and write transactions."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DatabaseError

from specscope.storage.errors import CorruptStoreError, TraceStoreError

BUSY_TIMEOUT_MS = 10_000
BUSY_TIMEOUT_ENV = "SPECSCOPE_BUSY_TIMEOUT_S"  # overrides it (seconds): how long one statement waits for a lock


def busy_timeout_ms() -> int:
    """SQLite's busy timeout for every connection: $SPECSCOPE_BUSY_TIMEOUT_S seconds, else
    BUSY_TIMEOUT_MS (a value that is not a number >= 0 is a TraceStoreError)."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return BUSY_TIMEOUT_MS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise TraceStoreError(f"{BUSY_TIMEOUT_ENV} must be a number of seconds from 0 to 86400, got {text!r}")
    return int(value * 1000)


def is_corruption(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(s in msg for s in ("malformed", "not a database", "corrupt", "file is encrypted"))


def is_busy(exc: BaseException) -> bool:
    """Another connection holds the lock this one waited for past its busy timeout (SQLite's
    SQLITE_BUSY and SQLITE_LOCKED); the error of a translated one too (its cause)."""
    while exc is not None:
        msg = str(getattr(exc, "orig", None) or exc).lower()
        if "database is locked" in msg or "database is busy" in msg or "database table is locked" in msg:
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def _orig(exc: BaseException) -> str:
    return str(getattr(exc, "orig", None) or exc).strip()


@contextlib.contextmanager
def translate_errors(where: str) -> Iterator[None]:
    """Turn SQLite corruption into CorruptStoreError; other DB errors into TraceStoreError."""
    try:
        yield
    except TraceStoreError:
        raise
    except (DatabaseError, sqlite3.DatabaseError) as exc:
        if is_corruption(exc):
            raise CorruptStoreError(f"{where}: the database is corrupt ({_orig(exc)})") from exc
        raise TraceStoreError(f"{where}: {_orig(exc)}") from exc


@contextlib.contextmanager
def transaction(engine: Engine, wait_ms: int | None = None) -> Iterator[Any]:
    """A write transaction on `engine` (BEGIN IMMEDIATE on SQLite): commit on success, else roll
    back. wait_ms: on SQLite, how long this one waits for another connection's lock
    (the engine's own timeout is restored after)."""
    with engine.connect() as conn:
        sqlite = wait_ms is not None and engine.dialect.name == "sqlite"
        raw = conn.connection.driver_connection if sqlite else None  # no SQLAlchemy autobegin for a pragma
        if raw is not None and wait_ms is not None:  # raw is set only where wait_ms is
            raw.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
        try:
            conn.execution_options(sqlite_immediate=True)
            with conn.begin():
                yield conn
        finally:
            if raw is not None:
                raw.execute(f"PRAGMA busy_timeout = {busy_timeout_ms()}")
