"""Schema versions and ordered migrations.

A new store is created from the current models (schema.py) and stamped with
CURRENT_VERSION. An existing store at version v gets every migration with version > v,
in order, each in the same transaction as its schema_version row. To change the schema:
edit schema.py, append a Migration that brings version CURRENT_VERSION to the new shape
(ALTER TABLE ... through the connection), and add a test that opens a store of the old
version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, func, insert, inspect, select, text, update

from specscope.storage.errors import NewerStoreError, NotATraceStoreError, SchemaVersionError
from specscope.storage.schema import Base, SchemaVersion, runs_table, tokens_table


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _baseline(conn: Connection) -> None:  # version 1 is the baseline created from the models
    Base.metadata.create_all(conn)


def _add_unrecorded(conn: Connection) -> None:
    """Version 2: runs.unrecorded, the optional trace fields a run did not record."""
    column = Base.metadata.tables["runs"].c.unrecorded
    kind = column.type.compile(dialect=conn.dialect)
    conn.execute(text(f"ALTER TABLE runs ADD COLUMN unrecorded {kind}"))


def _append_only_tokens(conn: Connection) -> None:
    """Version 3: the token list moves from runs.new_tokens (rewritten at every commit) to
    run_tokens chunks (appended); runs.n_new_tokens counts them. Each run's list becomes one
    chunk, read and written one run at a time."""
    tokens_table.create(conn)
    conn.execute(text("ALTER TABLE runs ADD COLUMN n_new_tokens INTEGER NOT NULL DEFAULT 0"))
    run_ids = conn.execute(select(runs_table.c.run_id)).scalars().all()
    for run_id in run_ids:
        raw = conn.execute(select(runs_table.c.new_tokens).where(runs_table.c.run_id == run_id)).scalar()
        tokens = json.loads(raw) if isinstance(raw, str) else (raw or [])
        if tokens:
            conn.execute(
                insert(tokens_table),
                {
                    "run_id": run_id,
                    "start": 0,
                    "n_tokens": len(tokens),
                    "tokens": np.asarray(tokens, dtype="<i4").tobytes(),
                },
            )
        conn.execute(
            update(runs_table).where(runs_table.c.run_id == run_id).values(n_new_tokens=len(tokens), new_tokens=[])
        )


def _add_tree_facts(conn: Connection) -> None:
    """Version 4: rounds.tree (JSON), rounds.tree_top and rounds.tree_full (blobs): a tree
    round's tried order, residual updates, path, positions, mask rows and kept rows."""
    columns = Base.metadata.tables["rounds"].c
    for name in ("tree", "tree_top", "tree_full"):
        kind = columns[name].type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE rounds ADD COLUMN {name} {kind}"))


def _add_position_limit(conn: Connection) -> None:
    """Version 5: runs.position_limit, the most positions the run's target reads."""
    column = Base.metadata.tables["runs"].c.position_limit
    conn.execute(text(f"ALTER TABLE runs ADD COLUMN position_limit {column.type.compile(dialect=conn.dialect)}"))


def _add_stops(conn: Connection) -> None:
    """Version 6: runs.stops (the run's EOS ids, stop strings and sequences) and rounds.stop
    (the stop a round completed, each token's text). Older runs keep null: not recorded."""
    for table, name in (("runs", "stops"), ("rounds", "stop")):
        kind = Base.metadata.tables[table].c[name].type.compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))


def _add_confidence(conn: Connection) -> None:
    """Version 7: draft_nodes.confidence, the proposer's own probability for its token.
    Older nodes keep null: unknown."""
    kind = Base.metadata.tables["draft_nodes"].c.confidence.type.compile(dialect=conn.dialect)
    conn.execute(text(f"ALTER TABLE draft_nodes ADD COLUMN confidence {kind}"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: runs, rounds, draft_nodes", _baseline),
    Migration(2, "runs.unrecorded: optional trace fields a run did not record", _add_unrecorded),
    Migration(3, "run_tokens: the token list appended in chunks; runs.n_new_tokens", _append_only_tokens),
    Migration(
        4, "rounds.tree, tree_top, tree_full: tree rounds' tried order, residual updates and layout", _add_tree_facts
    ),
    Migration(5, "runs.position_limit: the most positions the run's target reads", _add_position_limit),
    Migration(
        6, "runs.stops, rounds.stop: EOS ids, stop strings and sequences, the stop a round completed", _add_stops
    ),
    Migration(7, "draft_nodes.confidence: the proposer's own probability for its token", _add_confidence),
)
CURRENT_VERSION = MIGRATIONS[-1].version
TABLES = frozenset(Base.metadata.tables)


def stored_version(conn: Connection) -> int | None:
    """The schema version of the database; None for an empty database (no tables)."""
    tables = set(inspect(conn).get_table_names())
    if not tables:
        return None
    if "schema_version" not in tables:
        shown = ", ".join(sorted(tables)[:8])
        raise NotATraceStoreError(
            f"the database holds tables ({shown}) but is not a specscope trace store (no schema_version table)"
        )
    version = conn.execute(select(func.max(SchemaVersion.version))).scalar()
    if version is None:
        raise SchemaVersionError("the schema_version table is empty: unknown schema")
    return int(version)


def check_version(version: int | None, migrations: Sequence[Migration] = MIGRATIONS, reader: bool = False) -> None:
    """Refuse a version this code cannot use: below 1, or (for a writer: reader=False) newer
    than the last migration (NewerStoreError). A reader takes a newer store (what it reads
    is checked by missing_columns)."""
    current = migrations[-1].version
    if version is not None and version > current and not reader:
        raise NewerStoreError(
            f"the store has schema version {version}, newer than this specscope knows ({current}): it does not "
            f"write into a newer store; upgrade specscope, or give another store"
        )
    if version is not None and version < 1:
        raise SchemaVersionError(f"unknown schema version {version}")


def missing_columns(conn: Connection) -> list[str]:
    """The tables and columns this code reads that the database lacks ("table" or
    "table.column"): what a store of a newer schema must still hold to be read."""
    found = inspect(conn)
    tables = set(found.get_table_names())
    missing: list[str] = []
    for name, table in Base.metadata.tables.items():
        if name not in tables:
            missing.append(name)
            continue
        have = {c["name"] for c in found.get_columns(name)}
        missing += [f"{name}.{c.name}" for c in table.columns if c.name not in have]
    return missing


def newer_note(where: str, version: int, current: int = MIGRATIONS[-1].version) -> str:
    """What a reader says about a store of a newer schema (one line)."""
    return (
        f"{where} was written by a newer specscope (schema version {version}; this one knows {current}): "
        f"reading what this version understands, writing nothing"
    )


def ensure_schema(conn: Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Create or upgrade the schema inside the caller's transaction; return the version."""
    versions = [m.version for m in migrations]
    assert versions == sorted(set(versions)), "migrations must have strictly increasing versions"
    version = stored_version(conn)
    check_version(version, migrations)
    now = time.time()
    if version is None:
        Base.metadata.create_all(conn)
        current = migrations[-1]
        conn.execute(
            insert(SchemaVersion).values(
                version=current.version, description=f"created: {current.description}", applied_at=now
            )
        )
        return current.version
    for m in migrations:
        if m.version > version:
            m.apply(conn)
            conn.execute(insert(SchemaVersion).values(version=m.version, description=m.description, applied_at=now))
            version = m.version
    return version
