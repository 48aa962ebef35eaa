"""TraceStore: opening (with checks, pragmas and migrations), recovery of dead runs, and
the read API."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from sqlalchemy import Engine, create_engine, delete, event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError
from sqlalchemy.pool import StaticPool

from specscope.core.records import Round, RoundTimings, RunConfig
from specscope.core.sampling import SamplingConfig

from .codec import _cache, emitted_tokens, rows_to_round
from .errors import CorruptStoreError, NotATraceStoreError, RunNotFoundError, SchemaVersionError, TraceStoreError
from .info import ModelInfo, RoundSummary, RunInfo
from .migrations import MIGRATIONS, Migration, check_version, ensure_schema, stored_version
from .paths import default_db_location
from .schema import nodes_table, rounds_table, runs_table

log = logging.getLogger(__name__)

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 10_000
HEARTBEAT_S = 1.0  # a live writer touches runs.heartbeat_at at least this often
STALE_AFTER_S = 30.0  # a 'running' run without a heartbeat for this long is dead

# columns a timeline needs (no blobs)
_SUMMARY_COLUMNS = [c for c in rounds_table.c if c.name not in ("residual_top", "residual_full", "bonus_top", "bonus_full")]
_TOP_ONLY_ROUND = [c for c in rounds_table.c if c.name not in ("residual_full", "bonus_full")]
_TOP_ONLY_NODE = [c for c in nodes_table.c if c.name not in ("p_full", "q_full")]


def to_url(location: str | os.PathLike | None) -> str:
    """A path (or None for the default location) -> an SQLAlchemy URL; URLs pass through."""
    if location is None:
        location = default_db_location()
    location = os.fspath(location)
    if "://" in location:
        return location
    return "sqlite:///" + str(Path(location).expanduser().resolve())


def _sqlite_path(url: str) -> str | None:
    """The file of an SQLite URL; None for in-memory or non-SQLite URLs."""
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise TraceStoreError(f"not a database path or SQLAlchemy URL: {url!r} ({exc})") from None
    if u.get_backend_name() != "sqlite":
        return None
    db = u.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


def _is_corruption(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(s in msg for s in ("malformed", "not a database", "corrupt", "file is encrypted"))


@contextlib.contextmanager
def translate_errors(where: str) -> Iterator[None]:
    """Turn SQLite corruption into CorruptStoreError; other DB errors into TraceStoreError."""
    try:
        yield
    except TraceStoreError:
        raise
    except (DatabaseError, sqlite3.DatabaseError) as exc:
        if _is_corruption(exc):
            raise CorruptStoreError(f"{where}: the database is corrupt ({_orig(exc)})") from exc
        raise TraceStoreError(f"{where}: {_orig(exc)}") from exc


def _orig(exc: BaseException) -> str:
    return str(getattr(exc, "orig", None) or exc).strip()


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
        if _is_corruption(exc):
            raise CorruptStoreError(f"{path}: the database is corrupt ({exc})") from exc
        raise TraceStoreError(f"{path}: {exc}") from exc
    finally:
        con.close()


def _sqlite_pragmas_readonly(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None
    cur = dbapi_connection.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA query_only = ON")
    finally:
        cur.close()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own transaction handling would not BEGIN before DDL or SELECT; take it over
    # (the SQLAlchemy recipe) so migrations are atomic and reads see one snapshot.
    dbapi_connection.isolation_level = None
    cur = dbapi_connection.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
    finally:
        cur.close()


def _sqlite_begin(conn: Any) -> None:
    # Writers take the write lock up front (waiting out busy_timeout) instead of failing
    # when a read transaction cannot be upgraded.
    immediate = conn.get_execution_options().get("sqlite_immediate", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def make_engine(url: str, echo: bool = False, readonly_path: str | None = None) -> Engine:
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}}
        if readonly_path is not None:
            kwargs["creator"] = lambda: sqlite3.connect(
                f"file:{readonly_path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        elif _sqlite_path(url) is None:  # in-memory: one shared connection for every thread
            kwargs["poolclass"] = StaticPool
        engine = create_engine(url, echo=echo, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas_readonly if readonly_path is not None else _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, echo=echo, pool_pre_ping=True)


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Any]:
    """A write transaction on `engine` (BEGIN IMMEDIATE on SQLite): commit on success, else roll back."""
    with engine.connect() as conn:
        conn.execution_options(sqlite_immediate=True)
        with conn.begin():
            yield conn


def _pid_alive(pid: int) -> bool:
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


def writer_is_dead(run_id: str, host: str | None, pid: int | None, heartbeat_at: float | None, started_at: float,
                   now: float | None = None, stale_after_s: float = STALE_AFTER_S) -> bool:
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
            from .writer import live_writer_ids

            return run_id not in live_writer_ids()
        return (not _pid_alive(pid)) or stale
    return stale


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class TraceStore:
    """The trace store: an SQLite file by default, or any SQLAlchemy URL.

    Opening checks the file (a non-SQLite file, a foreign database, a newer schema or a
    corrupt file raise a TraceStoreError subclass and change nothing), sets the SQLite
    pragmas on every connection, creates or migrates the schema, and marks 'running' runs
    whose writer died as interrupted (recover=True).

    readonly=True opens an SQLite file with mode=ro (no pragmas that write, no recovery, no
    migration): for shared or bundled stores. TraceStore.from_jsonl(path) is an in-memory
    store holding one imported trace.
    """

    @classmethod
    def from_jsonl(cls, source: Any, run_id: str | None = None) -> "TraceStore":
        """An in-memory store holding one imported JSONL trace (e.g. a bundled sample)."""
        from .jsonl import import_run

        store = cls("sqlite://")
        try:
            import_run(store, source, run_id=run_id)
        except BaseException:
            store.close()
            raise
        return store

    def __init__(
        self,
        location: str | os.PathLike | None = None,
        *,
        create: bool = True,
        recover: bool = True,
        readonly: bool = False,
        stale_after_s: float = STALE_AFTER_S,
        echo: bool = False,
        _migrations: Sequence[Migration] = MIGRATIONS,
    ):
        self.url = to_url(location)
        self.path = _sqlite_path(self.url)
        self.stale_after_s = stale_after_s
        where = self.path or make_url(self.url).render_as_string(hide_password=True)
        self._where = where
        self.readonly = readonly
        if readonly and self.path is None:
            raise TraceStoreError("readonly=True needs an SQLite file")
        if self.path is not None:
            if not Path(self.path).exists():
                if not create or readonly:
                    raise TraceStoreError(f"no trace store at {self.path}")
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            precheck_sqlite_file(self.path, _migrations)
        self.engine = make_engine(self.url, echo=echo, readonly_path=self.path if readonly else None)
        try:
            with translate_errors(f"opening {where}"):
                with self.engine.connect() as conn:  # a read first: opening an up-to-date store writes nothing
                    version = stored_version(conn)
                check_version(version, _migrations)
                if version == _migrations[-1].version:
                    self.schema_version = version
                elif readonly:
                    raise SchemaVersionError(
                        f"{where} has schema version {version}; open it once read-write to migrate it to {_migrations[-1].version}")
                else:
                    with self.transaction() as conn:
                        self.schema_version = ensure_schema(conn, _migrations)
            self.recovered: list[str] = self.recover_interrupted() if recover and not readonly else []
        except BaseException:
            self.engine.dispose()
            raise

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "TraceStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceStore({self._where!r})"

    @property
    def location(self) -> str:
        """The file path, or the URL with its password hidden: safe to print."""
        return self._where

    def transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A write transaction (BEGIN IMMEDIATE on SQLite): commit on success, else roll back."""
        return transaction(self.engine)

    # ------------------------------------------------------------------ maintenance

    def recover_interrupted(self, now: float | None = None) -> list[str]:
        """Mark 'running' runs whose writer is gone as interrupted; return their ids."""
        now = time.time() if now is None else now
        marked = []
        query = select(runs_table.c.run_id, runs_table.c.writer_host, runs_table.c.writer_pid,
                       runs_table.c.heartbeat_at, runs_table.c.started_at).where(runs_table.c.status == "running")
        with translate_errors(f"recovering runs in {self._where}"):
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
            dead = [r for r in rows if writer_is_dead(r.run_id, r.writer_host, r.writer_pid, r.heartbeat_at,
                                                        r.started_at, now, self.stale_after_s)]
            if not dead:
                return []
            with self.transaction() as conn:
                for r in dead:
                    last = r.heartbeat_at if r.heartbeat_at is not None else r.started_at
                    beat = runs_table.c.heartbeat_at
                    res = conn.execute(  # only if the writer has not beaten since we looked
                        update(runs_table)
                        .where(runs_table.c.run_id == r.run_id, runs_table.c.status == "running",
                               beat.is_(None) if r.heartbeat_at is None else beat == r.heartbeat_at)
                        .values(status="interrupted", ended_at=last,
                                error=f"the writer (pid {r.writer_pid} on {r.writer_host}) stopped without finishing; "
                                      f"marked interrupted when the store was opened")
                    )
                    if res.rowcount:
                        marked.append(r.run_id)
        for run_id in marked:
            log.warning("run %s was cut off; marked interrupted", run_id)
        return marked

    def integrity_check(self) -> list[str]:
        """SQLite's PRAGMA integrity_check (['ok'] when healthy); [] for other databases."""
        if make_url(self.url).get_backend_name() != "sqlite":
            return []
        with translate_errors(f"checking {self._where}"):
            with self.engine.connect() as conn:
                return [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]

    def delete_run(self, run_id: str) -> None:
        run_id = self.resolve_run_id(run_id)
        with translate_errors(f"deleting run {run_id}"):
            with self.transaction() as conn:
                conn.execute(delete(nodes_table).where(nodes_table.c.run_id == run_id))
                conn.execute(delete(rounds_table).where(rounds_table.c.run_id == run_id))
                conn.execute(delete(runs_table).where(runs_table.c.run_id == run_id))

    # ------------------------------------------------------------------ runs

    def resolve_run_id(self, ref: str) -> str:
        """An exact run id, a unique prefix of one, or 'last' (the most recently started)."""
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                if ref in ("last", "latest"):
                    found = conn.execute(select(runs_table.c.run_id).order_by(runs_table.c.started_at.desc()).limit(1)).scalar()
                    if found is None:
                        raise RunNotFoundError(f"the store {self._where} holds no runs")
                    return found
                if conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == ref)).scalar() is not None:
                    return ref
                escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                matches = conn.execute(
                    select(runs_table.c.run_id).where(runs_table.c.run_id.like(escaped + "%", escape="\\")).limit(3)
                ).scalars().all()
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunNotFoundError(f"no run {ref!r} in {self._where}")
        raise RunNotFoundError(f"run id prefix {ref!r} is ambiguous ({', '.join(matches)}, ...)")

    def list_runs(self, status: str | None = None, limit: int | None = None, newest_first: bool = True) -> list[RunInfo]:
        q = select(runs_table)
        if status is not None:
            q = q.where(runs_table.c.status == status)
        q = q.order_by(runs_table.c.started_at.desc() if newest_first else runs_table.c.started_at.asc())
        if limit is not None:
            q = q.limit(limit)
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                return [run_info(r._mapping) for r in conn.execute(q)]

    def get_run(self, run_id: str) -> RunInfo:
        run_id = self.resolve_run_id(run_id)
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                row = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).first()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._where}")
        return run_info(row._mapping)

    def run_config(self, run_id: str) -> RunConfig:
        return self.get_run(run_id).config

    # ------------------------------------------------------------------ rounds

    def count_rounds(self, run_id: str) -> int:
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(rounds_table).where(rounds_table.c.run_id == run_id)).scalar())

    def round_summaries(self, run_id: str, start: int = 0, stop: int | None = None) -> list[RoundSummary]:
        """Rounds [start, stop) without distributions: cheap enough for a live timeline."""
        q = select(*_SUMMARY_COLUMNS).where(*self._range(run_id, start, stop)).order_by(rounds_table.c.round_index)
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                return [round_summary(r._mapping) for r in conn.execute(q)]

    def load_rounds(self, run_id: str, start: int = 0, stop: int | None = None, full: bool = False) -> list[Round]:
        """Rounds [start, stop) as core Round records.

        full=False reads only the top-N blobs: distributions are PartialDistribution arrays.
        full=True uses the full vectors where the run stored them.
        """
        vocab = self._vocab(run_id)
        rcols = list(rounds_table.c) if full else _TOP_ONLY_ROUND
        ncols = list(nodes_table.c) if full else _TOP_ONLY_NODE
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                rows = [r._mapping for r in conn.execute(
                    select(*rcols).where(*self._range(run_id, start, stop)).order_by(rounds_table.c.round_index))]
                if not rows:
                    return []
                lo, hi = rows[0]["round_index"], rows[-1]["round_index"]
                nodes: dict[int, list[Mapping[str, Any]]] = {}
                for n in conn.execute(
                    select(*ncols).where(nodes_table.c.run_id == run_id, nodes_table.c.round_index >= lo,
                                         nodes_table.c.round_index <= hi)
                    .order_by(nodes_table.c.round_index, nodes_table.c.node_index)
                ):
                    nodes.setdefault(n.round_index, []).append(n._mapping)
        return [rows_to_round(r, nodes.get(r["round_index"], []), vocab, full=full) for r in rows]

    def iter_rounds(self, run_id: str, batch_size: int = 256, full: bool = False) -> Iterator[Round]:
        start = 0
        while True:
            batch = self.load_rounds(run_id, start, start + batch_size, full=full)
            yield from batch
            if len(batch) < batch_size:
                return
            start += batch_size

    def load_round(self, run_id: str, index: int, full: bool = True) -> Round:
        """One round with everything stored (full vectors when the run kept them)."""
        got = self.load_rounds(run_id, index, index + 1, full=full)
        if not got:
            self.resolve_run_id(run_id)
            raise RunNotFoundError(f"run {run_id} has no round {index}")
        return got[0]

    def _range(self, run_id: str, start: int, stop: int | None) -> list[Any]:
        conds = [rounds_table.c.run_id == run_id, rounds_table.c.round_index >= start]
        if stop is not None:
            conds.append(rounds_table.c.round_index < stop)
        return conds

    def _vocab(self, run_id: str) -> int:
        with translate_errors(f"reading {self._where}"):
            with self.engine.connect() as conn:
                vocab = conn.execute(select(runs_table.c.vocab_size).where(runs_table.c.run_id == run_id)).scalar()
        if vocab is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._where}")
        return int(vocab)


# ---------------------------------------------------------------------------- row -> value


def run_row(config: RunConfig, *, status: str, started_at: float, models: ModelInfo, library_versions: Mapping[str, Any],
            top_n: int, full_vectors: bool, full_dtype: str, prompt_text: str | None = None,
            extra: Mapping[str, Any] | None = None, writer_host: str | None = None, writer_pid: int | None = None) -> dict:
    s: SamplingConfig = config.sampling
    return {
        "run_id": config.run_id,
        "status": status,
        "stop_reason": None,
        "error": None,
        "started_at": float(started_at),
        "ended_at": None,
        "heartbeat_at": float(started_at) if status == "running" else None,
        "writer_host": writer_host,
        "writer_pid": writer_pid,
        "prompt_ids": [int(t) for t in config.prompt_ids],
        "prompt_text": prompt_text,
        "max_new_tokens": int(config.max_new_tokens),
        "k": int(config.k),
        "temperature": float(s.temperature),
        "top_k": int(s.top_k),
        "top_p": float(s.top_p),
        "seed": int(config.seed),
        "eos_token_id": None if config.eos_token_id is None else int(config.eos_token_id),
        "proposer": config.proposer,
        "proposer_params": _json_safe(dict(config.proposer_params)),
        "device": config.device,
        "dtype": config.dtype,
        "vocab_size": int(config.vocab_size),
        "use_cache": bool(config.use_cache),
        "fault": config.fault,
        "target_name": models.target_name if models.target_name is not None else config.target_name,
        "target_hash": models.target_hash,
        "draft_name": models.draft_name if models.draft_name is not None else config.draft_name,
        "draft_hash": models.draft_hash,
        "tokenizer_name": models.tokenizer_name,
        "tokenizer_hash": models.tokenizer_hash,
        "library_versions": _json_safe(dict(library_versions)),
        "extra": _json_safe(dict(extra or {})),
        "top_n": int(top_n),
        "full_vectors": bool(full_vectors),
        "full_dtype": full_dtype,
        "n_rounds": 0,
        "drafted": 0,
        "accepted": 0,
        "new_tokens": [],
        "wall_s": None,
    }


def run_info(r: Mapping[str, Any]) -> RunInfo:
    config = RunConfig(
        run_id=r["run_id"],
        prompt_ids=tuple(r["prompt_ids"]),
        max_new_tokens=r["max_new_tokens"],
        k=r["k"],
        sampling=SamplingConfig(temperature=float(r["temperature"]), top_k=int(r["top_k"]), top_p=float(r["top_p"])),
        seed=r["seed"],
        eos_token_id=r["eos_token_id"],
        proposer=r["proposer"],
        proposer_params=dict(r["proposer_params"] or {}),
        target_name=r["target_name"],
        draft_name=r["draft_name"],
        device=r["device"],
        dtype=r["dtype"],
        vocab_size=r["vocab_size"],
        use_cache=bool(r["use_cache"]),
        fault=r["fault"],
    )
    return RunInfo(
        run_id=r["run_id"],
        status=r["status"],
        stop_reason=r["stop_reason"],
        error=r["error"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        heartbeat_at=r["heartbeat_at"],
        writer_host=r["writer_host"],
        writer_pid=r["writer_pid"],
        config=config,
        prompt_text=r["prompt_text"],
        models=ModelInfo(target_name=r["target_name"], target_hash=r["target_hash"], draft_name=r["draft_name"],
                         draft_hash=r["draft_hash"], tokenizer_name=r["tokenizer_name"], tokenizer_hash=r["tokenizer_hash"]),
        library_versions=dict(r["library_versions"] or {}),
        extra=dict(r["extra"] or {}),
        top_n=r["top_n"],
        full_vectors=bool(r["full_vectors"]),
        full_dtype=r["full_dtype"],
        n_rounds=r["n_rounds"],
        drafted=r["drafted"],
        accepted=r["accepted"],
        new_tokens=tuple(r["new_tokens"] or ()),
        wall_s=r["wall_s"],
    )


def round_summary(r: Mapping[str, Any]) -> RoundSummary:
    return RoundSummary(
        run_id=r["run_id"],
        index=r["round_index"],
        prefix_len=r["prefix_len"],
        emitted_before=r["emitted_before"],
        remaining_budget=r["remaining_budget"],
        k=r["k"],
        greedy=bool(r["greedy"]),
        drafted=r["n_drafted"],
        accepted=r["n_accepted"],
        draft_tokens=tuple(r["draft_tokens"]),
        emitted=emitted_tokens(r["emitted"]),
        rejected_node=r["rejected_node"],
        residual_mass=r["residual_mass"],
        eos=bool(r["eos"]),
        budget_stop=bool(r["budget_stop"]),
        bonus_withheld=bool(r["bonus_withheld"]),
        target_cache=_cache(r["tc_before"], r["tc_peak"], r["tc_after"], r["tc_pending"]),
        draft_cache=_cache(r["dc_before"], r["dc_peak"], r["dc_after"], r["dc_pending"]),
        timings=RoundTimings(draft_s=r["draft_s"], verify_s=r["verify_s"], bookkeeping_s=r["bookkeeping_s"]),
        draft_forwards=r["draft_forwards"],
        target_forwards=r["target_forwards"],
    )
