"""Issue 43 items 6 and 7 at the front ends: a number that could exhaust memory is refused where
it is parsed (the CLI's flags, the proposer spec, the window's run panel), in one line, before
anything is allocated; an empty value in a proposer spec is refused, never read as a default."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from specscope.app.cli import main
from specscope.app.gui.model.settings import PanelSettings, validate

MEMORY_LIMIT = 1 << 30  # 1 GiB of address space: the refusal needs far less, the allocation far more


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def limited_cli(*argv: str) -> tuple[int, str, float]:
    """`specscope ARGV` in a child process under MEMORY_LIMIT: (exit status, stderr, seconds)."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "specscope.app.cli", *argv],
        capture_output=True,
        text=True,
        preexec_fn=_limit_memory,
        timeout=120,
    )
    return done.returncode, done.stderr, time.monotonic() - start


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("--lookup-max-ngram", "2147483647"), "specscope: --lookup-max-ngram must be at most 64"),
        (("--proposer", "lookup:max_ngram=2147483647"), "specscope: --proposer: lookup: max_ngram must be at most 64"),
        (
            ("--proposer", "lookup", "--lookup-min-ngram", "2147483647"),
            "specscope: --lookup-min-ngram must be at most 64",
        ),
    ],
)
def test_an_ngram_length_past_its_bound_is_one_line_under_a_memory_limit(argv, expected):
    code, err, seconds = limited_cli("run", "--prompt-ids", "1,2,3", "--max-new", "4", "--device", "cpu", *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err and "MemoryError" not in err, err
    assert lines[0].startswith(expected), lines[0]
    assert seconds < 60


def one_line(capsys, *argv: str) -> str:
    code = main(["run", "--prompt-ids", "1,2,3", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("draft:", "has nothing after ':'"),
        ("eagle3:", "has nothing after ':'"),
        ("medusa:", "has nothing after ':'"),
        ("lookup:", "has nothing after ':'"),
        ("lookup:max_ngram=", "max_ngram= has no value"),
        ("lookup:max_ngram=3,min_ngram=", "min_ngram= has no value"),
        ("draft:small,tree=", "tree= has no value"),
        ("draft:small,tree=3,2,children=", "children= has no value"),
        ("eagle3:draw=", "draw= has no value"),
        ("draft:small,", "has an empty item between commas"),
    ],
)
def test_an_empty_value_in_a_proposer_spec_is_refused_by_the_cli(capsys, spec, words):
    line = one_line(capsys, "--proposer", spec)
    assert line.startswith("specscope: --proposer: ") and words in line, line


def test_an_empty_draft_flag_is_refused(capsys):
    line = one_line(capsys, "--draft", "")
    assert line == (
        "specscope: --draft is empty: name a draft ('small', 'tiny') or a checkpoint folder, or leave --draft out"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("--top-n", str(2**31 - 1)), "--top-n must be at most 16777216"),
        (("--proposer", "draft:small,tree=dynamic:nodes=16,depth=5,topk=2147483647"), "topk must be at most 256"),
        (("--tree", "dynamic:nodes=16,depth=2147483647,topk=4"), "depth must be at most 256"),
    ],
)
def test_run_refuses_other_unbounded_numbers(capsys, argv, expected):
    assert expected in one_line(capsys, *argv)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["bench", "--reps", "2147483647"], "specscope: --reps must be at most 1000, got 2147483647"),
        (["bench", "--prompts", "2147483647"], "specscope: --prompts must be at most 10000, got 2147483647"),
        (["bench", "--threads", "2147483647"], "specscope: --threads must be at most 256, got 2147483647"),
        (["diverge", "--k", "5000"], "specscope: --k (draft length) must be at most 4096, got 5000"),
        (["diverge", "--max-new", "0"], "specscope: --max-new must be at least 1, got 0"),
    ],
)
def test_other_commands_take_the_same_bounds(capsys, argv, expected):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == expected


def panel_errors(**fields: str) -> dict[str, str]:
    texts = dict(PanelSettings(prompt="1 2 3").to_texts(), **fields)
    return validate(texts).errors


@pytest.mark.parametrize(
    "spec, words",
    [
        ("draft:", "proposer: proposer 'draft:' has nothing after ':'"),
        ("eagle3:", "proposer: proposer 'eagle3:' has nothing after ':'"),
        ("lookup:max_ngram=", "proposer: lookup: max_ngram= has no value"),
        ("lookup:max_ngram=2147483647", "proposer: lookup: max_ngram must be at most 64"),
    ],
)
def test_the_run_panel_refuses_the_same_specs(spec, words):
    errors = panel_errors(proposer=spec)
    assert list(errors) == ["proposer"] and errors["proposer"].startswith(words), errors


def test_the_run_panel_bounds_its_tree_and_threads_fields():
    assert (
        "depth must be at most 256"
        in panel_errors(proposer="draft:small,tree=dynamic:nodes=8,depth=9999,topk=2")["tree"]
    )
    assert panel_errors(threads="100000")["threads"] == "threads must lie in [1, 256], got 100000 (or “auto”)"


def test_the_run_panel_widget_never_holds_an_unbounded_spec(qtbot):
    from specscope.app.gui.views.runpanel import RunPanelWidget

    panel = RunPanelWidget()
    qtbot.addWidget(panel)
    panel.set_texts({"prompt": "1 2 3", "proposer": "lookup:max_ngram=4"})
    assert panel.texts()["proposer"] == "lookup:max_ngram=4" and panel.validate().ok
    panel.set_texts({"proposer": "lookup:max_ngram=2147483647"})  # a saved or replayed spec past the bound
    assert panel.texts()["proposer"] == "lookup:max_ngram=4" and panel.validate().ok
    panel.set_texts({"proposer": "draft:small"})
    panel.set_texts({"tree": "dynamic:nodes=8,depth=2147483647,topk=2"})  # typed into the tree field
    result = panel.validate()
    assert not result.ok and "depth must be at most 256" in panel.errors["tree"].text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--proposer", "lookup:max_ngram=2147483647"],
        ["--top-n", "2147483647"],
        ["--proposer", "draft:"],
        ["--lookup-max-ngram", "2147483647"],
    ],
)
def test_a_refused_setting_is_refused_before_torch_loads(argv):
    code = (
        "import sys; from specscope.app.cli import main; status = main(['run', '--prompt-ids', '1,2', *sys.argv[1:]]); "
        "print(status, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stderr
