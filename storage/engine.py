"""Opening a database: locations and URLs, the SQLite file checks, pragmas and engines."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from specscope.storage.errors import CorruptStoreError, NotATraceStoreError, SchemaVersionError, TraceStoreError
from specscope.storage.migrations import MIGRATIONS, Migration, check_version
from specscope.storage.paths import default_db_location
from specscope.storage.transactions import is_corruption

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 10_000


def to_url(location: str | os.PathLike | None) -> str:
    """A path (or None for the default location) -> an SQLAlchemy URL; URLs pass through."""
    if location is None:
        location = default_db_location()
    location = os.fspath(location)
    if "://" in location:
        return location
    return "sqlite:///" + str(Path(location).expanduser().resolve())


def sqlite_path(url: str) -> str | None:
    """The file of an SQLite URL; None for in-memory or non-SQLite URLs."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: e.g. a port that is not a number
        raise TraceStoreError(f"not a database path or SQLAlchemy URL: {mask_passwords(url)!r} "
                              f"({mask_passwords(str(exc))})") from None
    if u.get_backend_name() != "sqlite":
        return None
    db = u.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


# scheme://user:PASSWORD@host...: the password runs to the last "@" of the URL
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*:)[^\s'\"]*@")


def mask_passwords(text: str) -> str:
    """`text` with the password of every URL in it replaced by *** (as SQLAlchemy's
    URL.render_as_string(hide_password=True) shows it)."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def printable(url: str) -> str:
    """The URL with its password hidden (also for a string SQLAlchemy cannot parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return mask_passwords(url)


def precheck_sqlite_file(path: str, migrations: Sequence[Migration] = MIGRATIONS) -> None:
    """Reject a non-SQLite file, a foreign SQLite database, a newer schema or a corrupt file
    before anything touches it (no pragmas, no writes)."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return
    if p.is_dir():
        raise NotATraceStoreError(f"{path} is a directory, not a trace store file")
    with open(p, "rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise NotATraceStoreError(f"{path} is not an SQLite database (it does not start with the SQLite header)")
    try:
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise TraceStoreError(f"cannot open {path}: {exc}") from exc
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return
        if "schema_version" not in tables:
            shown = ", ".join(sorted(tables)[:8])
            raise NotATraceStoreError(f"{path} is an SQLite database but not a specscope trace store (tables: {shown})")
        version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is None or not isinstance(version, int):
            raise SchemaVersionError(f"{path}: the schema_version table is empty or unreadable: unknown schema")
        check_version(version, migrations)
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            raise CorruptStoreError(f"{path}: the database is corrupt ({exc})") from exc
        raise TraceStoreError(f"{path}: {exc}") from exc
    finally:
        con.close()


def _on_connect(*pragmas: str) -> Callable[[Any, Any], None]:
    """A connect listener that runs `pragmas` on each new SQLite connection."""

    def listener(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would not BEGIN before DDL or SELECT; take it
        # over (the SQLAlchemy recipe) so migrations are atomic and reads see one snapshot.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cur.execute(f"PRAGMA {pragma}")
        finally:
            cur.close()

    return listener


_sqlite_pragmas = _on_connect(f"busy_timeout = {BUSY_TIMEOUT_MS}", "journal_mode = WAL", "synchronous = NORMAL",
                              "foreign_keys = ON")
_sqlite_pragmas_readonly = _on_connect(f"busy_timeout = {BUSY_TIMEOUT_MS}", "query_only = ON")


def _sqlite_begin(conn: Any) -> None:
    # Writers take the write lock up front (waiting out busy_timeout) instead of failing
    # when a read transaction cannot be upgraded.
    immediate = conn.get_execution_options().get("sqlite_immediate", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, echo: bool = False, readonly_path: str | None = None) -> Engine:
    if is_sqlite(url):
        kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}}
        if readonly_path is not None:
            kwargs["creator"] = lambda: sqlite3.connect(
                f"file:{readonly_path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        elif sqlite_path(url) is None:  # in-memory: one shared connection for every thread
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, echo=echo, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly_path is not None else _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    with _driver_errors(url):
        return create_engine(url, echo=echo, pool_pre_ping=True)


def check_driver(url: str) -> None:
    """Raise TraceStoreError (one line, no password) when the URL is unparsable or its
    dialect or driver is not installed; connects to nothing."""
    sqlite_path(url)  # parses the URL
    with _driver_errors(url):
        make_url(url).get_dialect().import_dbapi()


@contextlib.contextmanager
def _driver_errors(url: str) -> Iterator[None]:
    try:
        yield
    except NoSuchModuleError as exc:  # no such dialect (or its plugin is not installed)
        raise TraceStoreError(f"cannot open {printable(url)}: SQLAlchemy knows no database {make_url(url).drivername!r} "
                              f"({mask_passwords(str(exc))})") from None
    except ImportError as exc:  # the dialect's driver (DBAPI module) is not installed
        raise TraceStoreError(
            f"cannot open {printable(url)}: the database driver for {make_url(url).drivername!r} is not installed "
            f"({mask_passwords(str(exc))}); install it in this Python environment or use another URL") from None
    except ArgumentError as exc:
        raise TraceStoreError(f"cannot open {printable(url)}: {mask_passwords(str(exc))}") from None
