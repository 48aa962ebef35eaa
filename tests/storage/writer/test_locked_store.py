"""A store that another process keeps locked for longer than SQLite's busy timeout (issue 43,
item 1): the writer keeps the rounds, says that it waits, stores every one when the lock
clears, and past its own wait writes the whole run to a JSONL file that import takes.

The waits are made short with SPECSCOPE_BUSY_TIMEOUT_S and SPECSCOPE_LOCK_WAIT_S; the lock
is held by a second process (BEGIN IMMEDIATE), as another specscope or a sqlite3 shell would."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from specscope.storage import TraceStore, TraceWriter
from specscope.storage.jsonl.transfer import import_run
from specscope.storage.writer.process import close_writer_process
from tests.storage.conftest import PROMPT
from tests.storage.helpers import assert_rounds_equal

HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


def hold_lock(path, seconds: float) -> subprocess.Popen:
    """A second process that holds the store's write lock for `seconds` (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture
def short_waits(monkeypatch):
    monkeypatch.setenv("SPECSCOPE_BUSY_TIMEOUT_S", "0.3")
    close_writer_process()  # a writer process reads the timeouts when it starts
    yield
    close_writer_process()


def decoded(make_decoder, n: int = 60):
    decoder = make_decoder("sampled")
    config = decoder.run_config(PROMPT, n)
    rounds = []
    result = decoder.start(PROMPT, n, config=config).drain(rounds.append)
    return config, rounds, result


def raw_status(path, run_id: str) -> tuple[str, int]:
    import sqlite3

    con = sqlite3.connect(path)
    try:
        (status,) = con.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        (n,) = con.execute("SELECT count(*) FROM rounds WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        con.close()
    return status, n


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_lock_longer_than_the_busy_timeout_loses_no_round(tmp_path, make_decoder, short_waits, mode):
    config, rounds, result = decoded(make_decoder)
    path = tmp_path / "locked.sqlite"
    told = []
    store = TraceStore(path)
    writer = TraceWriter(store, config, flush_interval=0.05, mode=mode, on_wait=told.append)
    half = len(rounds) // 3
    for rnd in rounds[:half]:
        writer.write(rnd)
    writer.flush()
    assert raw_status(path, config.run_id) == ("running", half)
    holder = hold_lock(path, 2.5)
    try:
        for rnd in rounds[half:]:  # decoding goes on while the lock is held
            writer.write(rnd)
            time.sleep(1.0 / len(rounds))
        assert raw_status(path, config.run_id) == ("running", half)  # nothing got in
        writer.finish_with(result)  # waits for the lock, then stores everything
    finally:
        holder.wait(10)
        store.close()
    assert raw_status(path, config.run_id) == ("completed", len(rounds))
    assert writer.spilled_to is None and writer.error is None
    states = [s.state for s in told]
    assert "waiting" in states and states[-1] == "resumed", states
    assert max(s.rounds_waiting for s in told) > 0
    assert told[-1].waited_s >= 1.0
    with TraceStore(path, readonly=True) as again:
        for a, b in zip(rounds, again.load_rounds(config.run_id)):
            assert_rounds_equal(a, b, atol=1e-3, vectors=False)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_past_the_writers_wait_the_run_goes_whole_to_a_jsonl_file(
    tmp_path, make_decoder, short_waits, monkeypatch, mode
):
    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "1")
    config, rounds, result = decoded(make_decoder)
    path = tmp_path / "locked.sqlite"
    told = []
    store = TraceStore(path)
    writer = TraceWriter(store, config, flush_interval=0.05, mode=mode, on_wait=told.append)
    half = len(rounds) // 3
    for rnd in rounds[:half]:
        writer.write(rnd)
    writer.flush()
    holder = hold_lock(path, 6)
    try:
        for rnd in rounds[half:]:
            writer.write(rnd)
            time.sleep(2.0 / len(rounds))
        writer.finish_with(result)
        spill = writer.spilled_to
        assert spill is not None and spill.startswith(str(path) + ".") and spill.endswith(".jsonl"), spill
        assert told[-1].state == "spilled" and told[-1].path == spill
        assert config.run_id in writer.spill_note() and "specscope import" in writer.spill_note()
    finally:
        holder.wait(10)
        store.close()
    with TraceStore(tmp_path / "imported.sqlite") as other:  # the file holds the whole run
        run_id = import_run(other, spill)
        info = other.get_run(run_id)
        assert (info.status, info.n_rounds, other.count_rounds(run_id)) == ("completed", len(rounds), len(rounds))
        assert other.new_tokens(run_id) == list(result.new_tokens)
        for a, b in zip(rounds, other.load_rounds(run_id)):
            assert_rounds_equal(a, b, atol=1e-3, vectors=False)
    with TraceStore(path) as again:  # the store's own copy is never left running
        assert again.get_run(config.run_id).status == "interrupted"
        assert again.count_rounds(config.run_id) == half


@pytest.mark.parametrize("how", ["give_up_waiting", "fail"])
def test_an_interrupted_wait_writes_the_file_at_once(tmp_path, make_decoder, short_waits, how):
    config, rounds, result = decoded(make_decoder, 20)
    path = tmp_path / "locked.sqlite"
    store = TraceStore(path)
    writer = TraceWriter(store, config, flush_interval=0.05, mode="thread")
    holder = hold_lock(path, 30)
    try:
        for rnd in rounds:
            writer.write(rnd)
        time.sleep(0.8)
        started = time.monotonic()
        if how == "fail":  # Ctrl-C or SIGTERM while the store is locked: the run is cancelled
            writer.fail(KeyboardInterrupt())
        else:  # Ctrl-C while finish() waits for the lock
            writer.give_up_waiting()
            writer.finish_with(result)
        assert time.monotonic() - started < 10
        assert writer.spilled_to is not None
    finally:
        holder.kill()
        holder.wait(10)
        store.close()
    with TraceStore(tmp_path / "imported.sqlite") as other:
        assert other.count_rounds(import_run(other, writer.spilled_to)) == len(rounds)


def test_the_waits_are_checked(monkeypatch):
    from specscope.storage import TraceStoreError
    from specscope.storage.engine import busy_timeout_ms
    from specscope.storage.writer.sink import lock_wait_s

    monkeypatch.setenv("SPECSCOPE_BUSY_TIMEOUT_S", "2.5")
    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "7")
    assert (busy_timeout_ms(), lock_wait_s()) == (2500, 7.0)
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", bad)
        with pytest.raises(TraceStoreError, match="SPECSCOPE_LOCK_WAIT_S"):
            lock_wait_s()


def test_a_store_locked_when_the_run_starts_is_waited_for(tmp_path, make_decoder, short_waits):
    config, rounds, result = decoded(make_decoder, 10)
    path = tmp_path / "locked.sqlite"
    told = []
    store = TraceStore(path)
    holder = hold_lock(path, 1.5)
    try:
        with TraceWriter(store, config, mode="thread", on_wait=told.append) as writer:
            writer.record(_replay(rounds, result))
    finally:
        holder.wait(10)
        store.close()
    assert told and told[0].state == "waiting"
    assert raw_status(path, config.run_id) == ("completed", len(rounds))


def _replay(rounds, result):
    yield from rounds
    return result


def _spill_files(tmp_path):
    return sorted(tmp_path.glob("*.jsonl"))


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_store_locked_past_the_wait_when_the_run_starts_sends_the_whole_run_to_a_file(
    tmp_path, make_decoder, short_waits, monkeypatch, mode
):
    """The run row never gets in: the run is recorded all the same, to the file a lock met
    later sends it to, told the same way, and import puts it in the store under its own id."""
    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "1")
    config, rounds, result = decoded(make_decoder)
    path = tmp_path / "locked.sqlite"
    told = []
    store = TraceStore(path)
    holder = hold_lock(path, 60)
    try:
        writer = TraceWriter(store, config, flush_interval=0.05, mode=mode, on_wait=told.append)
        spill = writer.spilled_to
        assert spill is not None and spill.startswith(str(path) + ".") and spill.endswith(".jsonl"), spill
        assert told[0].state == "waiting" and told[-1].state == "spilled" and told[-1].path == spill
        assert told[-1].waited_s >= 1.0 and "locked" in told[-1].reason
        for rnd in rounds:  # decoding goes on
            writer.write(rnd)
        writer.finish_with(result)
        assert writer.error is None and writer.spilled_to == spill and writer.lock_state.state == "spilled"
        assert [s.state for s in told].count("spilled") == 1
        note = writer.spill_note()
        assert spill in note and f"specscope import {spill} --db" in note and "holds none of it" in note, note
    finally:
        holder.kill()
        holder.wait(10)
        store.close()
    assert _spill_files(tmp_path) == [path.parent / spill.rsplit("/", 1)[1]]
    with TraceStore(path) as again:  # the store never had the run; it takes the file under the run's own id
        assert config.run_id not in [r.run_id for r in again.list_runs()]
        assert import_run(again, spill) == config.run_id
        info = again.get_run(config.run_id)
        assert (info.status, info.stop_reason, info.n_rounds) == ("completed", result.stop_reason, len(rounds))
        assert again.count_rounds(config.run_id) == len(rounds)
        assert info.config == config and info.started_at == writer.started_at  # the run row, whole
        assert (info.top_n, info.full_vectors) == (writer.policy.top_n, writer.policy.full)
        assert again.new_tokens(config.run_id) == list(result.new_tokens)
        for a, b in zip(rounds, again.load_rounds(config.run_id)):
            assert_rounds_equal(a, b, atol=1e-3, vectors=False)


def test_a_run_cancelled_in_a_store_locked_from_its_start_ends_in_its_file(
    tmp_path, make_decoder, short_waits, monkeypatch
):
    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "0.5")
    config, rounds, result = decoded(make_decoder, 20)
    path = tmp_path / "locked.sqlite"
    store = TraceStore(path)
    holder = hold_lock(path, 60)
    try:
        writer = TraceWriter(store, config, flush_interval=0.05, mode="thread")
        for rnd in rounds[:5]:
            writer.write(rnd)
        writer.fail(KeyboardInterrupt())
    finally:
        holder.kill()
        holder.wait(10)
        store.close()
    with TraceStore(tmp_path / "imported.sqlite") as other:
        info = other.get_run(import_run(other, writer.spilled_to))
        assert (info.status, info.stop_reason, info.n_rounds) == ("interrupted", "cancelled", 5)


def test_other_errors_at_the_start_of_a_run_still_raise(tmp_path, make_decoder, short_waits, monkeypatch):
    """Only a lock sends a run to a file: a store that cannot take it for another reason says so."""
    from specscope.storage import RunExistsError, TraceStoreError

    monkeypatch.setenv("SPECSCOPE_LOCK_WAIT_S", "0.5")
    config, _, _ = decoded(make_decoder, 4)
    path = tmp_path / "store.sqlite"
    TraceStore(path).close()
    with TraceStore(path, readonly=True) as ro, pytest.raises(TraceStoreError, match="readonly database"):
        TraceWriter(ro, config, mode="thread")
    with TraceStore(path) as store:
        TraceWriter(store, config, mode="thread").finish()
        with pytest.raises(RunExistsError, match="already stored"):
            TraceWriter(store, config, mode="thread")
    assert _spill_files(tmp_path) == []


CLI_RUN = ["run", "--proposer", "lookup", "--prompt", "Hello", "--k", "1", "--temperature", "1.5", "--eos-id", "none"]


def test_the_cli_records_a_run_whose_store_is_locked_from_its_start_to_a_file(tmp_path):
    """`specscope run --db` on a store locked past the writer's wait: the run is decoded, goes to
    a file and the last line names it, as for a lock met later (exit status 1, the run not being
    in the store: tests/app/cli/test_store_reliability.py); no traceback."""
    import json
    import os

    path = tmp_path / "locked.sqlite"
    TraceStore(path).close()
    env = dict(os.environ, SPECSCOPE_BUSY_TIMEOUT_S="0.3", SPECSCOPE_LOCK_WAIT_S="1")
    holder = hold_lock(path, 120)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "specscope.app.cli", *CLI_RUN, "--max-new", "20", "--json", "--db", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        holder.kill()
        holder.wait(10)
    err = run.stderr
    assert run.returncode == 1 and "Traceback" not in err, err[-2000:]
    [spill] = _spill_files(tmp_path)
    assert f"-- {path} stayed locked" in err and f"the run goes to {spill} instead" in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("specscope: ") and f"specscope import {spill} --db {path}" in last, last
    decoded_rounds = json.loads(run.stdout)["rounds"]
    with TraceStore(path) as store:
        run_id = import_run(store, spill)
        assert store.get_run(run_id).status == "completed"
        assert store.count_rounds(run_id) == decoded_rounds > 0
