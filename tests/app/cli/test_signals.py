"""Ctrl-C, SIGTERM and a full disk during `specscope run --db`, in real processes: one line on
stderr and no traceback, the conventional exit status, decoding stopped at once, and the run
closed in the store with the rounds decoded before (cancelled: status interrupted, stop
reason cancelled; a failed write: status failed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from specscope.storage import TraceStore
from tests.tiny_models import save_pair

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups")

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.05)


def run_args(checkpoints, db) -> list[str]:
    """A run long enough to be stopped while it decodes: k=1 and no EOS give at least 254
    rounds (the tiny target reads 512 positions)."""
    target, draft = checkpoints
    return [
        "run",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompt-ids",
        "1,2,3",
        "--device",
        "cpu",
        "--db",
        str(db),
        "--max-new",
        "509",
        "--k",
        "1",
        "--eos-id",
        "none",
    ]


def as_in_a_terminal() -> None:
    """The child's SIGINT at its default, as a command started from a terminal has it: a job
    started with `&` from a script (CI run as `nohup bash .ci/run &`) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler, so Ctrl-C could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child_env(mode: str = "thread") -> dict[str, str]:
    env = dict(os.environ, SPECSCOPE_TRACE_WRITER=mode, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONWARNINGS", None)
    return env


def stored_rounds(db) -> int:
    """Rounds committed so far (0 while the store or the run does not exist yet)."""
    if not os.path.exists(db):
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT count(*) FROM rounds").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def wait_for_rounds(proc: subprocess.Popen, db, n: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while stored_rounds(db) < n:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (status {proc.returncode}) before {n} rounds were stored:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {n} rounds stored within {TIMEOUT_S} s")
        time.sleep(0.05)


def only_run(db):
    store = TraceStore(str(db), readonly=True)
    try:
        (info,) = store.list_runs()
        return info, store.count_rounds(info.run_id)
    finally:
        store.close()


def specscope_lines(stderr: str) -> list[str]:
    """What specscope itself said (the loader's warning about the draft's tokenizer aside)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("WARNING ")]


# --------------------------------------------------------------------------- Ctrl-C, SIGTERM


@pytest.mark.parametrize(
    "signum, mode, whole_group",
    [
        (signal.SIGINT, "thread", True),  # Ctrl-C in a terminal: the whole process group gets SIGINT
        (signal.SIGINT, "process", True),  # ... the writer process too
        (signal.SIGTERM, "thread", False),  # kill PID
    ],
    ids=["sigint-thread", "sigint-process", "sigterm-thread"],
)
def test_signal_cancels_the_run_keeps_its_rounds_and_exits_quietly(checkpoints, tmp_path, signum, mode, whole_group):
    db = tmp_path / "runs.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specscope.app.cli", *run_args(checkpoints, db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(mode),
        start_new_session=True,
        preexec_fn=as_in_a_terminal,
    )
    try:
        wait_for_rounds(proc, db, 3)
        if whole_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    lines = specscope_lines(err)
    assert len(lines) == 1, err
    m = re.fullmatch(
        r"specscope: cancelled after (\d+) rounds; run (\w+) kept in (.+) as interrupted \(cancelled\) "
        r"with (\d+) rounds",
        lines[0],
    )
    assert m, lines[0]
    decoded, run_id, where, kept = int(m[1]), m[2], m[3], int(m[4])
    assert where == str(db)
    assert out.count("|") == decoded  # the text printed up to the cancel, one marker per round

    info, rounds = only_run(db)
    assert (info.run_id, info.status, info.stop_reason) == (run_id, "interrupted", "cancelled")
    assert info.ended_at is not None
    assert info.error == ("KeyboardInterrupt" if signum == signal.SIGINT else "cancelled by SIGTERM")
    # every round decoded before the signal is stored (the round in progress is dropped)
    assert 3 <= rounds == info.n_rounds == kept == decoded


def test_a_signal_while_a_round_is_stored_and_printed_waits_for_the_rounds_end():
    """The race the subprocess test above can lose: a signal landing between counting a round
    and printing it. The round finishes (counted, stored, shown), then the run is cancelled."""
    from specscope.app.cli.signals import Cancelled, _RunSignals

    signals = _RunSignals()
    handled = []
    with pytest.raises(Cancelled), signals.whole_round():
        handled.append("counted")
        signals.handler(signal.SIGTERM, None)  # as the OS would call it, mid-round
        handled.append("stored and printed")
    assert handled == ["counted", "stored and printed"]
    with pytest.raises(KeyboardInterrupt):  # between rounds: at once
        signals.handler(signal.SIGINT, None)
    with signals.whole_round():  # nothing pending any more
        pass


def test_sigterm_handler_is_restored_after_the_run(checkpoints, tmp_path):
    from specscope.app.cli import main

    before = signal.getsignal(signal.SIGTERM)
    args = run_args(checkpoints, tmp_path / "runs.sqlite")
    args[args.index("--max-new") + 1] = "4"
    assert main(args) == 0
    assert signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------- a full disk

# Runs the CLI with the writer's commits failing as SQLite fails on a full disk, after
# FAIL_AFTER commits (FAIL_AFTER:mark: marking the run failed still works), and writes what it saw to STATS: the
# rounds the decoder had started when
# the write failed, and all it started.
FAILING_WRITES = r"""
import json, sqlite3, sys
from specscope.app.cli import main
from specscope.core.decode.decoder import SpeculativeDecoder
from specscope.storage.writer.sink import RunSink

fail_after, mark = int(sys.argv[1].split(":")[0]), sys.argv[1].endswith(":mark")
stats_path, argv = sys.argv[2], sys.argv[3:]
stats = {"started": 0, "commits": 0, "started_at_failure": None}
real_round, real_commit = SpeculativeDecoder._round, RunSink.commit

def counted_round(self, *args, **kwargs):
    stats["started"] += 1
    return real_round(self, *args, **kwargs)

def failing_commit(self, rounds=(), final=None):
    if stats["commits"] >= fail_after:
        if stats["started_at_failure"] is None:
            stats["started_at_failure"] = stats["started"]
        raise sqlite3.OperationalError("database or disk is full")
    stats["commits"] += 1
    return real_commit(self, rounds, final)

SpeculativeDecoder._round = counted_round
RunSink.commit = failing_commit
if not mark:  # the disk is too full even to mark the run failed
    RunSink.mark = lambda self, status, error: False
try:
    code = main(argv)
finally:
    with open(stats_path, "w") as fh:
        json.dump(stats, fh)
sys.exit(code)
"""

# The same with SQLite's own SQLITE_FULL: every connection may grow the file to MAX_PAGES pages.
PAGE_LIMITED = r"""
import json, sys
from sqlalchemy import event
from sqlalchemy.pool import Pool
from specscope.app.cli import main
from specscope.core.decode.decoder import SpeculativeDecoder

max_pages, stats_path, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
stats = {"started": 0}
real_round = SpeculativeDecoder._round

def counted_round(self, *args, **kwargs):
    stats["started"] += 1
    return real_round(self, *args, **kwargs)

@event.listens_for(Pool, "connect")
def limit_pages(dbapi_connection, record):
    dbapi_connection.execute(f"PRAGMA max_page_count = {max_pages}")

SpeculativeDecoder._round = counted_round
try:
    code = main(argv)
finally:
    with open(stats_path, "w") as fh:
        json.dump(stats, fh)
sys.exit(code)
"""

FAILED_LINE = (
    r"specscope: recording failed after (\d+) rounds, decoding stopped: (.+); run (\w+) marked failed in (.+) "
    r"with (\d+) rounds"
)


def run_script(script: str, arg: int | str, checkpoints, db, tmp_path):
    stats_path = tmp_path / "stats.json"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(arg), str(stats_path), *run_args(checkpoints, db)],
        capture_output=True,
        text=True,
        env=child_env("thread"),
        timeout=TIMEOUT_S,
    )
    return proc, json.loads(stats_path.read_text())


def one_error_line(proc, pattern: str) -> re.Match:
    """The run failed with exit 1 and exactly one specscope line (no traceback) matching `pattern`."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = specscope_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    m = re.fullmatch(pattern, lines[0])
    assert m, lines[0]
    return m


def test_failed_write_stops_decoding_at_once_with_one_line(checkpoints, tmp_path):
    db = tmp_path / "runs.sqlite"
    proc, stats = run_script(FAILING_WRITES, "3:mark", checkpoints, db, tmp_path)
    m = one_error_line(proc, FAILED_LINE)
    decoded, reason, run_id, kept = int(m[1]), m[2], m[3], int(m[5])
    assert reason == "database or disk is full"
    # decoding stops at the round boundary after the failed write, not rounds later
    assert stats["started_at_failure"] is not None
    assert stats["started"] - stats["started_at_failure"] <= 1, stats
    assert decoded == stats["started"]

    info, rounds = only_run(db)
    assert (info.run_id, info.status) == (run_id, "failed")
    assert "database or disk is full" in info.error
    assert rounds == info.n_rounds == kept > 0  # what the three good commits stored
    assert kept < decoded


def test_failed_write_when_the_run_cannot_be_marked_failed_says_so(checkpoints, tmp_path):
    db = tmp_path / "runs.sqlite"
    proc, stats = run_script(FAILING_WRITES, "2", checkpoints, db, tmp_path)
    m = one_error_line(
        proc,
        r"specscope: recording failed after (\d+) rounds, decoding stopped: database or disk is full; "
        r"run (\w+) could not be marked failed in (.+) \(it shows as running until the store is opened "
        r"with room to write, which marks it interrupted\)",
    )
    assert stats["started"] - stats["started_at_failure"] <= 1, stats
    info, rounds = only_run(db)
    assert (info.run_id, info.status, info.n_rounds) == (m[2], "running", rounds)
    # the recording process has gone: the next store opened for writing says so
    store = TraceStore(str(db))
    try:
        assert store.get_run(m[2]).status == "interrupted"
    finally:
        store.close()


def test_sqlite_full_stops_decoding_with_one_line(checkpoints, tmp_path):
    """SQLite's own 'database or disk is full' (the file may not grow past max_page_count),
    through the store's error translation."""
    db = tmp_path / "runs.sqlite"
    proc, stats = run_script(PAGE_LIMITED, 24, checkpoints, db, tmp_path)  # the schema takes 12
    m = one_error_line(proc, FAILED_LINE)
    assert m[2] == "database or disk is full"
    decoded, kept = int(m[1]), int(m[5])
    assert decoded == stats["started"] < 254  # stopped well before the budget
    info, rounds = only_run(db)
    assert info.status == "failed" and rounds == info.n_rounds == kept < decoded


def _mount_tmpfs(path, size: str) -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def test_really_full_disk(checkpoints, tmp_path):
    """A tmpfs of 600 KiB fills up during the run (needs root to mount; skipped otherwise).
    Whether the run can still be marked failed depends on what SQLite can still write: the line
    says which."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "600k"):
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount)")
    try:
        db = mnt / "runs.sqlite"
        proc = subprocess.run(
            [sys.executable, "-m", "specscope.app.cli", *run_args(checkpoints, db)],
            capture_output=True,
            text=True,
            env=child_env("thread"),
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        lines = specscope_lines(proc.stderr)
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("specscope: recording failed after ")
        assert "database or disk is full" in lines[0]
        info, rounds = only_run(db)
        if info.status == "failed":
            assert re.fullmatch(FAILED_LINE, lines[0]) and f"with {rounds} rounds" in lines[0]
        else:
            assert "could not be marked failed" in lines[0]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
