"""The store on a database server (any SQLAlchemy URL), not only SQLite.

Runs only when SPECSCOPE_TEST_DATABASE_URL names a database the tests may write to, e.g.

    SPECSCOPE_TEST_DATABASE_URL=postgresql+psycopg://specscope:specscope@localhost/specscope \\
        .venv/bin/python -m pytest -q tests/storage/test_database_url.py

(CI has no server, so it skips them.) Every run the tests create is deleted at the end.
"""

from __future__ import annotations

import io
import os
import time

import pytest
from sqlalchemy.engine import make_url

from specscope.core.checker import check_run
from specscope.storage import RunExistsError, TraceStore, TraceWriter, export_run, import_run, record

from .conftest import PROMPT
from .helpers import assert_rounds_equal, synthetic_config, synthetic_rounds

URL = os.environ.get("SPECSCOPE_TEST_DATABASE_URL")
pytestmark = pytest.mark.skipif(not URL, reason="set SPECSCOPE_TEST_DATABASE_URL to test a database server")


@pytest.fixture
def server_store():
    with TraceStore(URL) as store:
        before = {r.run_id for r in store.list_runs()}
        yield store
        for r in store.list_runs():
            if r.run_id not in before:
                store.delete_run(r.run_id)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_record_load_check_export_import(server_store, make_decoder, mode):
    store = server_store
    assert store.path is None and store.integrity_check() == []
    password = make_url(URL).password
    assert not password or f":{password}@" not in store.location  # printed by the CLI
    result = record(store, make_decoder("sampled"), PROMPT, 40, mode=mode)
    rid = result.config.run_id
    info = store.get_run(rid)
    assert info.status == "completed" and info.config == result.config
    assert info.n_rounds == len(result.rounds) and info.new_tokens == tuple(result.new_tokens)
    loaded = store.load_rounds(rid, full=True)
    for a, b in zip(result.rounds, loaded):
        assert_rounds_equal(a, b, atol=1e-7)
    assert check_run(info.config, loaded) == []
    buffer = io.StringIO()
    export_run(store, rid, buffer)
    buffer.seek(0)
    with pytest.raises(RunExistsError):
        TraceWriter(store, result.config)
    store.delete_run(rid)
    assert import_run(store, buffer) == rid
    for a, b in zip(loaded, store.load_rounds(rid, full=True)):
        assert_rounds_equal(a, b, atol=0)


def test_readable_while_written_and_heartbeat(server_store):
    config = synthetic_config()
    rounds = synthetic_rounds(config, 12)
    with TraceWriter(server_store, config, flush_interval=0.1) as writer:
        for r in rounds[:6]:
            writer.write(r)
        writer.flush()
        with TraceStore(URL) as other:
            assert other.get_run(config.run_id).status == "running"
            assert other.count_rounds(config.run_id) == 6
            first = other.get_run(config.run_id).heartbeat_at
            time.sleep(1.3)
            assert other.get_run(config.run_id).heartbeat_at > first
        for r in rounds[6:]:
            writer.write(r)
    assert server_store.get_run(config.run_id).n_rounds == 12


def test_a_run_without_a_live_writer_is_marked_interrupted(server_store):
    config = synthetic_config()
    writer = TraceWriter(server_store, config, mode="thread")
    writer.write(synthetic_rounds(config, 1)[0])
    writer.flush()
    # as if the writer had died long ago, on another machine
    from sqlalchemy import update

    from specscope.storage.schema import runs_table

    with server_store.transaction() as conn:
        conn.execute(update(runs_table).where(runs_table.c.run_id == config.run_id).values(
            writer_host="elsewhere", heartbeat_at=time.time() - 3600))
    with TraceStore(URL) as reopened:
        assert config.run_id in reopened.recovered
        assert reopened.get_run(config.run_id).status == "interrupted"
    writer.finish("completed")  # the run is no longer 'running': the late finish does not revive it
    assert server_store.get_run(config.run_id).status in ("interrupted", "completed")
