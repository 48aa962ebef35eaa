"""Other decoders' traces: docs/writing-traces.md's toy decoder written with TraceFile, and
minimal traces (required fields only) of specscope's own runs. Clean ones pass the checker
with no finding (rules they cannot feed are listed as not checked); broken copies fail."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.storage import TraceStore, export_run, import_run, record
from tests.tiny_models import noisy_copy, tiny_lm

DOC = Path(__file__).resolve().parents[3] / "docs" / "writing-traces.md"


def doc_example() -> str:
    return re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S).group(1)


def check_file(path, tmp_path):
    with TraceStore(tmp_path / "t.sqlite") as store:
        run_id = import_run(store, path)
        info = store.get_run(run_id)
        return check_report(info.config, store.load_rounds(run_id, full=True), end=info.end), info


def run_doc(code: str, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOC), "exec"), {})
    return check_file(tmp_path / "toy.jsonl", tmp_path)


def test_the_documented_toy_decoder_passes_the_checker(tmp_path, monkeypatch):
    report, info = run_doc(doc_example(), tmp_path, monkeypatch)
    assert info.status == "completed" and info.n_new_tokens == 200
    assert report.findings == [], [str(f) for f in report.findings[:3]]
    assert {"draw", "target-cache"} <= set(report.not_checked)
    assert info.config.unrecorded == {"draw", "target_cache", "eos", "budget_stop", "bonus_withheld", "k"}


def test_the_documented_bug_is_found(tmp_path, monkeypatch):
    code = doc_example().replace("p=residual / residual.sum()", "p=ps[i]")
    assert code != doc_example()
    report, _ = run_doc(code, tmp_path, monkeypatch)
    assert {f.rule for f in report.findings} == {"residual"}


REQUIRED_ROUND = ("index", "nodes", "emitted")
REQUIRED_NODE = ("token", "status", "p")
REQUIRED_EMITTED = ("token", "kind")


def minimal(path_in: Path, path_out: Path, keep_round=(), keep_node=(), keep_emitted=()) -> list[dict]:
    """The trace with only the documented required fields (plus those asked for)."""
    lines = [json.loads(line) for line in path_in.read_text().splitlines()]
    header, rounds, end = lines[0], lines[1:-1], lines[-1]
    header = {key: header[key] for key in ("format", "version", "record", "run_id", "prompt_ids")} | {
        "config": {
            key: header["config"][key] for key in ("vocab_size", "k", "max_new_tokens", "sampling", "eos_token_id")
        }
    }
    out = []
    for r in rounds:
        slim = {key: r[key] for key in (*REQUIRED_ROUND, *keep_round) if key in r}
        slim["record"] = "round"
        slim["nodes"] = [{key: n[key] for key in (*REQUIRED_NODE, *keep_node) if key in n} for n in r["nodes"]]
        slim["emitted"] = [
            {key: e[key] for key in (*REQUIRED_EMITTED, *keep_emitted) if key in e} for e in r["emitted"]
        ]
        out.append(slim)
    path_out.write_text("\n".join(json.dumps(x) for x in [header, *out, end]) + "\n")
    return out


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


@pytest.mark.parametrize(
    "cfg", [SamplingConfig(temperature=0), SamplingConfig(temperature=1.0, top_k=10)], ids=["greedy", "sampled"]
)
def test_required_fields_only_pass_clean_and_a_broken_copy_fails(models, cfg, tmp_path):
    target, draft = models
    with TraceStore(tmp_path / "src.sqlite") as store:
        out = record(
            store,
            SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=cfg, eos_token_id=7),
            [1, 2, 3, 4],
            40,
        )
        export_run(store, out.config.run_id, tmp_path / "full.jsonl")
    rounds = minimal(tmp_path / "full.jsonl", tmp_path / "min.jsonl")
    report, info = check_file(tmp_path / "min.jsonl", tmp_path)
    assert report.findings == [], [str(f) for f in report.findings[:3]]
    if not cfg.greedy:  # without u and draws the stochastic decisions cannot be replayed
        assert {"acceptance-draw", "draw"} <= set(report.not_checked)

    # broken copy: the first repair replaced by a token the target gives no chance (sampled:
    # outside top-k, p = 0; greedy: not the argmax)
    broken = json.loads(json.dumps(rounds))
    r = next(r for r in broken if r["emitted"][-1]["kind"] == "repaired")
    rejected = next(n for n in r["nodes"] if n["status"] == "rejected")
    r["emitted"][-1]["token"] = min(set(range(64)) - set(rejected["p"]["top_ids"]))
    lines = (tmp_path / "min.jsonl").read_text().splitlines()
    new_tokens = [e["token"] for x in broken for e in x["emitted"]]
    end = json.loads(lines[-1]) | {"new_tokens": new_tokens}
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], *(json.dumps(x) for x in broken), json.dumps(end)]) + "\n")
    report, _ = check_file(tmp_path / "bad.jsonl", tmp_path / "b")
    assert report.findings, "the broken copy passed"
