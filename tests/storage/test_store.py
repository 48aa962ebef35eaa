"""Opening stores: pragmas, schema versions and migrations, refusals that change nothing,
recovery of runs whose writer died."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import IntegrityError, OperationalError

from specscope.storage import (
    SCHEMA_VERSION,
    CorruptStoreError,
    NotATraceStoreError,
    SchemaVersionError,
    TraceStore,
    TraceStoreError,
    TraceWriter,
    default_db_location,
    user_data_dir,
)
from specscope.storage.migrations import MIGRATIONS, Migration
from specscope.storage.schema import runs_table
from tests.storage.helpers import downgrade_sqlite_store, synthetic_config, synthetic_rounds


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_pragmas_on_every_connection(store):
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def test_schema_version_and_named_indexes(store):
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT version, description FROM schema_version")).all()
        names = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'"))}
    assert [r[0] for r in rows] == [SCHEMA_VERSION]
    assert {"ix_runs_status", "ix_runs_started_at", "ix_draft_nodes_status", "ix_rounds_run_eos"} <= names
    assert store.integrity_check() == ["ok"]


def test_foreign_keys_cascade(store):
    config = synthetic_config()
    with TraceWriter(store, config) as w:
        for r in synthetic_rounds(config, 3):
            w.write(r)
    store.delete_run(config.run_id)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM draft_nodes")).scalar() == 0
        with pytest.raises(IntegrityError):
            conn.execute(text("INSERT INTO rounds (run_id) VALUES ('nope')"))


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECSCOPE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert user_data_dir() == tmp_path / "xdg" / "specscope"
        assert default_db_location() == str(tmp_path / "xdg" / "specscope" / "traces.sqlite")
        with TraceStore() as s:  # created with its folder
            assert s.path == str(tmp_path / "xdg" / "specscope" / "traces.sqlite")
        assert os.path.exists(tmp_path / "xdg" / "specscope" / "traces.sqlite")
    monkeypatch.setenv("SPECSCOPE_DB", str(tmp_path / "other.sqlite"))
    assert default_db_location() == str(tmp_path / "other.sqlite")


def test_any_sqlalchemy_url_works():
    config = synthetic_config()
    with TraceStore("sqlite://") as s:  # in-memory, shared by the writer thread
        with TraceWriter(s, config) as w:
            for r in synthetic_rounds(config, 4):
                w.write(r)
        assert s.count_rounds(config.run_id) == 4
        assert s.integrity_check() == ["ok"]


def test_non_sqlite_file_is_refused_unchanged(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    before = digest(path)
    with pytest.raises(NotATraceStoreError, match="not an SQLite database"):
        TraceStore(path)
    assert digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["notes.sqlite"]


def test_foreign_sqlite_database_is_refused_unchanged(tmp_path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    before = digest(path)
    with pytest.raises(NotATraceStoreError, match="not a specscope trace store"):
        TraceStore(path)
    assert digest(path) == before
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # no WAL switch
    con.close()


def _bump_version(path, version: int) -> None:
    con = sqlite3.connect(path)
    con.execute("INSERT INTO schema_version VALUES (?, 'from the future', 0)", (version,))
    con.commit()
    con.close()


def test_newer_schema_is_refused_unchanged(tmp_path):
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()
    _bump_version(path, SCHEMA_VERSION + 1)
    before = digest(path)
    with pytest.raises(SchemaVersionError, match="newer than this specscope"):
        TraceStore(path)
    assert digest(path) == before


def test_empty_version_table_is_unknown_schema(tmp_path):
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()
    con = sqlite3.connect(path)
    con.execute("DELETE FROM schema_version")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError, match="unknown schema"):
        TraceStore(path)


def test_corrupt_database_is_refused_unchanged(tmp_path):
    path = tmp_path / "t.sqlite"
    with TraceStore(path) as s:
        config = synthetic_config()
        with TraceWriter(s, config) as w:
            for r in synthetic_rounds(config, 5):
                w.write(r)
        with s.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # clobber the schema page after the header
    path.write_bytes(bytes(data))
    before = digest(path)
    with pytest.raises(CorruptStoreError, match="corrupt"):
        TraceStore(path)
    assert digest(path) == before


def test_migrations_run_in_order_and_are_recorded(tmp_path):
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()
    applied = []

    n = SCHEMA_VERSION  # the two test migrations come after the real ones

    def v2(conn):
        applied.append(n + 1)
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN note TEXT")

    def v3(conn):
        applied.append(n + 2)
        conn.exec_driver_sql("UPDATE runs SET note = 'v3'")

    migrations = MIGRATIONS + (Migration(n + 1, "runs.note", v2), Migration(n + 2, "fill notes", v3))
    with TraceStore(path, _migrations=migrations) as s:
        assert s.schema_version == n + 2
        with s.engine.connect() as conn:
            versions = [r[0] for r in conn.execute(text("SELECT version FROM schema_version ORDER BY version"))]
    assert applied == [n + 1, n + 2] and versions == [n, n + 1, n + 2]
    with TraceStore(path, _migrations=migrations):
        pass
    assert applied == [n + 1, n + 2]  # nothing re-applied
    with pytest.raises(SchemaVersionError):  # and the old code refuses the upgraded file
        TraceStore(path)


def test_failed_migration_rolls_back(tmp_path):
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()

    def bad(conn):
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN note TEXT")
        raise RuntimeError("migration bug")

    with pytest.raises(RuntimeError):
        TraceStore(path, _migrations=MIGRATIONS + (Migration(SCHEMA_VERSION + 1, "bad", bad),))
    with TraceStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        with s.engine.connect() as conn:
            cols = [r[1] for r in conn.exec_driver_sql("PRAGMA table_info(runs)")]
    assert "note" not in cols


# ---------------------------------------------------------------------------- recovery


def _running_run(store, host: str, pid: int | None, heartbeat: float | None) -> str:
    config = synthetic_config()
    w = TraceWriter(store, config)
    w.write(synthetic_rounds(config, 1)[0])
    w.finish()
    with store.engine.begin() as conn:
        conn.execute(
            update(runs_table)
            .where(runs_table.c.run_id == config.run_id)
            .values(status="running", ended_at=None, writer_host=host, writer_pid=pid, heartbeat_at=heartbeat)
        )
    return config.run_id


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_dead_writer_is_marked_interrupted_on_open(tmp_path):
    path = tmp_path / "t.sqlite"
    host = socket.gethostname()
    now = time.time()
    with TraceStore(path) as s:
        dead = _running_run(s, host, _dead_pid(), now)
        alive = _running_run(s, host, os.getppid(), now)  # a live process with a fresh heartbeat
        reused = _running_run(s, host, os.getppid(), now - 3600)  # live pid but stale: pid reused / hung
        remote_fresh = _running_run(s, "some-other-host", 1234, now)
        remote_stale = _running_run(s, "some-other-host", 1234, now - 3600)
        mine = _running_run(s, host, os.getpid(), now)  # this process has no writer for it
    with TraceStore(path) as s:
        assert set(s.recovered) == {dead, reused, remote_stale, mine}
        status = {r.run_id: r.status for r in s.list_runs()}
        info = s.get_run(dead)
    assert status[alive] == "running" and status[remote_fresh] == "running"
    assert status[dead] == status[reused] == status[remote_stale] == status[mine] == "interrupted"
    assert info.ended_at == pytest.approx(now) and "stopped without finishing" in info.error


def test_live_writer_in_this_process_is_left_alone(store):
    config = synthetic_config()
    with TraceWriter(store, config), TraceStore(store.path) as other:
        assert other.recovered == []
        assert other.get_run(config.run_id).status == "running"


def test_missing_store_without_create(tmp_path):
    with pytest.raises(TraceStoreError, match="no trace store"):
        TraceStore(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_readonly_open_and_jsonl_in_memory(recorded, tmp_path):
    path, results = recorded
    rid = results["greedy"].config.run_id
    before = digest(path)
    with TraceStore(path, readonly=True) as s:
        assert s.get_run(rid).n_rounds == len(results["greedy"].rounds)
        assert s.load_round(rid, 0).index == 0
        with pytest.raises(OperationalError), s.transaction() as conn:
            conn.exec_driver_sql("DELETE FROM runs")
    assert digest(path) == before
    with pytest.raises(TraceStoreError):
        TraceStore(tmp_path / "absent.sqlite", readonly=True)
    from specscope.storage import export_run, open_jsonl

    with TraceStore(path) as s:
        export_run(s, rid, tmp_path / "g.jsonl")
    with open_jsonl(tmp_path / "g.jsonl") as mem:
        assert [r.run_id for r in mem.list_runs()] == [rid]


def _old_store(tmp_path, version: int):
    path = tmp_path / f"v{version}.sqlite"
    config = synthetic_config(run_id="old-run")
    with TraceStore(path) as s, TraceWriter(s, config, flush_interval=0.01) as writer:
        for rnd in synthetic_rounds(config, 5):
            writer.write(rnd)
            writer.flush()  # several commits, so several token chunks before the downgrade
        expected = s.new_tokens("old-run")
    downgrade_sqlite_store(path, version)
    return path, expected


def test_a_version_1_store_is_upgraded_and_its_runs_read_as_before(tmp_path):
    """Schema 2 adds runs.unrecorded; a store written before it opens, upgrades in place and
    its runs load with nothing unrecorded but their stops (schema 5)."""
    path, expected = _old_store(tmp_path, 1)
    with TraceStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION == 7
        assert s.run_config("old-run").unrecorded == frozenset({"stops"})
        assert len(s.load_rounds("old-run")) > 0
        assert s.new_tokens("old-run") == expected


def test_a_version_5_store_reads_with_its_stops_unrecorded(tmp_path):
    """Schema 6 adds runs.stops and rounds.stop: an older run does not say how it could stop,
    so the checker's stop rules say they were not checked rather than assume none."""
    from specscope.core.check.checker import check_report

    path, expected = _old_store(tmp_path, 5)
    with TraceStore(path) as s:
        assert s.schema_version == 7
        config = s.run_config("old-run")
        assert "stops" in config.unrecorded and config.stop_strings == () and config.stop_ids == ()
        rounds = s.load_rounds("old-run")
        assert all(r.stop is None and r.pieces is None for r in rounds) and s.new_tokens("old-run") == expected
        assert "stop-leak" in check_report(config, rounds).not_checked


def test_a_version_2_store_gets_its_token_list_as_a_chunk(tmp_path):
    """Schema 3 moves runs.new_tokens (the whole list, rewritten by every commit) to appended
    run_tokens chunks: the old list becomes one chunk, the count is filled, the old column is
    emptied, and the run reads, checks and exports as before."""
    import sqlite3

    from specscope.storage import export_run, open_jsonl

    path, expected = _old_store(tmp_path, 2)
    con = sqlite3.connect(path)
    assert json.loads(con.execute("SELECT new_tokens FROM runs").fetchone()[0]) == expected
    con.close()
    with TraceStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        info = s.get_run("old-run")
        assert info.n_new_tokens == len(expected) > 0 and s.new_tokens("old-run") == expected
        with s.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM run_tokens")).scalar() == 1
            assert conn.execute(text("SELECT new_tokens FROM runs")).scalar() == "[]"
        export_run(s, "old-run", tmp_path / "old.jsonl")
    with open_jsonl(tmp_path / "old.jsonl") as mem:
        assert mem.new_tokens("old-run") == expected


def test_a_version_4_store_gets_runs_position_limit(tmp_path):
    """Schema 5 adds runs.position_limit: a store written before it opens, upgrades in place,
    its runs have no limit (the checker names position-limit as not checked); a run written
    afterwards keeps its limit, and a JSONL export carries it (and none for the old run)."""
    import dataclasses

    from specscope.core.check.checker import check_report
    from specscope.storage import export_run

    path, _ = _old_store(tmp_path, 4)
    with TraceStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION == 7
        old = s.run_config("old-run")
        assert old.position_limit is None
        assert "position-limit" in check_report(old, s.load_rounds("old-run")).not_checked
        config = dataclasses.replace(synthetic_config(run_id="new-run"), position_limit=4096)
        with TraceWriter(s, config) as writer:
            for rnd in synthetic_rounds(config, 2):
                writer.write(rnd)
        assert s.run_config("new-run").position_limit == 4096
        export_run(s, "new-run", tmp_path / "new.jsonl")
        export_run(s, "old-run", tmp_path / "old.jsonl")
    assert json.loads((tmp_path / "new.jsonl").read_text().splitlines()[0])["config"]["position_limit"] == 4096
    assert "position_limit" not in json.loads((tmp_path / "old.jsonl").read_text().splitlines()[0])["config"]
