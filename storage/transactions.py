"""Database errors as TraceStoreErrors, and write transactions."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Iterator

from sqlalchemy import Engine
from sqlalchemy.exc import DatabaseError

from specscope.storage.errors import CorruptStoreError, TraceStoreError


def is_corruption(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(s in msg for s in ("malformed", "not a database", "corrupt", "file is encrypted"))


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
def transaction(engine: Engine) -> Iterator[Any]:
    """A write transaction on `engine` (BEGIN IMMEDIATE on SQLite): commit on success, else roll back."""
    with engine.connect() as conn:
        conn.execution_options(sqlite_immediate=True)
        with conn.begin():
            yield conn
