"""Issue 43, fourth reliability pass, through the real CLI: a store locked by another process
for longer than the writer waits, a store written by a newer specscope, an output encoding
that cannot show the text."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specscope.app.cli import main
from specscope.storage import SCHEMA_VERSION, TraceStore
from tests.app.cli.test_reliability_stores import READERS, cli, make_store, one_line, trace_file

SPECSCOPE = [sys.executable, "-m", "specscope.app.cli"]
# a run of about one round per token (lookup rarely matches sampled text): a round stream
RUN = ["run", "--proposer", "lookup", "--prompt", "Hello", "--k", "1", "--temperature", "1.5", "--eos-id", "none"]

HOLDER = """
import sqlite3, sys, time
db, seconds = sys.argv[1], float(sys.argv[2])
while True:  # until the run has stored its first rounds
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        n = con.execute("SELECT count(*) FROM rounds").fetchone()[0]
        con.close()
        if n:
            break
    except sqlite3.Error:
        pass
    time.sleep(0.05)
con = sqlite3.connect(db, isolation_level=None, timeout=30)
con.execute("BEGIN IMMEDIATE")
print(n, flush=True)
time.sleep(seconds)
con.execute("ROLLBACK")
"""


def status_and_rounds(db: Path) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(
            "SELECT r.status, r.n_rounds, (SELECT count(*) FROM rounds WHERE rounds.run_id = r.run_id) "
            "FROM runs r ORDER BY started_at"
        ).fetchall()
    finally:
        con.close()


def run_while_locked(tmp_path: Path, hold_s: float, env: dict, max_new: int = 80):
    """`specscope run --db` in a child process while another process holds the store's write
    lock for hold_s seconds (taken once the run has stored rounds)."""
    db = tmp_path / "locked.sqlite"
    env = dict(os.environ, **env)
    run = subprocess.Popen(
        SPECSCOPE + RUN + ["--max-new", str(max_new), "--json", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(hold_s)], stdout=subprocess.PIPE, text=True)
    out, err = run.communicate(timeout=300)
    holder.communicate(timeout=60)
    return run.returncode, out, err, db


def test_a_run_outlasts_a_lock_longer_than_the_busy_timeout(tmp_path):
    code, out, err, db = run_while_locked(tmp_path, 4, {"SPECSCOPE_BUSY_TIMEOUT_S": "0.5"})
    assert code == 0, err[-2000:]
    decoded = json.loads(out)["rounds"]
    assert status_and_rounds(db) == [("completed", decoded, decoded)]
    assert "is locked by another connection" in err and "rounds kept in memory" in err, err
    assert "is free again" in err and "Traceback" not in err


def test_past_the_writers_wait_the_rounds_go_to_a_file_import_takes(tmp_path, capsys):
    code, out, err, db = run_while_locked(
        tmp_path, 8, {"SPECSCOPE_BUSY_TIMEOUT_S": "0.5", "SPECSCOPE_LOCK_WAIT_S": "1.5"}
    )
    assert code == 1 and "Traceback" not in err, err[-2000:]
    decoded = json.loads(out)["rounds"]
    last = err.strip().splitlines()[-1]
    spilled = sorted(tmp_path.glob("locked.sqlite.*.jsonl"))
    assert len(spilled) == 1 and str(spilled[0]) in last and "specscope import" in last, last
    [(_, kept, rows)] = status_and_rounds(db)
    assert kept == rows < decoded
    # never left running: the writer marks it when the lock clears in time, else a reader shows it interrupted
    # (its writer is gone) and the next writer to open the store marks it
    code, out, _ = cli(capsys, "runs", db, "--json")
    assert code == 0 and json.loads(out)["status"] == "interrupted"
    code, _, _ = cli(capsys, "import", spilled[0], "--db", db, "--run-id", "whole")
    assert code == 0
    assert status_and_rounds(db) == [("interrupted", kept, kept), ("completed", decoded, decoded)]


# ---------------------------------------------------------------------------- 2. a newer store


def newer_store(tmp_path: Path, capsys, extra_column: bool = False) -> Path:
    db = make_store(tmp_path / "newer.sqlite", capsys)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO schema_version VALUES (?, 'from a newer specscope', 0)", (SCHEMA_VERSION + 1,))
    if extra_column:
        con.execute("ALTER TABLE runs ADD COLUMN colour TEXT")
    con.commit()
    con.close()
    return db


def digest(path: Path) -> bytes:
    return path.read_bytes()


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:1] + a[2:]))
def test_readers_of_a_newer_store_say_so_in_one_line_and_read_it(tmp_path, capsys, argv):
    db = newer_store(tmp_path, capsys, extra_column=True)
    before = digest(db)
    code, out, err = cli(capsys, *[a.format(db=db) for a in argv])
    assert code == 0, err
    assert one_line(err) == (
        f"specscope: note: {db} was written by a newer specscope (schema version "
        f"{SCHEMA_VERSION + 1}; this one knows {SCHEMA_VERSION}): reading what this version "
        f"understands, writing nothing"
    )
    assert out and digest(db) == before


def test_a_newer_store_without_what_this_version_reads_is_refused(tmp_path, capsys):
    db = newer_store(tmp_path, capsys)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE runs RENAME COLUMN k TO draft_length")
    con.commit()
    con.close()
    code, _, err = cli(capsys, "runs", db)
    assert code == 2 and "lacks what this version reads (runs.k)" in one_line(err)


def test_writers_refuse_a_newer_store(tmp_path, capsys):
    db = newer_store(tmp_path, capsys)
    before = digest(db)
    code, _, err = cli(capsys, "import", trace_file(tmp_path, "other"), "--db", db)
    assert code == 2 and "newer than this specscope knows" in one_line(err) and str(db) in err
    started = time.monotonic()
    code, _, err = cli(capsys, "run", "--prompt-ids", "1,2", "--max-new", "4", "--db", db)
    assert code == 2 and one_line(err).startswith(f"specscope: --db: {db}: the store has schema version")
    assert digest(db) == before
    with TraceStore(db, readonly=True) as store:
        assert [r.run_id for r in store.list_runs()] == ["ok"]
    assert time.monotonic() - started < 30  # refused before any model loads


def test_an_extra_column_under_a_known_version_is_read_and_written(tmp_path, capsys):
    db = make_store(tmp_path / "extra.sqlite", capsys)
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE runs ADD COLUMN colour TEXT")
    con.commit()
    con.close()
    code, out, err = cli(capsys, "runs", db)
    assert code == 0 and err == "" and "ok" in out
    assert cli(capsys, "import", trace_file(tmp_path, "two"), "--db", db)[0] == 0


# ---------------------------------------------------------------------------- 4. output encoding


def test_an_ascii_terminal_prints_escapes_and_the_run_completes(tmp_path):
    db = tmp_path / "ascii.sqlite"
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    prompt = "caf\u00e9 \U0001f642 na\u00efve"
    proc = subprocess.run(
        SPECSCOPE + ["run", "--prompt", prompt, "--max-new", "8", "--db", str(db)],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.decode("ascii")  # nothing but ASCII reached the terminal
    assert "\\U0001f642" in out and "caf\\xe9" in out
    assert [row[0] for row in status_and_rounds(db)] == ["completed"]
    for argv in (["show", str(db), "last"], ["runs", str(db), "--json"], ["export", str(db), "last", "-o", "-"]):
        shown = subprocess.run(SPECSCOPE + argv, capture_output=True, env=env, timeout=120)
        assert shown.returncode == 0 and b"Traceback" not in shown.stderr, (argv, shown.stderr[-1000:])
        shown.stdout.decode("ascii")


class StrictAscii:
    """A stdout whose encoding cannot show the text and which cannot be reconfigured."""

    encoding = "ascii"

    def write(self, text: str) -> int:
        text.encode("ascii")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_an_error_in_printing_never_leaves_a_run_running(tmp_path, capsys, monkeypatch):
    db = tmp_path / "half.sqlite"
    monkeypatch.setattr(sys, "stdout", StrictAscii())
    code = main(["run", "--prompt", "\U0001f642", "--max-new", "4", "--db", str(db)])
    assert code == 2 and "codec can't encode" in one_line(capsys.readouterr().err)
    [(status, _, _)] = status_and_rounds(db)
    assert status == "failed"
