"""kill -9 of a process recording into a store (tests/storage/crash_child.py), shared by the
SQLite crash test and its PostgreSQL twin: start the child, kill it mid-run as the scenario
says, then check what the store kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from specscope.storage import TraceStore

FLUSH = 0.25
SCENARIOS = ["thread", "process: recording process killed", "process: both killed"]


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{pid}/stat", "rb") as fh:
            if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not exit")


def kill_mid_run(location: str, scenario: str, slack: float) -> tuple[str, list[int]]:
    """Record 200+ rounds in a child, kill it as `scenario` says; return the run id and the
    rounds whose write() returned more than one flush interval (+ slack) before the kill."""
    mode = scenario.split(":")[0]
    child = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "crash_child.py"), location, str(FLUSH), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        first = child.stdout.readline().split()
        assert first and first[0] == "ready", child.stderr.read()
        run_id, writer_pid = first[1], int(first[2])
        written: dict[int, float] = {}
        while len(written) < 200:
            line = child.stdout.readline()
            assert line, child.stderr.read()
            i, t = line.split()
            written[int(i)] = float(t)
        with TraceStore(location) as reader:  # a reader in another process sees the run while it is written
            assert reader.get_run(run_id).status == "running"
            assert reader.recovered == []
        killed_at = time.monotonic()
        if scenario == "process: both killed":
            os.killpg(child.pid, signal.SIGKILL)
        else:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        if writer_pid:
            wait_gone(writer_pid)  # the writer process stores what it received, then exits
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    must_have = [i for i, t in written.items() if t < killed_at - FLUSH - slack]
    assert must_have, "the child wrote too slowly for the test to mean anything"
    return run_id, must_have


def check_killed_run(location: str, run_id: str, scenario: str, must_have: list[int]) -> None:
    """The run is interrupted (marked by the surviving writer process, else by this first
    open), holds every round written before the last flush interval, complete, and is
    recovered once."""
    with TraceStore(location) as store:
        info = store.get_run(run_id)
        assert info.status == "interrupted" and info.ended_at is not None
        if scenario == "process: recording process killed":
            assert store.recovered == [] and "ended without finishing" in info.error
        else:
            assert store.recovered == [run_id]
        stored = store.count_rounds(run_id)
        assert stored >= max(must_have) + 1, (
            f"lost rounds before the last flush interval: stored {stored}, needed {max(must_have) + 1}"
        )
        assert info.n_rounds == stored  # aggregates committed with the rounds
        rounds = store.load_rounds(run_id)  # every stored round complete, with its nodes
        assert [r.index for r in rounds] == list(range(stored))
        assert all(len(r.nodes) == 4 for r in rounds)
        tokens = [e.token for r in rounds for e in r.emitted]
        assert info.n_new_tokens == len(tokens) and store.new_tokens(run_id) == tokens
    with TraceStore(location) as again:  # recovery happens once
        assert again.recovered == [] and again.get_run(run_id).status == "interrupted"
