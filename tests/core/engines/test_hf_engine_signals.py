"""Ctrl-C and SIGTERM during `specscope run --engine transformers --db`, in a real process.
The drained run decodes in the main thread, inside transformers' generate(), so the signal
lands there: the run must end as a specscope-engine run does (one line, no traceback, the
conventional status, every round decoded before it stored, the run marked interrupted)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from specscope.storage import TraceStore
from tests.app.cli.test_signals import as_in_a_terminal
from tests.tiny_models import save_pair

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups")

TIMEOUT_S = 120


def _stored_rounds(db) -> int:
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_signal_cancels_a_transformers_run_and_keeps_its_rounds(tmp_path, signum):
    target, draft = save_pair(tmp_path, noise=0.05)
    db = tmp_path / "runs.sqlite"
    args = [
        "run",
        "--engine",
        "transformers",
        "--proposer",
        "draft",
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
    ]  # k=1, no EOS: hundreds of rounds, long enough to be stopped
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "specscope.app.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=as_in_a_terminal,  # SIGINT at its default even where this runs as a background job
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while _stored_rounds(db) < 3:
            assert proc.poll() is None, f"the run ended before 3 rounds were stored: {proc.communicate()[1]}"
            assert time.monotonic() < deadline, "no 3 rounds stored in time"
            time.sleep(0.05)
        os.killpg(proc.pid, signum)  # Ctrl-C in a terminal signals the whole group
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("WARNING ", "[transformers]"))]
    assert len(lines) == 1, err
    m = re.fullmatch(
        r"specscope: cancelled after (\d+) rounds; run (\w+) kept in (.+) as interrupted \(cancelled\) "
        r"with (\d+) rounds",
        lines[0],
    )
    assert m, lines[0]
    decoded, kept = int(m[1]), int(m[4])
    store = TraceStore(str(db), readonly=True)
    try:
        (info,) = store.list_runs()
        stored = store.count_rounds(info.run_id)
    finally:
        store.close()
    assert (info.status, info.stop_reason) == ("interrupted", "cancelled")
    assert 3 <= stored == kept == decoded < 509
    assert out.count("|") == decoded
