"""Opening a database: locations and URLs, the SQLite file checks, pragmas and engines."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from specscope.storage.errors import (
    CorruptStoreError,
    NewerStoreError,
    NotATraceStoreError,
    SchemaVersionError,
    TraceStoreError,
)
from specscope.storage.migrations import MIGRATIONS, Migration, check_version
from specscope.storage.outputs import SQLITE_MAGIC
from specscope.storage.paths import default_db_location
from specscope.storage.transactions import busy_timeout_ms, is_corruption

# scheme://...: an explicit URL; anything else is a path (a one-letter scheme is a Windows drive)
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+://")


def is_url(location: str) -> bool:
    """True for an explicit database URL (sqlite:///..., postgresql+psycopg://...); a plain
    path is never parsed as one, whatever characters it holds."""
    return bool(_URL_SCHEME.match(location))


def to_url(location: str | os.PathLike[str] | None) -> str:
    """A path (or None for the default location) -> an SQLAlchemy URL; URLs pass through.

    A path names exactly that file: its characters are percent-quoted into the URL, so `?`,
    `#` or `%41` in a file name stay part of the name (SQLAlchemy unquotes the database part)."""
    if location is None:
        location = default_db_location()
    location = os.fspath(location)
    if not location:
        raise TraceStoreError("the trace store location is empty: give a file path or a database URL")
    if is_url(location):
        return location
    return "sqlite:///" + quote(str(Path(location).expanduser().resolve()), safe="/\\:")


def is_memory(url: str) -> bool:
    """An SQLite URL that keeps nothing (sqlite://, :memory:, mode=memory)."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return False
    db = u.database or ""
    return u.get_backend_name() == "sqlite" and (
        not db or db == ":memory:" or "mode=memory" in db or u.query.get("mode") == "memory"
    )


def check_store_location(location: str | os.PathLike[str] | None) -> None:
    """Refuse a location a command cannot keep runs in or read them from: an empty one or an
    in-memory SQLite URL (TraceStoreError, one line)."""
    url = to_url(location)
    if is_memory(url):
        raise TraceStoreError(
            f"{printable(url)} is an in-memory database: nothing would be kept and there is "
            f"nothing to read; give a file path (e.g. traces.sqlite) or a server URL"
        )


def readonly_uri(path: str, immutable: bool = False) -> str:
    """SQLite's URI for opening `path` read-only (mode=ro), its characters quoted."""
    return f"file:{quote(path, safe='/')}?mode=ro" + ("&immutable=1" if immutable else "")


def sqlite_path(url: str) -> str | None:
    """The file of an SQLite URL; None for in-memory or non-SQLite URLs."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: e.g. a port that is not a number
        raise TraceStoreError(
            f"not a database path or SQLAlchemy URL: {mask_passwords(url)!r} ({mask_passwords(str(exc))})"
        ) from None
    if u.get_backend_name() != "sqlite":
        return None
    if is_memory(url):
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


def connect_readonly(path: str) -> sqlite3.Connection:
    """`path` opened read-only: nothing in or beside the file is created or changed.

    A store in WAL mode with no write-ahead log beside it (no writer has it open, none died
    mid-write) is read as immutable: opening it mode=ro would leave new -wal and -shm files
    behind, and a folder the reader may not write would refuse them. With a log present it
    is opened mode=ro (a live writer's rounds are seen); a log that a reader without write
    access cannot replay is a TraceStoreError that says so."""
    wal = Path(path + "-wal")
    immutable = not wal.exists() and _wal_mode(path)
    try:
        return _probe(
            sqlite3.connect(
                readonly_uri(path, immutable=immutable),
                uri=True,
                timeout=busy_timeout_ms() / 1000,
                check_same_thread=False,
            )
        )
    except sqlite3.OperationalError as exc:
        if immutable or ("unable to open" not in str(exc) and "readonly" not in str(exc)):
            raise
        raise TraceStoreError(
            f"{path}: the write-ahead log {wal.name} left beside it cannot be replayed without write access to "
            f"{Path(path).parent} ({exc}); copy the store with its -wal file to a writable folder, or open it "
            f"once as a user who can write there"
        ) from None


def _wal_mode(path: str) -> bool:
    """The database header says WAL (bytes 18 and 19 are 2)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[18] == 2 and head[19] == 2


def _probe(con: sqlite3.Connection) -> sqlite3.Connection:
    """SQLite opens lazily: the first read is where a WAL store's -shm is needed."""
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        con.close()
        raise
    return con


def precheck_sqlite_file(path: str, migrations: Sequence[Migration] = MIGRATIONS, reader: bool = False) -> None:
    """Reject a non-SQLite file, a foreign SQLite database, a corrupt file or (for a writer) a
    newer schema before anything touches it (no pragmas, no writes); for a reader, also an
    SQLite database without tables (a writer would turn it into a store)."""
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
        con = connect_readonly(str(p))
    except sqlite3.Error as exc:
        if is_corruption(exc):
            raise CorruptStoreError(f"{path}: the database is corrupt ({exc})") from exc
        raise TraceStoreError(f"cannot open {path}: {exc}") from exc
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and reader:
            raise NotATraceStoreError(f"{path} is an SQLite database without tables, not a trace store")
        if not tables:
            return
        if "schema_version" not in tables:
            shown = ", ".join(sorted(tables)[:8])
            raise NotATraceStoreError(f"{path} is an SQLite database but not a specscope trace store (tables: {shown})")
        version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is None or not isinstance(version, int):
            raise SchemaVersionError(f"{path}: the schema_version table is empty or unreadable: unknown schema")
        try:
            check_version(version, migrations, reader=reader)
        except NewerStoreError as exc:
            raise NewerStoreError(f"{path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            raise CorruptStoreError(f"{path}: the database is corrupt ({exc})") from exc
        raise TraceStoreError(f"{path}: {exc}") from exc
    finally:
        con.close()


def _on_connect(*pragmas: str) -> Callable[[Any, Any], None]:
    """A connect listener that runs the busy timeout and `pragmas` on each new SQLite connection."""

    def listener(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would not BEGIN before DDL or SELECT; take it
        # over (the SQLAlchemy recipe) so migrations are atomic and reads see one snapshot.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            for pragma in (f"busy_timeout = {busy_timeout_ms()}", *pragmas):
                cur.execute(f"PRAGMA {pragma}")
        finally:
            cur.close()

    return listener


_sqlite_pragmas = _on_connect("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = ON")
_sqlite_pragmas_readonly = _on_connect("query_only = ON")


def _sqlite_begin(conn: Any) -> None:
    # Writers take the write lock up front (waiting out busy_timeout) instead of failing
    # when a read transaction cannot be upgraded.
    immediate = conn.get_execution_options().get("sqlite_immediate", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, echo: bool = False, readonly_path: str | None = None) -> Engine:
    if is_sqlite(url):
        kwargs: dict[str, Any] = {"connect_args": {"timeout": busy_timeout_ms() / 1000, "check_same_thread": False}}
        if readonly_path is not None:
            kwargs["creator"] = lambda: connect_readonly(readonly_path)
        elif sqlite_path(url) is None:  # in-memory: one shared connection for every thread
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, echo=echo, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly_path is not None else _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    with _driver_errors(url):
        return create_engine(url, echo=echo, pool_pre_ping=True)


def memory_copy(path: str) -> Engine:
    """An in-memory database holding a copy of the SQLite file at `path` (read read-only):
    where a reader migrates an older store without changing the file."""
    engine = make_engine("sqlite://")
    source = connect_readonly(path)
    try:
        with engine.connect() as conn:
            source.backup(cast(sqlite3.Connection, conn.connection.driver_connection))  # a sqlite:// engine
    finally:
        source.close()
    return engine


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
        raise TraceStoreError(
            f"cannot open {printable(url)}: SQLAlchemy knows no database {make_url(url).drivername!r} "
            f"({mask_passwords(str(exc))})"
        ) from None
    except ImportError as exc:  # the dialect's driver (DBAPI module) is not installed
        raise TraceStoreError(
            f"cannot open {printable(url)}: the database driver for {make_url(url).drivername!r} is not installed "
            f"({mask_passwords(str(exc))}); install it in this Python environment or use another URL"
        ) from None
    except ArgumentError as exc:
        raise TraceStoreError(f"cannot open {printable(url)}: {mask_passwords(str(exc))}") from None
