"""Bad input to the command line is one clear line and a non-zero exit, never a traceback, a
new file or folder, or a printed password: missing and empty trace stores, bundled names
against local folders, --prompt-ids, the models' position limit, integer options the store
cannot hold, missing database drivers, and URLs with passwords in help, errors and logs."""

from __future__ import annotations

import importlib.util
import json
import logging

import pytest

from specscope.app.cli import entry as cli_main
from specscope.app.cli import main
from specscope.app.cli import options as cli_options
from specscope.core.loading import models as loading
from specscope.storage import NotATraceStoreError, TraceStore, TraceStoreError
from tests.tiny_models import save_pair

SECRET = "s3cretPW"
BIG = str(10**23)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("ckpt"), noise=0.05)


@pytest.fixture
def no_window(monkeypatch):
    """`specscope open` must refuse before any window: launching one fails the test."""

    def launch(*_a, **_k):
        raise AssertionError("the window was opened")

    try:
        import specscope.app.gui as gui
    except ImportError:  # no Qt here: nothing could open a window anyway
        return launch
    monkeypatch.setattr(gui, "launch", launch)
    return launch


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def tiny_run(checkpoints, *extra):
    target, draft = checkpoints
    return ["run", "--target", target, "--draft", draft, "--device", "cpu", *extra]


def listing(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def make_store(path):
    with TraceStore(path):
        pass
    return path


# ---------------------------------------------------------------------------- 1. missing and empty stores


READ_ONLY = {
    "check": ["check", "{db}"],
    "runs": ["runs", "{db}"],
    "show": ["show", "{db}", "last"],
    "export": ["export", "{db}", "last", "-o", "{out}"],
    "diff": ["diff", "{db}", "a", "b"],
    "open": ["open", "{db}"],
    "diverge": ["diverge", "--db", "{db}", "--run", "a"],
}


def _argv(command, db, out):
    return [a.format(db=db, out=out) for a in READ_ONLY[command]]


@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_read_only_command_on_a_missing_path_fails_and_creates_nothing(
    capsys, tmp_path, monkeypatch, command, no_window
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *_argv(command, "typo/trace.sqlite", "x.jsonl"))
    assert code != 0
    assert "no trace store at" in one_line_error(err) and "typo" in err
    assert listing(tmp_path) == []  # no folder, no file


@pytest.mark.parametrize("command", sorted(READ_ONLY))
def test_read_only_command_refuses_an_empty_file_and_leaves_it_empty(capsys, tmp_path, command, no_window):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    code, _, err = run_cli(capsys, *_argv(command, empty, tmp_path / "x.jsonl"))
    assert code != 0
    assert "is an empty file, not a trace store" in one_line_error(err)
    assert empty.stat().st_size == 0 and listing(tmp_path) == ["empty.sqlite"]


def test_check_diff_and_open_input_errors_exit_2(capsys, tmp_path, no_window):
    """check exits 1 for findings and diff for a divergence: a bad path is a usage error (2)."""
    for argv in (
        ["check", tmp_path / "no.sqlite"],
        ["diff", tmp_path / "no.sqlite", "a", "b"],
        ["open", tmp_path / "no.sqlite"],
        ["open", tmp_path],
    ):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2, (argv, err)
        one_line_error(err)


def test_store_opened_without_create_refuses_an_empty_file(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    for kwargs in ({"create": False}, {"readonly": True}):
        with pytest.raises(NotATraceStoreError, match="empty file"):
            TraceStore(empty, **kwargs)
        assert empty.stat().st_size == 0
    with pytest.raises(TraceStoreError, match="no trace store"):
        TraceStore(tmp_path / "typo" / "t.sqlite", create=False)
    assert not (tmp_path / "typo").exists()
    with TraceStore(empty) as store:  # a writer may still turn it into a store
        assert store.list_runs() == []


def test_open_checks_the_path_then_launches(capsys, tmp_path, monkeypatch):
    pytest.importorskip("PySide6")
    import specscope.app.gui as gui

    db = make_store(tmp_path / "t.sqlite")
    launched = []
    monkeypatch.setattr(gui, "launch", lambda trace_path=None: launched.append(trace_path) or 0)
    assert run_cli(capsys, "open", db)[0] == 0
    assert launched == [str(db)]


# ---------------------------------------------------------------------------- 2. bundled names vs folders


@pytest.fixture
def folder_named_small(tmp_path, monkeypatch, checkpoints):
    """The working directory holds a checkpoint folder named `small` (a tiny random model)."""
    import shutil

    shutil.copytree(checkpoints[1], tmp_path / "small")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "small"


def test_a_bare_bundled_name_means_the_bundled_draft_even_next_to_a_folder_of_that_name(
    folder_named_small, checkpoints
):
    if not loading.bundled_available():
        pytest.skip("the bundled models are not installed")
    pair = loading.load_models(target=None, draft="small", device="cpu")
    assert pair.draft_name == "specscope/draft-small"
    assert pair.draft_path == loading.bundled_path("small").resolve()
    local = loading.load_models(target=str(checkpoints[0]), draft="./small", device="cpu")
    assert local.draft_path == folder_named_small.resolve()


def test_run_without_draft_uses_the_bundled_draft_next_to_a_folder_named_small(capsys, folder_named_small):
    if not loading.bundled_available():
        pytest.skip("the bundled models are not installed")
    code, out, err = run_cli(
        capsys, "run", "--prompt-ids", "10,11,12", "--max-new", "2", "--device", "cpu", "--json", "--db", "t.sqlite"
    )
    assert code == 0, err
    code, out, _ = run_cli(capsys, "runs", "t.sqlite", "--json")
    assert json.loads(out.splitlines()[0])["draft"] == "specscope/draft-small"


def test_help_states_the_naming_rule(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a bundled name always means the bundled model" in out and "./small" in out


# ---------------------------------------------------------------------------- 3. --prompt-ids


@pytest.mark.parametrize(
    "ids, expected",
    [
        ("", "--prompt-ids is empty"),
        (" ", "--prompt-ids is empty"),
        ("1,,2", "entry 2 is empty"),
        ("1,x", "entry 2 'x' is not an integer"),
        ("1,2,", "entry 3 is empty"),
    ],
)
def test_empty_or_malformed_prompt_ids_are_refused(capsys, checkpoints, ids, expected):
    code, out, err = run_cli(capsys, *tiny_run(checkpoints, "--prompt-ids", ids, "--max-new", "2"))
    assert code == 2 and out == ""
    assert expected in one_line_error(err)


def test_prompt_ids_with_spaces_still_parse():
    assert cli_options.parse_prompt_ids(" 1, 2 ,3") == [1, 2, 3]


# ---------------------------------------------------------------------------- 4. position limit


def ids(n):
    return ",".join(str(1 + i % 50) for i in range(n))


def test_prompt_longer_than_the_position_limit_is_refused(capsys, checkpoints):
    # the tiny checkpoints read at most 512 positions
    code, out, err = run_cli(capsys, *tiny_run(checkpoints, "--prompt-ids", ids(513), "--max-new", "1"))
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "513 tokens" in line and "at most 512" in line and "max_position_embeddings" in line


def test_prompt_plus_budget_past_the_limit_is_refused_and_names_the_largest_budget(capsys, checkpoints):
    code, out, err = run_cli(capsys, *tiny_run(checkpoints, "--prompt-ids", ids(500), "--max-new", "20"))
    assert code == 2 and out == ""
    line = one_line_error(err)
    assert "needs 520 positions" in line and "at most 512" in line and "--max-new must be at most 12" in line
    code, out, err = run_cli(capsys, *tiny_run(checkpoints, "--prompt-ids", ids(500), "--max-new", "12", "--json"))
    assert code == 0, err
    assert len(json.loads(out)["new_tokens"]) == 12


# ---------------------------------------------------------------------------- 5. integer options


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--seed", BIG, "--seed must be at most 9223372036854775807"),
        ("--seed", "-1", "--seed must be at least 0"),
        ("--k", BIG, "--k (draft length) must be at most 4096"),
        ("--k", "4097", "--k (draft length) must be at most 4096"),
        ("--max-new", BIG, "--max-new must be at most 2147483647"),
        ("--max-new", "-1", "--max-new must be at least 1"),
        ("--max-new", "0", "--max-new must be at least 1"),
        ("--top-k", BIG, "--top-k must be at most 2147483647"),
        ("--top-k", "-1", "--top-k must be at least 0"),
        ("--top-n", BIG, "--top-n must be at most 16777216"),  # the largest vocabulary a trace holds (issue 43 item 6)
        ("--eos-id", BIG, "--eos-id must be a token id from 0 to 2147483647"),
        ("--eos-id", "-5", "--eos-id must be a token id from 0 to 2147483647"),
        (
            "--lookup-max-ngram",
            BIG,
            "--lookup-max-ngram must be at most 64",
        ),  # the n-gram index's bound (issue 43 item 6)
    ],
)
def test_integer_options_out_of_range_are_refused_before_anything_runs(
    capsys, checkpoints, tmp_path, option, value, expected
):
    db = tmp_path / "t.sqlite"
    argv = tiny_run(checkpoints, "--prompt-ids", "1,2,3", "--max-new", "4", "--db", db, option, value)
    if option.startswith("--lookup"):  # a prompt-lookup run: no draft model
        argv = ["run", "--target", checkpoints[0], "--device", "cpu", *argv[7:]]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert expected in one_line_error(err)
    assert not db.exists()


def test_largest_seed_is_recorded(capsys, checkpoints, tmp_path):
    db = tmp_path / "t.sqlite"
    code, out, err = run_cli(
        capsys,
        *tiny_run(
            checkpoints, "--prompt-ids", "1,2,3", "--max-new", "3", "--json", "--db", db, "--seed", str(2**63 - 1)
        ),
    )
    assert code == 0, err
    with TraceStore(db) as store:
        assert store.list_runs()[0].config.seed == 2**63 - 1


def test_trace_commands_refuse_huge_integers(capsys, tmp_path):
    db = make_store(tmp_path / "t.sqlite")
    for argv, expected in (
        (["runs", db, "--limit", BIG], "--limit must be at most"),
        (["show", db, "last", "--round", BIG], "--round must be at most"),
        (["show", db, "last", "--round", "-1"], "--round must be at least 0"),
    ):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and expected in one_line_error(err)


# ---------------------------------------------------------------------------- 6. missing drivers


MISSING_DRIVERS = [
    (url, module)
    for url, module in (
        (f"postgresql+pg8000://u:{SECRET}@127.0.0.1:1/x", "pg8000"),
        (f"mysql+mysqldb://u:{SECRET}@127.0.0.1:1/x", "MySQLdb"),
    )
    if importlib.util.find_spec(module) is None
]


@pytest.mark.skipif(not MISSING_DRIVERS, reason="every driver of the test URLs is installed")
@pytest.mark.parametrize("command", ["runs", "check", "import", "run"])
def test_missing_database_driver_is_one_line_without_the_password(capsys, checkpoints, tmp_path, command):
    url, module = MISSING_DRIVERS[0]
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    argv = {
        "runs": ["runs", url],
        "check": ["check", url],
        "import": ["import", trace, "--db", url],
        # run: refused before any model loads (this target does not exist)
        "run": ["run", "--target", tmp_path / "no-model", "--prompt-ids", "1,2,3", "--db", url],
    }[command]
    code, out, err = run_cli(capsys, *argv)
    assert code != 0
    line = one_line_error(err)
    assert "is not installed" in line and module in line and "u:***@127.0.0.1" in line
    assert SECRET not in out + err


def test_unknown_dialect_and_bad_port_do_not_print_the_password(capsys, no_window):
    for url in (f"nosuchdb://u:{SECRET}@h/x", f"postgresql://u:{SECRET}@h:notaport/x"):
        for command in ("runs", "check", "open"):
            code, out, err = run_cli(capsys, command, url)
            assert code != 0
            one_line_error(err)
            assert SECRET not in out + err and "u:***@h" in err, (command, err)


# ---------------------------------------------------------------------------- 7. secrets


def test_help_hides_the_password_of_specscope_db(capsys, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_DB", f"postgresql+psycopg://user:{SECRET}@db.example:5432/traces")
    for command in ("import", "run", "runs", "check"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert SECRET not in out, command
    main_help = cli_main.build_parser().format_help()
    assert SECRET not in main_help
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    assert "postgresql+psycopg://user:***@db.example:5432/traces" in capsys.readouterr().out


def test_errors_through_specscope_db_hide_the_password(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSCOPE_DB", f"nosuchdb://user:{SECRET}@db.example/traces")
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    code, out, err = run_cli(capsys, "import", trace)
    assert code != 0
    one_line_error(err)
    assert SECRET not in out + err and "user:***@db.example" in err


def test_log_records_hide_passwords():
    masker = cli_main._MaskSecrets([SECRET])
    record = logging.LogRecord(
        "specscope",
        logging.WARNING,
        __file__,
        1,
        "opening %s failed: password=%s",
        (f"postgresql://u:{SECRET}@h/x", SECRET),
        None,
    )
    assert masker.filter(record)
    assert record.getMessage() == "opening postgresql://u:***@h/x failed: password=***"
