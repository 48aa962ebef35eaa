"""The vLLM engine's host side without vLLM: captured steps -> specscope trace -> import ->
check (core/engines/vllm/engine.py, core/check/engine_values.py), and `vllm setup` without
network. The runs of vLLM itself are in tests/core/engines/vllm/test_engine.py (skipped without its venv)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from specscope.core.check.checker import WRONG_OUTPUT, check_report
from specscope.core.engines.vllm.engine import VllmRun, request_trace, write_traces
from specscope.storage import TraceStore
from specscope.storage.jsonl.transfer import import_run

V = 16


def _dist(p: np.ndarray, token: int | None = None) -> dict:
    order = np.argsort(-p, kind="stable")[:8]
    out = {
        "top_ids": [int(i) for i in order if p[i] > 0],
        "top_probs": [float(p[i]) for i in order if p[i] > 0],
        "support": int((p > 0).sum()),
        "minimum": float(p.min()),
        "total": float(p.sum()),
    }
    if token is not None:
        out["token_p"] = float(p[token])
    return out


def _peaked(top: int, mass: float = 0.9) -> np.ndarray:
    p = np.full(V, (1 - mass) / (V - 1))
    p[top] = mass
    return p


@pytest.fixture()
def target(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": V, "max_position_embeddings": 64}))
    return folder


def _store_and_check(tmp_path, run, steps, final, finish="length"):
    result = {
        "request_id": "0",
        "token_ids": final,
        "finish_reason": finish,
        "stop_reason": None,
        "spec_decode": {"per_step_drafted": [2], "per_step_accepted": [1]},
    }
    lines = request_trace(run, [1, 2, 3], steps, result, V, "0.32.0")
    path = write_traces([lines], tmp_path)[0]
    store = TraceStore(str(tmp_path / "s.sqlite"))
    run_id = import_run(store, path)
    info = store.get_run(run_id)
    report = check_report(info.config, list(store.iter_rounds(run_id, full=True)), end=info.end)
    store.close()
    return lines, report


def _greedy_steps():
    # prefill: one token (5); then drafts [6, 7]: 6 accepted, 7 rejected, repair 8 = argmax
    return [
        {
            "record": "step",
            "req": "0-x",
            "t": 1.0,
            "drafts": [],
            "nodes": [],
            "sampled": [5],
            "bonus_p": _dist(_peaked(5)),
            "sample_s": 0.001,
        },
        {
            "record": "step",
            "req": "0-x",
            "t": 2.0,
            "drafts": [6, 7],
            "nodes": [{"token": 6, "p": _dist(_peaked(6), 6)}, {"token": 7, "p": _dist(_peaked(8), 7)}],
            "sampled": [6, 8],
            "bonus_p": _dist(_peaked(9)),
            "sample_s": 0.001,
        },
    ]


def test_greedy_steps_import_and_check_clean(tmp_path, target):
    run = VllmRun(target=str(target), prompts=[[1, 2, 3]], proposer_kind="lookup", k=2, max_new_tokens=3)
    lines, report = _store_and_check(tmp_path, run, _greedy_steps(), [5, 6, 8])
    assert [e["kind"] for e in lines[2]["emitted"]] == ["accepted", "repaired"]
    assert [n["status"] for n in lines[2]["nodes"]] == ["accepted", "rejected"]
    assert report.findings == []


def test_budget_cut_keeps_only_returned_tokens(tmp_path, target):
    run = VllmRun(target=str(target), prompts=[[1, 2, 3]], proposer_kind="lookup", k=2, max_new_tokens=2)
    lines, report = _store_and_check(tmp_path, run, _greedy_steps(), [5, 6])
    assert [e["token"] for e in lines[2]["emitted"]] == [6]
    assert [n["status"] for n in lines[2]["nodes"]] == ["accepted", "unvisited"]
    assert lines[-1]["stop_reason"] == "budget"
    assert not [f for f in report.findings if f.severity == WRONG_OUTPUT]


def test_capture_disagreeing_with_vllms_output_is_one_error(tmp_path, target):
    from specscope.core.engines.vllm.engine import VllmEngineError

    run = VllmRun(target=str(target), prompts=[[1, 2, 3]], proposer_kind="lookup", k=2, max_new_tokens=3)
    with pytest.raises(VllmEngineError, match="differ from vLLM's output"):
        request_trace(run, [1, 2, 3], _greedy_steps(), {"request_id": "0", "token_ids": [5, 7, 8]}, V, "0.32.0")


def _sampled_steps(nan: bool, repair_is_draft: bool, bad_accept: bool):
    p = _peaked(3, 0.5)
    p_nodes = np.full(V, np.nan) if nan else p
    node = {"token": 3, "p": _dist(np.nan_to_num(p_nodes, nan=0.0), 3), "u": 0.9 if bad_accept else 0.2}
    if nan:
        node["p"]["nonfinite"] = {"count": V, "nan": V, "first_ids": [0], "first_values": [float("nan")]}
        node["p"]["token_p"] = float("nan")
    steps = [
        {
            "record": "step",
            "req": "0-x",
            "t": 1.0,
            "drafts": [],
            "nodes": [],
            "sampled": [4],
            "bonus_p": _dist(_peaked(4)),
            "sample_s": 0.001,
        }
    ]
    if nan or repair_is_draft:  # rejected, the repair is the rejected draft itself
        steps.append({"record": "step", "req": "0-x", "t": 2.0, "drafts": [3], "nodes": [node], "sampled": [3]})
        steps[-1]["sampled"] = [3]
        # one sampled token after one draft = a rejection (vLLM: -1 after it)
        steps[-1]["nodes"][0]["u"] = 0.9
        return steps, [4, 3]
    steps.append(
        {
            "record": "step",
            "req": "0-x",
            "t": 2.0,
            "drafts": [3],
            "nodes": [node],
            "sampled": [3, 4],
            "bonus_p": _dist(_peaked(4)),
        }
    )
    return steps, [4, 3, 4]


@pytest.mark.parametrize("case", ["clean", "nan", "repair-is-draft", "accept-against-u"])
def test_sampled_faults_are_stored_and_flagged(tmp_path, target, case):
    run = VllmRun(
        target=str(target), prompts=[[1, 2, 3]], proposer_kind="lookup", k=1, max_new_tokens=3, temperature=0.8
    )
    steps, final = _sampled_steps(case == "nan", case == "repair-is-draft", case == "accept-against-u")
    lines, report = _store_and_check(tmp_path, run, steps, final)
    wrong = sorted({f.rule for f in report.findings if f.severity == WRONG_OUTPUT})
    rounds = {f.round for f in report.findings if f.severity == WRONG_OUTPUT}
    if case == "clean":
        assert wrong == []
    elif case == "nan":
        assert "nonfinite" in wrong and min(rounds) == 1
        assert lines[0]["config"]["proposer_params"]["nonfinite"] == [[1, 0, "p", V, V]]
    elif case == "repair-is-draft":
        assert "residual" in wrong and min(rounds) == 1
    else:
        assert "acceptance-draw" in wrong and min(rounds) == 1


def test_setup_without_network_is_one_line(tmp_path):
    venv = tmp_path / "venv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specscope.app.cli",
            "vllm",
            "setup",
            "--path",
            str(venv),
            "--index-url",
            "http://127.0.0.1:9/simple",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if not ln.startswith("-- ")]
    assert len(err) == 1 and "cannot install vllm" in err[0] and "no network access" in err[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("budget, withheld", [(2, False), (3, True)])
def test_budget_cut_after_all_accepted_withholds_only_a_bonus(tmp_path, target, budget, withheld):
    """Both drafts accepted and the bonus sampled: a budget that ends inside the drafts
    withholds no bonus (it was a bug to say so: round-structure flagged it on vLLM's greedy
    runs); one that ends right after them withholds the bonus."""
    steps = _greedy_steps()
    steps[1] = {
        **steps[1],
        "nodes": [{"token": 6, "p": _dist(_peaked(6), 6)}, {"token": 7, "p": _dist(_peaked(7), 7)}],
        "sampled": [6, 7, 9],
    }
    run = VllmRun(target=str(target), prompts=[[1, 2, 3]], proposer_kind="lookup", k=2, max_new_tokens=budget)
    lines, report = _store_and_check(tmp_path, run, steps, [5, 6, 7][:budget])
    assert lines[2]["bonus_withheld"] is withheld
    assert not [str(f) for f in report.findings if f.severity == WRONG_OUTPUT]
