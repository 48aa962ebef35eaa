"""No command destroys a store, and every path means that file (issue 33): outputs never
replace a trace store (or any SQLite file), and another file only with --force; a plain
path is a file name whatever characters it holds; in-memory and empty locations are refused;
every reading command works on a store it can only read and changes nothing; a closed pipe
ends a command quietly; a file where a folder should be is one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest

from specscope.app.cli import main
from specscope.storage import TraceStore, TraceStoreError, export_run
from specscope.storage.jsonl.trace_file import TraceFile

HEADER = {
    "format": "specscope-trace",
    "version": 1,
    "record": "run",
    "run_id": "ok",
    "prompt_ids": [1, 2],
    "config": {"max_new_tokens": 4, "k": 2, "vocab_size": 8},
}
ROUND = {
    "record": "round",
    "index": 0,
    "nodes": [{"token": 1, "status": "accepted", "p": {"top_ids": [1, 0], "top_probs": [0.75, 0.25]}}],
    "emitted": [{"token": 1, "kind": "accepted"}, {"token": 3, "kind": "bonus"}],
}
READERS = [
    ["runs", "{db}"],
    ["show", "{db}", "last"],
    ["show", "{db}", "last", "--round", "0"],
    ["check", "{db}"],
    ["diff", "{db}", "ok", "ok"],
    ["export", "{db}", "last", "-o", "-"],
    ["runs", "{db}", "--json"],
]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def no_window(monkeypatch) -> None:
    """`specscope open` must refuse before any window: launching one fails the test."""

    def launch(*_a, **_k):
        raise AssertionError("the window was opened")

    try:
        import specscope.app.gui as gui
    except ImportError:  # no Qt: nothing could open a window anyway
        return
    monkeypatch.setattr(gui, "launch", launch)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def trace_file(folder: Path, run_id: str = "ok") -> Path:
    path = folder / f"{run_id}.jsonl"
    path.write_text(json.dumps({**HEADER, "run_id": run_id}) + "\n" + json.dumps(ROUND) + "\n")
    return path


def make_store(path: Path, capsys) -> Path:
    assert cli(capsys, "import", trace_file(path.parent), "--db", path)[0] == 0
    return path


def digest(path: Path) -> tuple[str, float]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------------------- 1. outputs


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_export_never_writes_over_a_store(tmp_path, capsys, force):
    store = make_store(tmp_path / "store.sqlite", capsys)
    other = make_store(tmp_path / "other.sqlite", capsys)
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    for target in (store, other, foreign):
        before = digest(target)
        code, out, err = cli(capsys, "export", store, "last", "-o", target, *force)
        assert code == 1 and "SQLite database" in one_line(err) and "never" in err
        assert digest(target) == before
        with TraceStore(store, readonly=True) as s:
            assert [r.run_id for r in s.list_runs()] == ["ok"]


def test_export_replaces_another_file_only_with_force(tmp_path, capsys):
    store = make_store(tmp_path / "store.sqlite", capsys)
    out = tmp_path / "notes.txt"
    out.write_text("keep me")
    code, _, err = cli(capsys, "export", store, "last", "-o", out)
    assert code == 1 and "already exists; pass --force" in one_line(err)
    assert out.read_text() == "keep me"
    assert cli(capsys, "export", store, "last", "-o", out, "--force")[0] == 0
    assert out.read_text().startswith('{"format":"specscope-trace"')
    assert files_in(tmp_path) == ["notes.txt", "ok.jsonl", "store.sqlite"]  # no temporary file left


def test_the_storage_functions_refuse_a_store_too(tmp_path, capsys):
    """The GUI's export dialog confirms an overwrite itself (overwrite=True), and TraceFile
    writes a path: neither replaces a store."""
    store = make_store(tmp_path / "store.sqlite", capsys)
    other = make_store(tmp_path / "other.sqlite", capsys)
    before = digest(other)
    with TraceStore(store, readonly=True) as s, pytest.raises(TraceStoreError, match="SQLite database"):
        export_run(s, "ok", other, overwrite=True)
    with pytest.raises(TraceStoreError, match="SQLite database"):
        TraceFile(other, prompt_ids=[1], vocab_size=8, k=1, max_new_tokens=1)
    assert digest(other) == before


def test_bench_markdown_keeps_a_file_it_did_not_write(tmp_path, capsys):
    store = make_store(tmp_path / "store.sqlite", capsys)
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    for target, force, why in ((store, ["--force"], "SQLite database"), (readme, [], "pass --force")):
        before = digest(target)
        code, _, err = cli(capsys, "bench", "--from-json", tmp_path / "none.json", "--markdown", target, *force)
        assert code == 1 and why in err.strip().splitlines()[-1] and "Traceback" not in err
        assert digest(target) == before


# ---------------------------------------------------------------------------- 2. paths


@pytest.mark.parametrize("name", ["a?b.sqlite", "p%41.sqlite", "x#y.sqlite", "sp ace;&=.sqlite"])
def test_a_path_names_exactly_that_file(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "import", trace_file(tmp_path), "--db", name)[0] == 0
    assert files_in(tmp_path) == sorted([name, "ok.jsonl"])
    code, out, _ = cli(capsys, "runs", name, "--json")
    assert code == 0 and json.loads(out)["run_id"] == "ok"
    assert cli(capsys, "check", name)[0] == 0
    monkeypatch.setenv("SPECSCOPE_DB", name)  # the default location is a path as well
    assert cli(capsys, "import", trace_file(tmp_path, "two"))[0] == 0
    assert files_in(tmp_path) == sorted([name, "ok.jsonl", "two.jsonl"])


@pytest.mark.parametrize("where", ["sqlite://", "sqlite:///:memory:", ""])
@pytest.mark.parametrize(
    "command", [["import", "{trace}", "--db", "{db}"], ["runs", "{db}"], ["check", "{db}"], ["open", "{db}"]]
)
def test_in_memory_and_empty_locations_are_refused(tmp_path, capsys, monkeypatch, where, command):
    monkeypatch.chdir(tmp_path)
    no_window(monkeypatch)
    trace = trace_file(tmp_path)
    code, _, err = cli(capsys, *[a.format(db=where, trace=trace) for a in command])
    line = one_line(err)
    assert code == 2 and ("in-memory" in line or "empty" in line)
    assert files_in(tmp_path) == ["ok.jsonl"]


def test_an_in_memory_default_store_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_DB", "sqlite://")
    code, _, err = cli(capsys, "import", trace_file(tmp_path))
    assert code == 2 and "in-memory" in one_line(err)


def test_run_refuses_an_empty_or_in_memory_db_before_decoding(capsys):
    for where in ("", "sqlite://"):
        code, out, err = cli(capsys, "run", "--device", "cpu", "--prompt-ids", "1,2", "--db", where)
        assert code == 2 and one_line(err).startswith("specscope: --db: ") and out == ""


# ---------------------------------------------------------------------------- 3. read-only


def test_reading_commands_change_nothing(tmp_path, capsys):
    """Every reader opens the store read-only: bytes and mtime unchanged, no -wal/-shm left."""
    db = make_store(tmp_path / "store.sqlite", capsys)
    before, listing = digest(db), files_in(tmp_path)
    for argv in READERS:
        code, _, err = cli(capsys, *[a.format(db=db) for a in argv])
        assert code == 0, (argv, err)
        assert digest(db) == before and files_in(tmp_path) == listing, argv


def test_a_reader_leaves_an_empty_sqlite_file_alone(tmp_path, capsys):
    empty = tmp_path / "empty.db"
    con = sqlite3.connect(empty)
    con.execute("CREATE TABLE t (x)")
    con.execute("DROP TABLE t")
    con.close()
    before = digest(empty)
    for argv in READERS:
        code, _, err = cli(capsys, *[a.format(db=empty) for a in argv])
        assert code in (1, 2) and "without tables, not a trace store" in one_line(err)
    assert digest(empty) == before


def test_a_reader_sees_a_dead_writer_without_writing_it(tmp_path, capsys):
    db = make_store(tmp_path / "store.sqlite", capsys)
    con = sqlite3.connect(db)
    con.execute(
        "UPDATE runs SET status = 'running', ended_at = NULL, writer_host = 'elsewhere', writer_pid = 1, "
        "heartbeat_at = 1"
    )
    con.commit()
    con.close()
    before = digest(db)
    code, out, _ = cli(capsys, "runs", db, "--json")
    assert code == 0 and json.loads(out)["status"] == "interrupted"
    assert digest(db) == before


def _as_nobody(argv: list[str]) -> tuple[int, str]:
    """main(argv) in a forked child that runs as user nobody (root ignores file modes)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            os.dup2(write, 1)
            os.dup2(write, 2)
            code = main(argv)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - reported through the exit status
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    out = b""
    while chunk := os.read(read, 1 << 16):
        out += chunk
    os.close(read)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode(errors="replace")


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to become nobody")
def test_a_store_only_readable_by_this_user_reads(tmp_path, capsys):
    import gettext  # noqa: F401 - the child may not read the standard library's folder
    import locale  # noqa: F401

    writable = make_store(tmp_path / "store.sqlite", capsys)
    folder = Path(tempfile.mkdtemp(prefix="specscope-ro-"))
    try:
        db = folder / "store.sqlite"
        shutil.copy(writable, db)
        os.chmod(db, 0o444)
        os.chmod(folder, 0o555)
        for argv in READERS:  # every module the child needs is imported here, as root, first
            assert cli(capsys, *[a.format(db=writable) for a in argv])[0] == 0
        before, listing = digest(db), files_in(folder)
        for argv in READERS:
            code, out = _as_nobody([a.format(db=db) for a in argv])
            assert code == 0 and "Traceback" not in out and "readonly" not in out, (argv, out)
        assert digest(db) == before and files_in(folder) == listing
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def test_a_write_ahead_log_a_reader_cannot_replay_is_said(tmp_path, monkeypatch):
    """mode=ro fails when the log needs write access: the message names the -wal file."""
    import specscope.storage.engine as engine

    db = tmp_path / "s.sqlite"
    db.write_bytes(b"")
    (tmp_path / "s.sqlite-wal").write_bytes(b"x")

    def refuse(*_a, **_k):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(engine.sqlite3, "connect", refuse)
    with pytest.raises(TraceStoreError, match=r"write-ahead log s\.sqlite-wal .* write access"):
        engine.connect_readonly(str(db))


# ---------------------------------------------------------------------------- 5. pipes


def test_a_closed_pipe_ends_quietly(tmp_path, capsys):
    import subprocess

    db = make_store(tmp_path / "store.sqlite", capsys)
    big = tmp_path / "big.jsonl"
    big.write_text(
        json.dumps({**HEADER, "run_id": "big", "config": {**HEADER["config"], "max_new_tokens": 40000}})
        + "\n"
        + "".join(json.dumps({**ROUND, "index": i}) + "\n" for i in range(20000))
    )
    assert cli(capsys, "import", big, "--db", db)[0] == 0
    cli_cmd = f"{sys.executable} -m specscope.app.cli"
    for command in (f"show {db} big", f"export {db} big -o -", f"runs {db}", f"show {db} big --json"):
        proc = subprocess.run(
            ["bash", "-c", f"{cli_cmd} {command} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}} >&2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.stderr.strip() in ("0", "141"), (command, proc.stderr)


# ---------------------------------------------------------------------------- 6. a file as a folder


@pytest.mark.parametrize(
    "command",
    [
        ["import", "{trace}", "--db", "{db}"],
        ["runs", "{db}"],
        ["run", "--device", "cpu", "--prompt-ids", "1,2", "--max-new", "2", "--db", "{db}"],
    ],
)
def test_a_file_where_a_folder_should_be_is_one_line(tmp_path, capsys, command):
    (tmp_path / "file").write_text("x")
    db = tmp_path / "file" / "x.sqlite"
    code, _, err = cli(capsys, *[a.format(db=db, trace=trace_file(tmp_path)) for a in command])
    assert code in (1, 2) and one_line(err)
    assert (tmp_path / "file").read_text() == "x"


# ---------------------------------------------------------------------------- 4. no home directory


@pytest.fixture
def no_home(monkeypatch):
    """HOME unset and no passwd entry for this user: Path.home() raises."""
    import pwd

    def missing(_uid):
        raise KeyError("getpwuid(): uid not found")

    for name in ("HOME", "SPECSCOPE_DB", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", missing)
    with pytest.raises(RuntimeError):
        Path.home()


def test_without_a_home_only_the_default_store_fails(tmp_path, capsys, no_home):
    for argv in (["--help"], ["import", "--help"], ["runs", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
    assert "no home directory" in capsys.readouterr().out
    db = make_store(tmp_path / "store.sqlite", capsys)  # an explicit --db needs no home
    assert cli(capsys, "runs", db)[0] == 0 and cli(capsys, "check", db)[0] == 0
    code, _, err = cli(capsys, "import", trace_file(tmp_path, "two"))
    assert code in (1, 2) and "no home directory" in one_line(err) and "--db" in err


def test_a_default_store_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "data").write_text("a file where the data folder should be")
    monkeypatch.delenv("SPECSCOPE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    code, _, err = cli(capsys, "import", trace_file(tmp_path))
    assert code == 1 and "is a file, not a folder" in one_line(err)


# ---------------------------------------------------------------------------- 7. recompute's vocabulary


def test_recompute_with_a_target_of_another_vocabulary_is_refused(tmp_path, capsys):
    from tests.tiny_models import tiny_lm

    db = tmp_path / "store.sqlite"
    run = ["run", "--device", "cpu", "--prompt-ids", "1,2,3", "--max-new", "4", "--eos-id", "none", "--db", db]
    assert cli(capsys, *run)[0] == 0  # the bundled target's vocabulary
    for vocab in (64, 100_000):
        other = tmp_path / f"other{vocab}"
        tiny_lm("llama", vocab=vocab, hidden=16, layers=1).save_pretrained(other)
        code, out, err = cli(capsys, "check", db, "--recompute", "--target", other, "--device", "cpu")
        line = one_line(err)
        assert code == 2 and f"vocabulary of {vocab} tokens" in line and "specscope/target" in line, line


# ---------------------------------------------------------------------------- 8. numeric options


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["check", "{db}", "--tol", "nan"], "--tol must be a finite number"),
        (["check", "{db}", "--tol", "inf"], "--tol must be a finite number"),
        (["check", "{db}", "--tol", "-1"], "--tol must be at least 0"),
        (["diff", "{db}", "ok", "ok", "--p-tol", "nan"], "--p-tol must be a finite number"),
        (["diff", "{db}", "ok", "ok", "--p-tol=-0.001"], "--p-tol must be at least 0"),
        (["show", "{db}", "last", "--top", "-1"], "--top must be at least 0"),
        (["show", "{db}", "last", "--round", "-2"], "--round must be at least 0"),
        (["runs", "{db}", "--limit", "-1"], "--limit must be at least 0"),
        (["bench", "--threads", "0"], "--threads must be at least 1"),
        (["bench", "--reps", "-3"], "--reps must be at least 1"),
    ],
)
def test_numeric_options_that_mean_nothing_are_refused(tmp_path, capsys, argv, flag):
    db = make_store(tmp_path / "store.sqlite", capsys)
    code, out, err = cli(capsys, *[a.format(db=db) for a in argv])
    assert code == 2 and one_line(err) == f"specscope: {flag}, got {argv[-1].split('=')[-1]}"
    assert out == ""


# ---------------------------------------------------------------------------- 10. progress


class _Terminal:
    """A stderr that says it is a terminal, and keeps what is written to it."""

    def __init__(self):
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    "argv, what",
    [
        (["check", "{db}", "--run", "big"], "checking run big"),
        (["export", "{db}", "big", "-o", "{out}"], "exporting run big"),
        (["import", "{trace}", "--db", "{other}"], "importing big.jsonl"),
    ],
)
def test_long_work_shows_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch, argv, what):
    from specscope.app.cli.options import Progress

    db = make_store(tmp_path / "store.sqlite", capsys)
    big = tmp_path / "big.jsonl"
    big.write_text(
        json.dumps({**HEADER, "run_id": "big", "config": {**HEADER["config"], "max_new_tokens": 8000}})
        + "\n"
        + "".join(json.dumps({**ROUND, "index": i}) + "\n" for i in range(3000))
    )
    assert cli(capsys, "import", big, "--db", db)[0] == 0
    monkeypatch.setattr(Progress, "DELAY_S", 0.0)
    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    args = [a.format(db=db, out=tmp_path / "out.jsonl", trace=big, other=tmp_path / "other.sqlite") for a in argv]
    cli(capsys, *args)  # piped (pytest's capture is no terminal): no progress
    assert what not in capsys.readouterr().err
    for path in (tmp_path / "out.jsonl", tmp_path / "other.sqlite"):
        path.unlink(missing_ok=True)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(args) in (0, 1)
    assert f"\r{what}: " in terminal.text and "\r\033[K" in terminal.text  # shown, then cleared


def test_check_json_shows_no_progress(tmp_path, capsys, monkeypatch):
    from specscope.app.cli.options import Progress

    db = make_store(tmp_path / "store.sqlite", capsys)
    monkeypatch.setattr(Progress, "DELAY_S", 0.0)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["check", str(db), "--json"]) == 0
    assert terminal.text == ""


def test_the_window_without_a_home_says_there_is_no_default_store(no_home, monkeypatch):
    """The window's 'open the recording store' (and recording, through the worker's one-line
    failure) name the missing home instead of a RuntimeError."""
    pytest.importorskip("PySide6")
    shown = []
    window = type("W", (), {"store_path": None, "show_error": lambda self, m: shown.append(m)})()
    from specscope.app.gui.controllers.trace_dialogs import TraceDialogs

    dialogs = TraceDialogs.__new__(TraceDialogs)
    dialogs.w = window
    dialogs.open_trace = lambda p: shown.append(("opened", p))
    dialogs.open_recording_store()
    assert len(shown) == 1 and "no home directory" in shown[0]
