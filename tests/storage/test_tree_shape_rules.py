"""Token-tree traces edited as another decoder might write them wrong (issue 31): a tree
that breaks its declared shape, siblings drawn without replacement that repeat a token (a
finding, not an abort: the other runs of the store are still checked), and a repair whose
recorded p' entry is exactly 0 on a top-N trace."""

from __future__ import annotations

import io
import json

import pytest

from specscope.app.cli import main
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.storage import TraceStore, TraceWriter, export_run, import_run
from tests.tiny_models import noisy_copy, tiny_lm


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def exported(models, tmp_path, tree, children, sampling, full=True, seed=1, max_new=20) -> list[dict]:
    """A run of specscope's tree decoder, recorded to a store and exported as JSONL lines."""
    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree, children=children), sampling=sampling)
    with TraceStore(tmp_path / "recorded.sqlite") as store:
        config = dec.run_config([1, 2, 3, 4], max_new, seed=seed)
        with TraceWriter(store, config, full_vectors=full, top_n=6) as writer:
            writer.record(dec.rounds([1, 2, 3, 4], max_new, config=config))
        buf = io.StringIO()
        export_run(store, config.run_id, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def check_lines(lines: list[dict], tmp_path, name="r"):
    with TraceStore(tmp_path / f"{name}.sqlite") as store:
        run_id = import_run(store, io.StringIO("\n".join(json.dumps(x) for x in lines) + "\n"), run_id=name)
        info = store.get_run(run_id)
        return check_report(info.config, store.iter_rounds(run_id, full=True), end=info.end)


def rounds_of(lines):
    return [(i, x) for i, x in enumerate(lines) if x.get("record") == "round"]


def test_a_tree_that_breaks_its_declared_shape_is_flagged(models, tmp_path):
    lines = exported(models, tmp_path, "3,2,1", "topk", SamplingConfig(temperature=0))
    assert check_lines(lines, tmp_path, "clean").findings == []
    at, line = max(rounds_of(lines), key=lambda item: len(item[1]["nodes"]))
    assert len(line["nodes"]) > 3
    small = json.loads(json.dumps(lines))
    small[at]["tree"]["spec"] = "2,1"  # at most 2 + 2 nodes, 2 deep, 2 children of the prefix
    found = check_lines(small, tmp_path, "small").findings
    shape = [f for f in found if f.rule == "tree-shape"]
    assert shape and shape[0].round == line["index"] and "budget of 4" in shape[0].message
    assert all(f.severity == "wrong output" for f in shape)


def test_a_dynamic_tree_must_keep_its_budget_depth_and_topk_children(models, tmp_path):
    spec = "dynamic:nodes=8,depth=3,topk=2"
    lines = exported(models, tmp_path, spec, "topk", SamplingConfig(temperature=1.0, top_p=0.9))
    assert check_lines(lines, tmp_path, "clean").findings == []
    at, line = max(rounds_of(lines), key=lambda item: len(item[1]["nodes"]))
    deep = max(n["depth"] for n in line["nodes"])
    assert deep >= 2
    tight = json.loads(json.dumps(lines))
    tight[at]["tree"]["spec"] = f"dynamic:nodes=2,depth={deep - 1},topk=2"
    messages = [f.message for f in check_lines(tight, tmp_path, "tight").findings if f.rule == "tree-shape"]
    assert any("budget of 2" in m for m in messages) and any(f"at most {deep - 1} deep" in m for m in messages)
    sampled = json.loads(json.dumps(lines))
    sampled[at]["tree"]["children"] = "sampled"
    found = check_lines(sampled, tmp_path, "sampled").findings
    assert any(
        f.rule == "tree-shape" and "children are its top-k" in f.message and f.round == line["index"] for f in found
    )


def test_repeated_siblings_drawn_without_replacement_are_a_finding_and_the_store_is_still_checked(
    models, tmp_path, capsys
):
    lines = exported(models, tmp_path, "2,2", "distinct", SamplingConfig(temperature=1.0, top_k=8))
    at, line = next((i, x) for i, x in rounds_of(lines) if sum(1 for n in x["nodes"] if n.get("parent", -1) == -1) >= 2)
    bad = json.loads(json.dumps(lines))
    first, second = [n for n in bad[at]["nodes"] if n["parent"] == -1][:2]
    second["token"] = first["token"]
    db = tmp_path / "store.sqlite"
    with TraceStore(db) as store:
        import_run(store, io.StringIO("\n".join(json.dumps(x) for x in bad) + "\n"), run_id="a-bad")
        import_run(store, io.StringIO("\n".join(json.dumps(x) for x in lines) + "\n"), run_id="b-clean")
    code = main(["check", str(db), "--json"])
    out = capsys.readouterr()
    assert code == 1 and out.err == ""
    runs = {r["run_id"]: r for r in json.loads(out.out)["runs"]}
    assert runs["b-clean"]["findings"] == [] and runs["b-clean"]["rounds"] > 0
    rules = [f["rule"] for f in runs["a-bad"]["findings"]]
    assert rules[0] == "distinct-siblings" and "internal" not in rules
    assert runs["a-bad"]["findings"][0]["round"] == line["index"]
    assert "tree-walk" in runs["a-bad"]["not_checked"]


def test_a_repair_with_a_zero_entry_in_the_final_p_prime_is_flagged_on_top_n(models, tmp_path):
    lines = exported(
        models, tmp_path, "3,2", "sampled", SamplingConfig(temperature=1.0), full=False, seed=2, max_new=30
    )
    assert check_lines(lines, tmp_path, "clean").findings == []
    at, line = next(
        (i, x) for i, x in rounds_of(lines) if x["emitted"][-1]["kind"] == "repaired" and x["tree"]["updates"]
    )
    bad = json.loads(json.dumps(lines))
    token = bad[at]["emitted"][-1]["token"]
    last = bad[at]["tree"]["updates"][-1]
    ids, probs = last.setdefault("exact_ids", []), last.setdefault("exact_probs", [])
    if token in ids:
        probs[ids.index(token)] = 0.0
    else:
        ids.append(token)
        probs.append(0.0)
    found = check_lines(bad, tmp_path, "bad").findings
    assert found and found[0].round == line["index"] and found[0].rule == "residual", [str(f) for f in found[:2]]
    assert "probability 0" in found[0].message
