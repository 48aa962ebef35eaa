"""TraceStore: opening a store (checks, pragmas, migrations), recovery of dead runs, and
the read API."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select, update

from specscope.core.records import Round, RunConfig
from specscope.storage.engine import (
    is_memory,
    is_sqlite,
    make_engine,
    memory_copy,
    precheck_sqlite_file,
    printable,
    sqlite_path,
    to_url,
)
from specscope.storage.errors import (
    NewerStoreError,
    NotATraceStoreError,
    RunNotFoundError,
    SchemaVersionError,
    TraceStoreError,
)
from specscope.storage.info import RunInfo
from specscope.storage.liveness import STALE_AFTER_S, writer_is_dead
from specscope.storage.migrations import (
    MIGRATIONS,
    Migration,
    check_version,
    ensure_schema,
    missing_columns,
    newer_note,
    stored_version,
)
from specscope.storage.rows import StoredRow, chunk_tokens, round_summary, rows_to_round, run_info
from specscope.storage.schema import nodes_table, rounds_table, runs_table, tokens_table
from specscope.storage.transactions import transaction, translate_errors

log = logging.getLogger(__name__)

MAX_BATCH = 256  # rounds per read of iter_rounds
BATCH_BYTES = 64 * 2**20  # ... and at most this many bytes of rebuilt dense vectors per read

# columns a timeline needs (no blobs)
_SUMMARY_COLUMNS = [
    c
    for c in rounds_table.c
    if c.name not in ("residual_top", "residual_full", "bonus_top", "bonus_full", "tree_top", "tree_full")
]
_TOP_ONLY_ROUND = [c for c in rounds_table.c if c.name not in ("residual_full", "bonus_full", "tree_full")]
_TOP_ONLY_NODE = [c for c in nodes_table.c if c.name not in ("p_full", "q_full")]
_NO_BLOB_NODE = [c for c in nodes_table.c if c.name not in ("p_full", "q_full", "p_top", "q_top")]


class TraceStore:
    """The trace store: an SQLite file by default, or any SQLAlchemy URL.

    Opening checks the file (a non-SQLite file, a foreign database, a newer schema or a
    corrupt file raise a TraceStoreError subclass and change nothing; so do a missing path
    and an empty file when create=False or readonly=True: only a writer creates a store, with
    its folder, or turns an empty file into one), sets the SQLite
    pragmas on every connection, creates or migrates the schema, and marks 'running' runs
    whose writer died as interrupted (recover=True).

    readonly=True opens an SQLite file with mode=ro (no pragmas that write, no recovery, no
    migration in the file: an older schema is migrated in a copy in memory): for shared or
    bundled stores and every reading command. A store of a newer schema than this code knows
    is read as far as it holds the tables and columns this code reads (`newer_schema` is then
    the line that says so); a writer refuses it (NewerStoreError). With presume_interrupted=True a read-only store
    shows a 'running' run whose writer is gone as interrupted, as a writer would mark it,
    without writing it (what the CLI's readers show). storage.jsonl.transfer.open_jsonl(path) is an in-memory
    store holding one imported trace.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        *,
        create: bool = True,
        recover: bool = True,
        readonly: bool = False,
        presume_interrupted: bool = False,
        stale_after_s: float = STALE_AFTER_S,
        echo: bool = False,
        _migrations: Sequence[Migration] = MIGRATIONS,
    ):
        self.url = to_url(location)
        self.path = sqlite_path(self.url)
        self.stale_after_s = stale_after_s
        where = self.path or printable(self.url)
        self._where = where
        self.readonly = readonly
        self._presumed_dead: dict[str, tuple[float | None, str]] = {}  # readonly: dead writers, not written back
        # a reader of a store of a newer schema: the line that says so (None for a store this code knows)
        self.newer_schema: str | None = None
        if readonly and is_memory(self.url):
            raise TraceStoreError("readonly=True needs an SQLite file or a database server")
        if self.path is not None:
            self._check_file(self.path, create and not readonly, _migrations)
        self.engine = make_engine(self.url, echo=echo, readonly_path=self.path if readonly else None)
        try:
            with translate_errors(f"opening {where}"):
                self._schema(_migrations)
            if recover and readonly and presume_interrupted:
                self._presumed_dead = self._dead_writers(time.time())
            self.recovered: list[str] = self.recover_interrupted() if recover and not readonly else []
        except TraceStoreError as exc:
            self.engine.dispose()
            if "\n" in str(exc) and type(exc).__init__ is TraceStoreError.__init__:  # a driver's message: one line
                raise type(exc)(" ".join(str(exc).split())) from exc
            raise
        except BaseException:
            self.engine.dispose()
            raise

    def _check_file(self, path: str, writer: bool, migrations: Sequence[Migration]) -> None:
        """Before the engine: only a writer creates a store, with its folder, or turns an
        empty file (or an SQLite database without tables) into one."""
        file = Path(path)
        if not file.exists():
            if not writer:
                raise TraceStoreError(f"no trace store at {path}")
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # e.g. a file where a folder should be, or a folder it may not write
                blocker = next((p for p in file.parents if p.exists() and not p.is_dir()), None)
                why = f"{blocker} is a file, not a folder" if blocker else (exc.strerror or str(exc))
                raise TraceStoreError(f"cannot create the trace store {path}: {why}") from None
        elif not writer and file.is_file() and file.stat().st_size == 0:
            raise NotATraceStoreError(f"{path} is an empty file, not a trace store")
        precheck_sqlite_file(path, migrations, reader=not writer)

    def _schema(self, migrations: Sequence[Migration]) -> None:
        """Check the schema version; migrate an older store (a read-only one in a copy in
        memory: the file stays as it is)."""
        with self.engine.connect() as conn:  # a read first: opening an up-to-date store writes nothing
            version = stored_version(conn)
            missing = (
                missing_columns(conn)
                if self.readonly and version is not None and version > migrations[-1].version
                else []
            )
        check_version(version, migrations, reader=self.readonly)
        if version is not None and version > migrations[-1].version:  # a reader of a newer store
            if missing:
                shown = ", ".join(missing[:6]) + (", …" if len(missing) > 6 else "")
                raise NewerStoreError(
                    f"{self._where} was written by a newer specscope (schema version {version}; this "
                    f"one knows {migrations[-1].version}) and lacks what this version reads ({shown}): "
                    f"upgrade specscope to read it"
                )
            self.schema_version = version
            self.newer_schema = newer_note(self._where, version, migrations[-1].version)
            return
        if version == migrations[-1].version:
            self.schema_version = version
            return
        if self.readonly and self.path is None:
            raise SchemaVersionError(
                f"{self._where} has schema version {version}; open it once read-write to "
                f"migrate it to {migrations[-1].version}"
            )
        if self.readonly and self.path is not None:  # (a read-only store without a path was refused above)
            self.engine.dispose()
            self.engine = memory_copy(self.path)
        with self.transaction() as conn:
            self.schema_version = ensure_schema(conn, migrations)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> TraceStore:
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

    def _dead_writers(self, now: float) -> dict[str, tuple[float | None, str]]:
        """'running' runs whose writer is gone: run id -> (its last sign of life, why)."""
        query = select(
            runs_table.c.run_id,
            runs_table.c.writer_host,
            runs_table.c.writer_pid,
            runs_table.c.heartbeat_at,
            runs_table.c.started_at,
        ).where(runs_table.c.status == "running")
        with translate_errors(f"recovering runs in {self._where}"), self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {
            r.run_id: (
                r.heartbeat_at,
                f"the writer (pid {r.writer_pid} on {r.writer_host}) stopped without "
                f"finishing; marked interrupted when the store was opened",
            )
            for r in rows
            if writer_is_dead(
                r.run_id, r.writer_host, r.writer_pid, r.heartbeat_at, r.started_at, now, self.stale_after_s
            )
        }

    def recover_interrupted(self, now: float | None = None) -> list[str]:
        """Mark 'running' runs whose writer is gone as interrupted; return their ids."""
        dead = self._dead_writers(time.time() if now is None else now)
        if not dead:
            return []
        marked = []
        with translate_errors(f"recovering runs in {self._where}"), self.transaction() as conn:
            for run_id, (beat_at, why) in dead.items():
                started = conn.execute(select(runs_table.c.started_at).where(runs_table.c.run_id == run_id)).scalar()
                beat = runs_table.c.heartbeat_at
                res = conn.execute(  # only if the writer has not beaten since we looked
                    update(runs_table)
                    .where(
                        runs_table.c.run_id == run_id,
                        runs_table.c.status == "running",
                        beat.is_(None) if beat_at is None else beat == beat_at,
                    )
                    .values(status="interrupted", ended_at=beat_at if beat_at is not None else started, error=why)
                )
                if res.rowcount:
                    marked.append(run_id)
        for run_id in marked:
            log.warning("run %s was cut off; marked interrupted", run_id)
        return marked

    def _info(self, row: StoredRow) -> RunInfo:
        """A stored run; on a read-only store a run whose writer is gone reads as interrupted
        (as a writer would mark it), while the store itself is left as it is."""
        info = run_info(row)
        dead = self._presumed_dead.get(info.run_id)
        if dead is None or info.status != "running":
            return info
        beat_at, why = dead
        return dataclasses.replace(
            info, status="interrupted", error=why, ended_at=beat_at if beat_at is not None else info.started_at
        )

    def integrity_check(self) -> list[str]:
        """SQLite's PRAGMA integrity_check (['ok'] when healthy); [] for other databases."""
        if not is_sqlite(self.url):
            return []
        with translate_errors(f"checking {self._where}"), self.engine.connect() as conn:
            return [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check")]

    def delete_run(self, run_id: str) -> None:
        run_id = self.resolve_run_id(run_id)
        with translate_errors(f"deleting run {run_id}"), self.transaction() as conn:
            conn.execute(delete(nodes_table).where(nodes_table.c.run_id == run_id))
            conn.execute(delete(tokens_table).where(tokens_table.c.run_id == run_id))
            conn.execute(delete(rounds_table).where(rounds_table.c.run_id == run_id))
            conn.execute(delete(runs_table).where(runs_table.c.run_id == run_id))

    # ------------------------------------------------------------------ runs

    def resolve_run_id(self, ref: str) -> str:
        """An exact run id, a unique prefix of one, or 'last' (the most recently started)."""
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            if ref in ("last", "latest"):
                found: str | None = conn.execute(
                    select(runs_table.c.run_id).order_by(runs_table.c.started_at.desc()).limit(1)
                ).scalar()
                if found is None:
                    raise RunNotFoundError(f"the store {self._where} holds no runs")
                return found
            if conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id == ref)).scalar() is not None:
                return ref
            escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            matches: Sequence[str] = (
                conn.execute(
                    select(runs_table.c.run_id).where(runs_table.c.run_id.like(escaped + "%", escape="\\")).limit(3)
                )
                .scalars()
                .all()
            )
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise RunNotFoundError(f"no run {ref!r} in {self._where}")
        raise RunNotFoundError(f"run id prefix {ref!r} is ambiguous ({', '.join(matches)}, ...)")

    def list_runs(
        self, status: str | None = None, limit: int | None = None, newest_first: bool = True
    ) -> list[RunInfo]:
        q = select(runs_table)
        if status is not None:
            q = q.where(runs_table.c.status == status)
        q = q.order_by(runs_table.c.started_at.desc() if newest_first else runs_table.c.started_at.asc())
        if limit is not None:
            q = q.limit(limit)
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            return [self._info(r._mapping) for r in conn.execute(q)]

    def get_run(self, run_id: str) -> RunInfo:
        run_id = self.resolve_run_id(run_id)
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            row = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).first()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._where}")
        return self._info(row._mapping)

    def run_config(self, run_id: str) -> RunConfig:
        return self.get_run(run_id).config

    def new_tokens(self, run_id: str) -> list[int]:
        """The run's new tokens, as far as they are committed (from its run_tokens chunks)."""
        return [int(t) for chunk in self.token_chunks(run_id) for t in chunk]

    def token_chunks(self, run_id: str, batch: int = 64) -> Iterator[np.ndarray]:
        """The run's new tokens as the commits appended them, chunk by chunk, read `batch`
        chunks at a time (memory bounded by the batch, not by the run)."""
        run_id = self.resolve_run_id(run_id)
        start = 0
        while True:
            q = (
                select(tokens_table.c.start, tokens_table.c.tokens)
                .where(tokens_table.c.run_id == run_id, tokens_table.c.start >= start)
                .order_by(tokens_table.c.start)
                .limit(batch)
            )
            with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
                rows = conn.execute(q).all()
            for row in rows:
                tokens = chunk_tokens(row.tokens)
                start = int(row.start) + len(tokens)
                yield tokens
            if len(rows) < batch:
                return

    # ------------------------------------------------------------------ rounds

    def count_rounds(self, run_id: str) -> int:
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(rounds_table).where(rounds_table.c.run_id == run_id)
                ).scalar_one()
            )

    def round_summaries(self, run_id: str, start: int = 0, stop: int | None = None) -> list[Any]:
        """Rounds [start, stop) without distributions (RoundSummary, made by make_dataclass, so no
        static type): cheap enough for a live timeline."""
        q = select(*_SUMMARY_COLUMNS).where(*self._range(run_id, start, stop)).order_by(rounds_table.c.round_index)
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            return [round_summary(r._mapping) for r in conn.execute(q)]

    def load_rounds(
        self, run_id: str, start: int = 0, stop: int | None = None, full: bool = False, vectors: bool = True
    ) -> list[Round]:
        """Rounds [start, stop) as core Round records.

        full=False reads only the top-N blobs: distributions are PartialDistribution arrays.
        full=True uses the full vectors where the run stored them. vectors=False reads no
        blob at all: every distribution is None (what a timeline of a long run holds).
        """
        vocab, p_token_unrecorded = self._vocab(run_id)
        rcols = list(rounds_table.c) if full else _TOP_ONLY_ROUND if vectors else _SUMMARY_COLUMNS
        ncols = list(nodes_table.c) if full else _TOP_ONLY_NODE if vectors else _NO_BLOB_NODE
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            rows = [
                r._mapping
                for r in conn.execute(
                    select(*rcols).where(*self._range(run_id, start, stop)).order_by(rounds_table.c.round_index)
                )
            ]
            if not rows:
                return []
            lo, hi = rows[0]["round_index"], rows[-1]["round_index"]
            nodes: dict[int, list[StoredRow]] = {}
            for n in conn.execute(
                select(*ncols)
                .where(nodes_table.c.run_id == run_id, nodes_table.c.round_index >= lo, nodes_table.c.round_index <= hi)
                .order_by(nodes_table.c.round_index, nodes_table.c.node_index)
            ):
                nodes.setdefault(n.round_index, []).append(n._mapping)
        return [
            rows_to_round(
                r,
                nodes.get(r["round_index"], []),
                vocab,
                full=full,
                vectors=vectors,
                p_token_unrecorded=p_token_unrecorded,
            )
            for r in rows
        ]

    def iter_rounds(self, run_id: str, batch_size: int | None = None, full: bool = False) -> Iterator[Round]:
        """Rounds in order, read `batch_size` rounds at a time: at most one batch is held
        here. The default batch keeps a batch's rebuilt vectors (a dense float64 vector per
        distribution, top-N or full) under BATCH_BYTES."""
        if batch_size is None:
            batch_size = self.batch_size(run_id)
        start = 0
        while True:
            batch = self.load_rounds(run_id, start, start + batch_size, full=full)
            yield from batch
            if len(batch) < batch_size:
                return
            start += batch_size

    def batch_size(self, run_id: str) -> int:
        """Rounds per read for iter_rounds: MAX_BATCH, fewer for big vocabularies, so that
        a batch's rebuilt vectors (p and q per node, bonus and residual: about 2 (k + 2)
        float64 rows of the vocabulary per round; a tree round has its mean node count in
        place of k and a p' per rejected node: about 3 nodes + 2) stay under BATCH_BYTES."""
        run_id = self.resolve_run_id(run_id)
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            row = conn.execute(
                select(
                    runs_table.c.vocab_size,
                    runs_table.c.k,
                    runs_table.c.drafted,
                    runs_table.c.n_rounds,
                    runs_table.c.proposer_params,
                ).where(runs_table.c.run_id == run_id)
            ).one()
        rows = 2 * (max(1, int(row.k)) + 2)
        if (row.proposer_params or {}).get("tree"):
            nodes = -(-int(row.drafted or 0) // max(1, int(row.n_rounds or 0)))
            rows = max(rows, 3 * nodes + 2)
        per_round = max(1, int(row.vocab_size)) * 8 * rows
        return max(1, min(MAX_BATCH, BATCH_BYTES // per_round))

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

    def _vocab(self, run_id: str) -> tuple[int, bool]:
        """(the run's vocabulary size, whether its trace left p_token out somewhere: a stored 0
        is then no fact about p)."""
        with translate_errors(f"reading {self._where}"), self.engine.connect() as conn:
            row = conn.execute(
                select(runs_table.c.vocab_size, runs_table.c.unrecorded).where(runs_table.c.run_id == run_id)
            ).first()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self._where}")
        return int(row[0]), "p_token" in (row[1] or ())
