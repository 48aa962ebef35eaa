"""`specscope run` and the window's run panel check a run's settings with one check (the core's
RunSettings.validate): NaN, negative and out-of-range values are refused by both with the
same message, the CLI naming the flag where the window names the field."""

from __future__ import annotations

import pytest

from specscope.app.cli import main

# (flag, value, the run panel's field, the panel's name for it)
CASES = [
    ("--temperature", "nan", "temperature", "temperature"),
    ("--temperature", "inf", "temperature", "temperature"),
    ("--temperature", "-0.5", "temperature", "temperature"),
    ("--top-p", "nan", "top_p", "top-p"),
    ("--top-p", "-1", "top_p", "top-p"),
    ("--top-p", "1.5", "top_p", "top-p"),
    ("--top-k", "-3", "top_k", "top-k"),
    ("--seed", "-1", "seed", "seed"),
    ("--k", "0", "k", "k (draft length)"),
    ("--k", "5000", "k", "k (draft length)"),
    ("--max-new", "0", "max_new_tokens", "max new tokens"),
    ("--max-new", "-4", "max_new_tokens", "max new tokens"),
    ("--eos-id", "-2", "eos", "EOS"),
]


def cli_error(capsys, *argv) -> str:
    # a target that does not exist: the settings are refused before anything loads
    code = main(
        [
            "run",
            "--target",
            "/nonexistent/model",
            "--proposer",
            "lookup",
            "--prompt-ids",
            "1,2,3",
            "--device",
            "cpu",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flag, value, field, name", CASES)
def test_cli_and_run_panel_refuse_with_the_same_message(capsys, flag, value, field, name):
    from specscope.app.gui.model.settings import PanelSettings, validate

    line = cli_error(capsys, flag, value)
    flag_name = "--k (draft length)" if flag == "--k" else flag
    assert line.startswith(f"specscope: {flag_name} ") and "nonexistent" not in line
    texts = PanelSettings(prompt="1 2 3").to_texts()
    texts[field] = value
    panel = validate(texts).errors[field]
    assert panel.startswith(f"{name} ")
    assert line.removeprefix(f"specscope: {flag_name} ") == panel.removeprefix(f"{name} ")


def test_every_bad_value_is_named_on_the_one_line(capsys):
    line = cli_error(capsys, "--temperature", "nan", "--top-p", "2", "--k", "0")
    assert line == (
        "specscope: --k (draft length) must be at least 1, got 0; --temperature must be a finite number, "
        "got nan; --top-p must lie in (0, 1] (1 = off), got 2"
    )


@pytest.mark.parametrize(
    "k, max_new, message",
    [
        ("2,0", None, "--k must be at least 1, got 0"),
        ("5000", 8, "--k must be at most 4096, got 5000"),
        ("4", 0, "--max-new must be at least 1, got 0"),
    ],
)
def test_the_bench_checks_k_and_the_budget_with_the_same_check(k, max_new, message):
    import argparse

    from specscope.app.bench.command import UsageError, settings_of

    args = argparse.Namespace(quick=False, k=k, max_new=max_new, reps=None, prompts=None, kinds=None)
    with pytest.raises(UsageError) as caught:
        settings_of(args)
    assert str(caught.value) == message
