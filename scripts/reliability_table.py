"""Hostile input and faults, as a user meets them: run each case through the real CLI in a
child process and print the table of what the user sees, the exit code and what is kept.

    python scripts/reliability_table.py              # the markdown table (several minutes)
    python scripts/reliability_table.py nan T5       # only the rows whose names hold these words

Each row is measured, not written by hand: the first line of stderr (or stdout), the exit
status, and the state of the files and store afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

CLI = [sys.executable, "-m", "specscope.app.cli"]
RUN = ["run", "--device", "cpu", "--prompt-ids", "1,2,3,4", "--k", "1", "--eos-id", "none"]
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


def cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    proc = subprocess.run(
        [*CLI, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return proc.returncode, _short(text[-1] if proc.returncode and text else (text[0] if text else ""))


def _short(line: str, limit: int = 150) -> str:
    line = line.replace("|", "\\|")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def runs_in(db: Path) -> str:
    if not db.exists():
        return "no store"
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT status, stop_reason, n_rounds FROM runs").fetchall()
    finally:
        con.close()
    return "; ".join(f"run {s}/{r or '-'}, {n} rounds" for s, r, n in rows) or "store, no runs"


def trace(tmp: Path, name: str, header=None, rounds=None, raw: str | None = None) -> Path:
    path = tmp / f"{name}.jsonl"
    lines = [json.dumps(header or HEADER), *(json.dumps(r) for r in (rounds if rounds is not None else [ROUND]))]
    path.write_text(raw if raw is not None else "\n".join(lines) + "\n")
    return path


def hostile_import(tmp: Path, name: str, **kw) -> tuple[int, str, str]:
    db = tmp / "hostile.sqlite"
    if not db.exists():
        cli(["import", trace(tmp, "good"), "--db", db], tmp)
    before = runs_in(db)
    code, seen = cli(["import", trace(tmp, name, **kw), "--db", db], tmp)
    kept = "store unchanged" if runs_in(db) == before else f"store changed: {runs_in(db)}"
    listable = cli(["runs", db], tmp)[0] == 0
    return code, seen, kept + ("; `runs` lists it" if listable else "; `runs` FAILS")


def case_missing_store(tmp: Path):
    code, seen = cli(["check", tmp / "typo" / "trace.sqlite"], tmp)
    return code, seen, "nothing created" if not (tmp / "typo").exists() else "a folder was created"


def case_empty_file(tmp: Path):
    empty = tmp / "empty.sqlite"
    empty.write_bytes(b"")
    code, seen = cli(["runs", empty], tmp)
    return code, seen, f"file left as it was ({empty.stat().st_size} bytes)"


def case_folder_named_small(tmp: Path):
    (tmp / "small").mkdir()
    db = tmp / "small.sqlite"
    code, _seen = cli([*RUN, "--max-new", "4", "--db", db, "--json"], tmp)
    con = sqlite3.connect(db)
    draft = con.execute("SELECT draft_name FROM runs").fetchone()[0]
    con.close()
    return code, "decodes", f"draft used: {draft}"


def case_empty_prompt_ids(tmp: Path):
    code, seen = cli(["run", "--prompt-ids", ""], tmp)
    return code, seen, "nothing run"


def case_prompt_too_long(tmp: Path):
    code, seen = cli(["run", "--device", "cpu", "--prompt-ids", ",".join(["5"] * 1030)], tmp)
    return code, seen, "nothing run"


def case_huge_seed(tmp: Path):
    db = tmp / "seed.sqlite"
    code, seen = cli([*RUN, "--seed", str(10**23), "--db", db], tmp)
    return code, seen, "no store created" if not db.exists() else runs_in(db)


def case_missing_driver(tmp: Path):
    code, seen = cli(["runs", "postgresql+pg8000://user:secret@127.0.0.1:1/x"], tmp)
    return code, seen, "password shown" if "secret" in seen else "password masked"


def case_help_password(tmp: Path):
    proc = subprocess.run(
        [*CLI, "import", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp,
        env={**os.environ, "SPECSCOPE_DB": "postgresql://user:secret@h/x"},
    )
    line = next((x.strip() for x in proc.stdout.splitlines() if "postgresql://" in x), "")
    return proc.returncode, _short(line), "password shown" if "secret" in proc.stdout else "password masked"


def _signal_case(tmp: Path, sig: signal.Signals):
    db = tmp / f"{sig.name}.sqlite"
    proc = subprocess.Popen(
        [*CLI, *RUN, "--max-new", "1000", "--db", str(db)],
        cwd=tmp,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for committed rounds
        time.sleep(0.5)
        if db.exists() and "0 rounds" not in runs_in(db) and "no runs" not in runs_in(db):
            break
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    return proc.returncode, _short(err[-1] if err else ""), runs_in(db)


def case_sigint(tmp: Path):
    return _signal_case(tmp, signal.SIGINT)


def case_sigterm(tmp: Path):
    return _signal_case(tmp, signal.SIGTERM)


def case_disk_full(tmp: Path):
    """A file-size limit (ulimit -f) makes the store's writes fail as on a full disk."""
    db = tmp / "full.sqlite"
    cmd = " ".join([*map(str, CLI), *RUN, "--max-new", "1000", "--top-n", "2000", "--db", str(db)])
    proc = subprocess.run(
        ["bash", "-c", f"ulimit -f 400; exec {cmd}"], cwd=tmp, capture_output=True, text=True, timeout=600
    )
    err = proc.stderr.strip().splitlines()
    tracebacks = proc.stderr.count("Traceback")
    return proc.returncode, _short(err[-1] if err else ""), f"{runs_in(db)}; {tracebacks} traceback(s)"


def _deep(n: int) -> str:
    return json.dumps(HEADER)[:-1] + ', "extra": ' + "[" * n + "]" * n + "}\n"


def _store(tmp: Path, name: str = "store.sqlite") -> Path:
    db = tmp / name
    cli(["import", trace(tmp, "good"), "--db", db], tmp)
    return db


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def case_export_over_store(tmp: Path):
    db = _store(tmp)
    before = _sha(db)
    code, seen = cli(["export", db, "last", "-o", db, "--force"], tmp)
    return code, seen, ("store unchanged; " if _sha(db) == before else "STORE CHANGED; ") + runs_in(db)


def case_export_over_file(tmp: Path):
    db = _store(tmp)
    (tmp / "notes.txt").write_text("keep")
    code, seen = cli(["export", db, "last", "-o", "notes.txt"], tmp)
    return code, seen, "notes.txt kept" if (tmp / "notes.txt").read_text() == "keep" else "notes.txt replaced"


def _odd_name(tmp: Path, name: str):
    code, seen = cli(["import", trace(tmp, "good"), "--db", name], tmp)
    made = sorted(p.name for p in tmp.iterdir() if not p.name.endswith(".jsonl"))
    listed = cli(["runs", name], tmp)[0] == 0
    return code, seen or "imported", f"files: {', '.join(made)}; `runs {name}` {'lists it' if listed else 'FAILS'}"


def case_in_memory(tmp: Path):
    code, seen = cli([*RUN, "--db", "sqlite://"], tmp)
    return code, seen, "nothing run"


def case_empty_db(tmp: Path):
    code, seen = cli([*RUN, "--db", ""], tmp)
    return code, seen, "nothing run"


def case_readonly_store(tmp: Path):
    """Every reader on a store whose file mode is 0444: nothing in the folder changes (as
    user nobody the tests run them too: tests/app/cli/test_reliability_stores.py)."""
    db = _store(tmp)
    db.chmod(0o444)
    before, listing = (_sha(db), db.stat().st_mtime_ns), sorted(p.name for p in tmp.iterdir())
    codes = [
        cli(argv, tmp)[0]
        for argv in (
            ["runs", db],
            ["show", db, "last"],
            ["check", db],
            ["diff", db, "ok", "ok"],
            ["export", db, "last", "-o", "-"],
        )
    ]
    same = (_sha(db), db.stat().st_mtime_ns) == before and sorted(p.name for p in tmp.iterdir()) == listing
    return (
        max(codes),
        f"runs, show, check, diff, export: exit {', '.join(map(str, codes))}",
        "file and folder unchanged (no -wal/-shm)" if same else "CHANGED",
    )


def case_empty_sqlite(tmp: Path):
    db = tmp / "empty.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (x)")
    con.execute("DROP TABLE t")
    con.close()
    before = _sha(db)
    code, seen = cli(["runs", db], tmp)
    return code, seen, "file unchanged" if _sha(db) == before else "file CHANGED"


def case_closed_pipe(tmp: Path):
    db = _store(tmp)
    rounds = [{**ROUND, "index": i} for i in range(20000)]
    cli(
        [
            "import",
            trace(
                tmp,
                "big",
                header={**HEADER, "run_id": "big", "config": {**HEADER["config"], "max_new_tokens": 40000}},
                rounds=rounds,
            ),
            "--db",
            db,
        ],
        tmp,
    )
    proc = subprocess.run(
        ["bash", "-c", f"{' '.join(map(str, CLI))} show {db} big | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}} >&2"],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    lines = proc.stderr.strip().splitlines()
    return lines[-1], _short(lines[0]) if len(lines) > 1 else "(nothing)", "quiet exit (141 = 128 + SIGPIPE)"


def case_file_as_folder(tmp: Path):
    (tmp / "file").write_text("x")
    code, seen = cli([*RUN, "--max-new", "2", "--db", tmp / "file" / "x.sqlite"], tmp)
    return code, seen, "nothing created"


def case_no_home(tmp: Path):
    """HOME unset and no passwd entry, simulated in the child (pwd.getpwuid fails)."""
    code = (
        "import pwd, sys\n"
        "def missing(uid): raise KeyError(uid)\n"
        "pwd.getpwuid = missing\n"
        "from specscope.app.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "SPECSCOPE_DB", "XDG_DATA_HOME")}
    helps = subprocess.run(
        [sys.executable, "-c", code, "import", "--help"], cwd=tmp, env=env, capture_output=True, text=True
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "import", str(trace(tmp, "good"))],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
    )
    err = proc.stderr.strip().splitlines()
    return proc.returncode, _short(err[-1] if err else ""), f"`import --help` exits {helps.returncode}"


def _tiny_checkpoint(folder: Path, vocab: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(folder)
    return folder


def case_recompute_vocab(tmp: Path):
    db = tmp / "run.sqlite"
    cli([*RUN, "--max-new", "4", "--db", db], tmp)
    code, seen = cli(
        ["check", db, "--recompute", "--target", _tiny_checkpoint(tmp / "other", 64), "--device", "cpu"], tmp
    )
    return code, seen, "nothing checked"


def case_tol(tmp: Path, value: str):
    code, seen = cli(["check", _store(tmp), f"--tol={value}"], tmp)
    return code, seen, "nothing checked"


def case_t5(tmp: Path):
    from transformers import T5Config, T5ForConditionalGeneration

    T5ForConditionalGeneration(
        T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    ).save_pretrained(tmp / "t5")
    code, seen = cli([*RUN, "--target", tmp / "t5", "--draft", tmp / "t5"], tmp)
    return code, seen, "nothing run"


def case_remote_code(tmp: Path):
    folder = _tiny_checkpoint(tmp / "remote", 64)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    proc = subprocess.run(
        [
            *CLI,
            "run",
            "--target",
            str(folder),
            "--draft",
            str(folder),
            "--device",
            "cpu",
            "--prompt-ids",
            "1,2",
            "--max-new",
            "2",
            "--eos-id",
            "none",
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    warning = next((x for x in proc.stderr.splitlines() if "auto_map" in x), "(no warning)")
    return proc.returncode, _short(warning, 220), "decoded with the stock class; the checkpoint's code not run"


THIRD_PASS: list[tuple[str, Callable[[Path], tuple[int, str, str]]]] = [
    ("`export STORE last -o STORE --force` (a trace store as the output)", case_export_over_store),
    ("`export … -o notes.txt` over an existing file, no `--force`", case_export_over_file),
    ("`--db 'a?b.sqlite'` (import)", lambda t: _odd_name(t, "a?b.sqlite")),
    ("`--db 'p%41.sqlite'` (import)", lambda t: _odd_name(t, "p%41.sqlite")),
    ("`run --db sqlite://` (in-memory)", case_in_memory),
    ("`run --db ''`", case_empty_db),
    ("reading commands on a store with file mode 0444", case_readonly_store),
    ("`runs EMPTY.db` (a valid SQLite file without tables)", case_empty_sqlite),
    ("`show STORE RUN \\| head -c 10` (20000 rounds)", case_closed_pipe),
    ("`run --db FILE/x.sqlite` (a file where a folder should be)", case_file_as_folder),
    ("`import` to the default store without a home directory", case_no_home),
    ("`check --tol nan`", lambda t: case_tol(t, "nan")),
    ("`check --tol -1`", lambda t: case_tol(t, "-1")),
    ("`check --recompute --target` with a 64-token vocabulary", case_recompute_vocab),
    ("a T5 (encoder-decoder) checkpoint as `--target`", case_t5),
    ("a checkpoint whose config has `auto_map` (remote code)", case_remote_code),
]

HOSTILE: list[tuple[str, Callable[[Path], tuple[int, str, str]]]] = [
    ("import: JSON nested 100k deep", lambda t: hostile_import(t, "deep", raw=_deep(100_000))),
    (
        "import: seed beyond 64 bits",
        lambda t: hostile_import(t, "bigint", header={**HEADER, "config": {**HEADER["config"], "seed": 2**64}}),
    ),
    (
        "import: a 5000-digit integer",
        lambda t: hostile_import(t, "digits", raw=json.dumps(HEADER).replace('"k": 2', '"k": ' + "9" * 5000) + "\n"),
    ),
    ("import: started_at 1e308", lambda t: hostile_import(t, "time", header={**HEADER, "started_at": 1e308})),
    (
        "import: NaN in extra",
        lambda t: hostile_import(t, "nan", raw=json.dumps(HEADER)[:-1] + ', "extra": {"a": NaN}}\n'),
    ),
    (
        "import: vocab_size 10**12",
        lambda t: hostile_import(t, "vocab", header={**HEADER, "config": {**HEADER["config"], "vocab_size": 10**12}}),
    ),
    (
        "import: zlib bomb (1 GiB inflated)",
        lambda t: hostile_import(
            t,
            "bomb",
            rounds=[
                {
                    **ROUND,
                    "nodes": [
                        {
                            "token": 1,
                            "status": "accepted",
                            "p": {
                                "full": {
                                    "dtype": "float32",
                                    "zlib_base64": base64.b64encode(zlib.compress(bytes(2**30), 9)).decode(),
                                }
                            },
                        }
                    ],
                }
            ],
        ),
    ),
    (
        "import: a 10 MB model name",
        lambda t: hostile_import(t, "long", header={**HEADER, "models": {"target_name": "x" * 10_000_000}}),
    ),
    (
        "import: ANSI escape in the run id",
        lambda t: hostile_import(t, "ansi", header={**HEADER, "run_id": "\x1b[31mred"}),
    ),
]

LOCK_HOLDER = """
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
con = sqlite3.connect(db, isolation_level=None, timeout=60)
con.execute("BEGIN IMMEDIATE")
time.sleep(seconds)
con.execute("ROLLBACK")
"""


def case_locked_store(tmp: Path, env: dict | None = None):
    """A 1000-round run (lookup at T=1.5: about one token a round) while a second process holds
    the store's write lock (BEGIN IMMEDIATE) for 25 s, from the run's first stored rounds."""
    db = tmp / "locked.sqlite"
    run = subprocess.Popen(
        [
            *CLI,
            "run",
            "--proposer",
            "lookup",
            "--prompt",
            "Hello",
            "--k",
            "1",
            "--temperature",
            "1.5",
            "--eos-id",
            "none",
            "--max-new",
            "1000",
            "--json",
            "--db",
            str(db),
        ],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(db), "25"])
    out, err = run.communicate(timeout=900)
    holder.wait(120)
    decoded = json.loads(out)["rounds"] if out.strip() else "?"
    lines = [x for x in err.strip().splitlines() if x.strip()]
    said = _short(lines[-1] if run.returncode else next((x for x in lines if "locked" in x), "(nothing)"), 220)
    spilled = sorted(p.name for p in tmp.glob("locked.sqlite.*.jsonl"))
    kept = f"{decoded} rounds decoded; {runs_in(db)}" + (f"; all in {spilled[0]}" if spilled else "")
    if spilled:
        _code, seen = cli(["import", tmp / spilled[0], "--db", db, "--run-id", "whole"], tmp)
        kept += f"; `import` of it: {seen}"
    return run.returncode, said, kept


def _newer_store(tmp: Path) -> Path:
    db = _store(tmp, "newer.sqlite")
    con = sqlite3.connect(db)
    version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    con.execute("INSERT INTO schema_version VALUES (?, 'from a newer specscope', 0)", (version + 1,))
    con.commit()
    con.close()
    return db


def case_newer_readers(tmp: Path):
    db = _newer_store(tmp)
    before = _sha(db)
    codes, said = [], ""
    for argv in (
        ["runs", db],
        ["show", db, "last"],
        ["check", db],
        ["diff", db, "ok", "ok"],
        ["export", db, "last", "-o", "-"],
    ):
        proc = subprocess.run([*CLI, *map(str, argv)], cwd=tmp, capture_output=True, text=True)
        codes.append(proc.returncode)
        said = said or proc.stderr.strip().splitlines()[0]
    return (
        max(codes),
        _short(said, 220) + f" (runs, show, check, diff, export: exit {', '.join(map(str, codes))})",
        "store unchanged" if _sha(db) == before else "store CHANGED",
    )


def case_newer_writers(tmp: Path):
    db = _newer_store(tmp)
    before = _sha(db)
    code, seen = cli([*RUN, "--max-new", "4", "--db", db], tmp)
    other, _ = cli(["import", trace(tmp, "other", header={**HEADER, "run_id": "other"}), "--db", db], tmp)
    return code, seen, (f"`import` exits {other}; " + ("store unchanged" if _sha(db) == before else "store CHANGED"))


def case_ascii_terminal(tmp: Path):
    db = tmp / "ascii.sqlite"
    proc = subprocess.run(
        [*CLI, "run", "--prompt", "caf\u00e9 \U0001f642", "--max-new", "8", "--db", str(db)],
        cwd=tmp,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
    )
    out = proc.stdout.decode("ascii", errors="replace")
    return proc.returncode, _short(out.splitlines()[0] if out else "(nothing)"), runs_in(db)


FOURTH_PASS: list[tuple[str, Callable[[Path], tuple[int, str, str]]]] = [
    ("a 1000-round `run --db` while another process holds the write lock for 25 s", case_locked_store),
    (
        "the same with `SPECSCOPE_LOCK_WAIT_S=10` (the writer gives up before the lock clears)",
        lambda t: case_locked_store(t, {"SPECSCOPE_LOCK_WAIT_S": "10"}),
    ),
    ("reading commands on a store of a newer schema version", case_newer_readers),
    ("`run --db` and `import` into a store of a newer schema version", case_newer_writers),
    ("`PYTHONIOENCODING=ascii run --prompt 'caf\u00e9 \U0001f642' --db X`", case_ascii_terminal),
]

CASES: list[tuple[str, Callable[[Path], tuple[int, str, str]]]] = [
    ("`check` on a path that does not exist", case_missing_store),
    ("`runs` on a 0-byte file", case_empty_file),
    ("a folder named `small` in the working directory, no `--draft`", case_folder_named_small),
    ("`--prompt-ids ''`", case_empty_prompt_ids),
    ("a prompt past the target's max_position_embeddings", case_prompt_too_long),
    ("`--seed 10**23 --db X`", case_huge_seed),
    ("a URL whose database driver is not installed", case_missing_driver),
    ("`import --help` with a password in SPECSCOPE_DB", case_help_password),
    ("Ctrl-C (SIGINT) during `run --db`", case_sigint),
    ("SIGTERM during `run --db`", case_sigterm),
    ("disk full during `run --db` (ulimit -f 400 KB)", case_disk_full),
    *HOSTILE,
    *THIRD_PASS,
    *FOURTH_PASS,
]


def main() -> int:
    only = sys.argv[1:]  # substrings of row names: run just those rows
    print("| input or fault | what the user sees | exit | what is kept |")
    print("|---|---|---|---|")
    started = time.time()
    for name, case in CASES:
        if only and not any(o in name for o in only):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                code, seen, kept = case(Path(tmp))
            except Exception as exc:  # noqa: BLE001 - a row, not a crash of the table
                code, seen, kept = "-", f"the script failed: {type(exc).__name__}: {exc}", "-"
        print(f"| {name} | {seen} | {code} | {kept} |", flush=True)
    print(f"\n`python scripts/reliability_table.py`, {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
