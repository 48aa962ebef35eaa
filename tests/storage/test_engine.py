"""The store on a database server (any SQLAlchemy URL), not only SQLite.

Runs only when SPECSCOPE_TEST_DATABASE_URL names a database the tests may write to, e.g.

    SPECSCOPE_TEST_DATABASE_URL=postgresql+psycopg://specscope:specscope@localhost/specscope \\
        .venv/bin/python -m pytest -q tests/storage/test_engine.py

(`.ci/run` starts a throwaway PostgreSQL server and sets it; without one they skip.) Every run
the tests create is deleted at the end; the tests with several processes each work in a schema
of their own (tests/pg_server.py).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy.engine import make_url

from specscope.core.check.checker import check_run
from specscope.storage import RunExistsError, TraceStore, TraceWriter, export_run, import_run, record
from tests.pg_server import SKIP_REASON, fresh_schema
from tests.storage.conftest import PROMPT
from tests.storage.helpers import assert_rounds_equal, synthetic_config, synthetic_rounds
from tests.storage.killing import SCENARIOS, check_killed_run, kill_mid_run
from tests.tiny_models import save_pair

URL = os.environ.get("SPECSCOPE_TEST_DATABASE_URL")
pytestmark = pytest.mark.skipif(not URL, reason=SKIP_REASON)


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
    result = record(store, make_decoder("sampled"), PROMPT, 40, keep_rounds=True, mode=mode)
    rid = result.config.run_id
    info = store.get_run(rid)
    assert info.status == "completed" and info.config == result.config
    assert info.n_rounds == len(result.rounds) and store.new_tokens(rid) == result.new_tokens
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
        conn.execute(
            update(runs_table)
            .where(runs_table.c.run_id == config.run_id)
            .values(writer_host="elsewhere", heartbeat_at=time.time() - 3600)
        )
    with TraceStore(URL) as reopened:
        assert config.run_id in reopened.recovered
        assert reopened.get_run(config.run_id).status == "interrupted"
    writer.finish("completed")  # the run is no longer 'running': the late finish does not revive it
    assert server_store.get_run(config.run_id).status in ("interrupted", "completed")


# --- several processes at once on the server -------------------------------------------------

CLI = "import sys; from specscope.app.cli import main; sys.exit(main(sys.argv[1:]))"
PROMPT_IDS = ",".join(map(str, PROMPT))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"))


def start_recording(url, checkpoints, seed, max_new, writer_mode="thread", k=4):
    """`specscope run --db URL` on the tiny pair, in a process of its own."""
    target, draft = checkpoints
    env = dict(os.environ, SPECSCOPE_TRACE_WRITER=writer_mode, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLI,
            "run",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--prompt-ids",
            PROMPT_IDS,
            "--device",
            "cpu",
            "--temperature",
            "1.0",
            "--seed",
            str(seed),
            "--max-new",
            str(max_new),
            "--eos-id",
            "none",
            "--k",
            str(k),
            "--db",
            url,
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


def stop(procs):
    """Kill whatever is left of each process group (a writer process included)."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if p.poll() is None:
            p.wait(timeout=30)


def test_two_recording_processes_and_a_reader_at_once(checkpoints):
    with fresh_schema("two") as url:
        # k=1 and 400 tokens: 200+ rounds each, a few seconds of recording even on a quiet
        # machine, so that the reader meets the runs while they are being written
        procs = [
            start_recording(url, checkpoints, seed=1, max_new=400, writer_mode="thread", k=1),
            start_recording(url, checkpoints, seed=2, max_new=400, writer_mode="process", k=1),
        ]
        seen: dict[str, int] = {}  # run id -> most rounds read so far
        seen_running = set()
        reads = 0
        try:
            with TraceStore(url) as reader:
                deadline = time.monotonic() + 240
                while any(p.poll() is None for p in procs):
                    assert time.monotonic() < deadline, "the recording processes did not finish"
                    for info in reader.list_runs():
                        rounds = reader.load_rounds(info.run_id)
                        # what a reader sees is always a prefix of the run, never less than before
                        assert [r.index for r in rounds] == list(range(len(rounds)))
                        assert len(rounds) >= seen.get(info.run_id, 0)
                        seen[info.run_id] = len(rounds)
                        if info.status == "running" and rounds:
                            seen_running.add(info.run_id)
                        reads += 1
                    time.sleep(0.05)
            outputs = [p.communicate(timeout=60) for p in procs]
        finally:
            stop(procs)
        for p, (_out, err) in zip(procs, outputs):
            assert p.returncode == 0, err
        summaries = {s["run_id"]: s for s in (json.loads(out) for out, _ in outputs)}
        with TraceStore(url) as store:
            runs = store.list_runs()
            assert store.recovered == [] and {r.run_id for r in runs} == set(summaries)
            for info in runs:
                summary = summaries[info.run_id]
                assert info.status == "completed" and info.stop_reason == "budget"
                rounds = store.load_rounds(info.run_id, full=True)
                assert info.n_rounds == len(rounds) == summary["rounds"] == store.count_rounds(info.run_id)
                assert [r.index for r in rounds] == list(range(len(rounds)))
                assert store.new_tokens(info.run_id) == summary["new_tokens"]
                assert check_run(info.config, rounds) == []
                assert seen[info.run_id] <= len(rounds)
    assert reads > 0 and seen_running, "the reader never saw a run while it was being recorded"


SLACK = 0.5  # scheduling slack on a loaded CI machine (the commit itself takes time)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kill_9_mid_run_then_the_run_is_interrupted_with_its_committed_rounds(scenario):
    """kill -9 of a process recording into the server (tests/storage/crash_child.py, as in
    test_crash.py for SQLite): at most the last flush interval is lost, and the run ends up
    interrupted, marked by the surviving writer process or else by the next open."""
    with fresh_schema("kill") as url:
        run_id, must_have = kill_mid_run(url, scenario, SLACK)
        check_killed_run(url, run_id, scenario, must_have)


def test_a_version_2_store_on_the_server_is_migrated_and_appends():
    """Schema 3 on PostgreSQL: a store of version 2 (the token list in runs.new_tokens) gets
    its list as a run_tokens chunk; new commits append chunks and increment the counters."""
    from sqlalchemy import text

    with fresh_schema("v2") as url:
        config = synthetic_config(run_id="old-pg")
        rounds = synthetic_rounds(config, 6)
        with TraceStore(url) as store:
            with TraceWriter(store, config, flush_interval=0.01) as writer:
                for rnd in rounds[:3]:
                    writer.write(rnd)
                    writer.flush()
            expected = store.new_tokens("old-pg")
            with store.transaction() as conn:  # back to how version 2 kept it
                conn.execute(text("UPDATE runs SET new_tokens = CAST(:t AS JSON)"), {"t": json.dumps(expected)})
                conn.execute(text("DROP TABLE run_tokens"))
                conn.execute(text("ALTER TABLE runs DROP COLUMN n_new_tokens"))
                conn.execute(text("ALTER TABLE draft_nodes DROP COLUMN confidence"))  # schema 7
                conn.execute(text("ALTER TABLE runs DROP COLUMN stops"))  # schema 6
                conn.execute(text("ALTER TABLE runs DROP COLUMN position_limit"))  # schema 5
                conn.execute(text("ALTER TABLE rounds DROP COLUMN stop"))
                for column in ("tree", "tree_top", "tree_full"):  # schema 4
                    conn.execute(text(f"ALTER TABLE rounds DROP COLUMN {column}"))
                conn.execute(text("DELETE FROM schema_version"))
                conn.execute(text("INSERT INTO schema_version VALUES (2, 'older schema', 0)"))
        with TraceStore(url) as store:
            assert store.schema_version == 7
            assert store.new_tokens("old-pg") == expected and store.get_run("old-pg").n_new_tokens == len(expected)
        more = synthetic_config(run_id="new-pg")
        with TraceStore(url) as store, TraceWriter(store, more, flush_interval=0.01) as writer:
            for rnd in synthetic_rounds(more, 5):
                writer.write(rnd)
                writer.flush()
        with TraceStore(url) as store:
            with store.engine.connect() as conn:
                chunks = conn.execute(text("SELECT count(*) FROM run_tokens WHERE run_id = 'new-pg'")).scalar()
            assert chunks == 5
            assert store.new_tokens("new-pg") == [e.token for r in synthetic_rounds(more, 5) for e in r.emitted]


def test_a_version_3_store_on_the_server_migrates_and_keeps_tree_rounds():
    """Schema 4 on PostgreSQL: a store of version 3 (no tree columns) gets rounds.tree,
    tree_top and tree_full; its runs load as before, and a tree run written afterwards keeps
    its tried order, residual updates and layout, and checks clean."""
    from sqlalchemy import text

    from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.check.checker import check_report
    from tests.tiny_models import noisy_copy, tiny_lm

    with fresh_schema("v3") as url:
        config = synthetic_config(run_id="chain-pg")
        with TraceStore(url) as store:
            with TraceWriter(store, config) as writer:
                for rnd in synthetic_rounds(config, 4):
                    writer.write(rnd)
            before = [r.tokens for r in store.load_rounds("chain-pg")]
            with store.transaction() as conn:  # back to how version 3 kept it
                conn.execute(text("ALTER TABLE draft_nodes DROP COLUMN confidence"))
                conn.execute(text("ALTER TABLE runs DROP COLUMN stops"))
                conn.execute(text("ALTER TABLE runs DROP COLUMN position_limit"))
                conn.execute(text("ALTER TABLE rounds DROP COLUMN stop"))
                for column in ("tree", "tree_top", "tree_full"):
                    conn.execute(text(f"ALTER TABLE rounds DROP COLUMN {column}"))
                conn.execute(text("DELETE FROM schema_version"))
                conn.execute(text("INSERT INTO schema_version VALUES (3, 'older schema', 0)"))
        target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(noisy_copy(target, 0.3), tree="3,2,1", children="sampled"),
            sampling=SamplingConfig(temperature=1.0),
        )
        out = dec.generate([1, 2, 3, 4], 20, seed=4)
        with TraceStore(url) as store:
            assert store.schema_version == 7
            assert [r.tokens for r in store.load_rounds("chain-pg")] == before and len(before) == 4
            with TraceWriter(store, out.config) as writer:
                for rnd in out.rounds:
                    writer.write(rnd)
            back = store.load_rounds(out.config.run_id, full=True)
        assert [r.tree.tried for r in back] == [r.tree.tried for r in out.rounds]
        assert [[(u.parent, u.child, float(u.mass)) for u in r.tree.updates] for r in back] == [
            [(u.parent, u.child, float(u.mass)) for u in r.tree.updates] for r in out.rounds
        ]
        assert [r.tree.kept_rows for r in back] == [r.tree.kept_rows for r in out.rounds]
        assert check_report(out.config, back).findings == []
