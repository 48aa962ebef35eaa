"""Regressions found by the audit of traces written by another decoder (issue 31;
tests/storage/jsonl/test_foreign_traces.py holds the audit): each was a false finding, an internal
error or a silently accepted impossible value before its fix."""

from __future__ import annotations

import io
import json

import pytest

from specscope.core.check.checker import check_report
from specscope.storage import TraceStore, import_run
from specscope.storage.errors import TraceFormatError
from tests.storage.foreign_decoder import Setup, generate, jsonl, replace, strip, with_stop_from_run


@pytest.fixture
def checker(tmp_path):
    store = TraceStore(tmp_path / "regressions.sqlite")
    runs = iter(range(10**6))

    class Checker:
        @staticmethod
        def check(lines):
            run_id = import_run(store, io.StringIO(jsonl(lines)), run_id=f"r{next(runs)}")
            info = store.get_run(run_id)
            return check_report(info.config, store.iter_rounds(run_id, full=True), end=info.end)

    yield Checker()
    store.close()


def _rounds(lines):
    return [line for line in lines if line.get("record") == "round"]


def _depth(r) -> int:
    return max((n["depth"] for n in r["nodes"]), default=0)


def test_a_tree_rounds_k_is_no_draft_length(checker):
    """Another tree decoder records k as its node budget: 4 nodes with 1 token of budget left
    but drafted 1 deep wastes nothing (draft-budget reads the depth of a tree)."""
    lines = generate(Setup("k", tree="3,2,1", max_new=4))
    assert any(r["k"] > r["remaining_budget"] >= _depth(r) for r in _rounds(lines))
    assert checker.check(lines).findings == []


@pytest.mark.parametrize(
    "setup",
    [
        Setup("eos", eos=5, max_new=40),
        Setup("eos", eos=5, max_new=40, greedy=True),
        Setup("eos", tree="2,1", eos=5, max_new=40),
    ],
    ids=["sampled", "greedy", "tree"],
)
def test_a_header_without_eos_leaves_eos_unknown(checker, setup):
    """No config.eos_token_id and no stops: the EOS is unknown, not "none": the run that
    ended at EOS is not flagged (no bonus after it, flagged EOS, stop reason eos), and the
    report names eos as not checked."""
    for seed in range(40):
        lines = generate(replace(setup, seed=seed))
        last = _rounds(lines)[-1]
        if lines[-1]["stop_reason"] == "eos" and all(n["status"] == "accepted" for n in last["nodes"][:1]):
            break
    report = checker.check(strip(lines, {"config.eos_token_id", "header.stops"}))
    assert report.findings == [], [str(f) for f in report.findings]
    assert "eos" in report.not_checked


def test_a_chain_ending_at_a_stop_it_does_not_record_is_not_owed_a_bonus(checker):
    """The last round accepted every draft and ended at a stop sequence; the trace records no
    `stop` (or no stops at all): no bonus was owed, and the report says so."""
    lines = generate(with_stop_from_run(Setup("stop", greedy=True, max_new=40), "ids", 3))
    last = _rounds(lines)[-1]
    assert last["stop"] is not None and all(n["status"] == "accepted" for n in last["nodes"])
    for left_out in ({"round.stop"}, {"round.stop", "header.stops"}):
        report = checker.check(strip(lines, left_out))
        assert report.findings == [], [str(f) for f in report.findings]
        assert "round-structure" in report.not_checked


def test_an_unknown_children_mode_is_named_never_an_internal_error(checker):
    lines = generate(Setup("mode", tree="2,2", children="distinct"))
    for mode in ("weird", 7, None):
        changed = json.loads(json.dumps(lines))
        changed[0]["config"]["proposer_params"]["children"] = mode
        for r in _rounds(changed):
            del r["tree"]
        report = checker.check(changed)
        assert report.findings == [], [str(f) for f in report.findings]
        assert {"tree-walk", "distinct-siblings"} <= set(report.not_checked)


def test_null_draws_and_scalars_are_unknown(checker):
    """`"u": null` on a visited node, `"q_token": null` or `"p_token": null` where the top-N
    does not hold the token: unknown as a left-out field is, never a finding."""
    lines = generate(Setup("nulls", vectors="top-bare", max_new=30))
    for key in ("u", "p_token", "q_token"):
        changed = json.loads(json.dumps(lines))
        for r in _rounds(changed):
            for n in r["nodes"]:
                if n["status"] != "unvisited":
                    n[key] = None
        report = checker.check(changed)
        assert report.findings == [], (key, [str(f) for f in report.findings[:2]])
        assert "acceptance-draw" in report.not_checked


@pytest.mark.parametrize(
    "key, value", [("p_token", 3.0), ("p_token", -0.5), ("q_token", 1.5), ("overlap", 5.0), ("ratio", -1.0)]
)
def test_impossible_probabilities_are_refused_on_import(checker, key, value):
    lines = generate(Setup("bad", max_new=10))
    _rounds(lines)[0]["nodes"][0][key] = value
    with pytest.raises(TraceFormatError, match=f"nodes\\[0\\].{key}"):
        checker.check(lines)


def test_draws_outside_the_unit_interval_are_refused_on_import(checker):
    lines = generate(Setup("bad", max_new=10))
    _rounds(lines)[0]["emitted"][-1]["draw"] = 1.5
    with pytest.raises(TraceFormatError, match="draw"):
        checker.check(lines)


def test_top_entries_listed_in_any_order_give_the_argmax(checker):
    """A greedy top-N trace whose writer lists its top entries smallest first, without
    target_argmax: the argmax is the largest listed entry, not the first."""
    lines = generate(Setup("order", greedy=True, vectors="top", max_new=20))
    for r in _rounds(lines):
        for n in r["nodes"]:
            del n["target_argmax"]
            n["p"].update(top_ids=n["p"]["top_ids"][::-1], top_probs=n["p"]["top_probs"][::-1])
    assert checker.check(lines).findings == []


def test_trace_file_does_not_claim_the_budget_for_a_run_that_stopped_short(tmp_path, checker):
    """A decoder whose loop ends before the budget and without EOS (its own reason) closes
    its TraceFile as completed: the end line leaves the stop reason unknown instead of
    claiming the budget, so the run checks clean and run-end is named not checked."""
    import numpy as np

    from specscope.storage.jsonl.trace_file import TraceFile

    lines = generate(Setup("short", greedy=True, max_new=60))
    path = tmp_path / "short.jsonl"
    with TraceFile(
        path,
        prompt_ids=lines[0]["prompt_ids"],
        vocab_size=32,
        k=3,
        max_new_tokens=60,
        temperature=0.0,
        proposer="short",
    ) as trace:
        for line in _rounds(lines)[:4]:  # the caller stops after 4 rounds
            trace.round(
                draft=[n["token"] for n in line["nodes"]],
                statuses=[n["status"] for n in line["nodes"]],
                p=[np.asarray(n["p"]["full"]) for n in line["nodes"]],
                emitted=[(e["token"], e["kind"]) for e in line["emitted"]],
            )
    report = checker.check([json.loads(x) for x in path.read_text().splitlines()])
    assert report.findings == [], [str(f) for f in report.findings]
    assert "run-end" in report.not_checked


def test_an_unknown_eos_survives_export_and_import(tmp_path):
    """The store keeps the EOS unknown, and its export says so: export -> import -> export
    gives the same bytes, and the re-imported run still names eos as not checked."""
    from specscope.storage import export_run

    lines = generate(Setup("eos-rt", eos=5, max_new=40))
    with TraceStore(tmp_path / "rt.sqlite") as store:
        import_run(store, io.StringIO(jsonl(strip(lines, {"config.eos_token_id", "header.stops"}))), run_id="a")
        first = io.StringIO()
        export_run(store, "a", first)
        assert "eos_token_id" in json.loads(first.getvalue().splitlines()[0])["unrecorded"]
        import_run(store, io.StringIO(first.getvalue()), run_id="b")
        again = io.StringIO()
        export_run(store, "b", again)
        assert again.getvalue().replace('"run_id":"b"', '"run_id":"a"') == first.getvalue()
        info = store.get_run("b")
        report = check_report(info.config, store.iter_rounds("b", full=True), end=info.end)
        assert report.findings == [] and "eos" in report.not_checked


@pytest.mark.parametrize("tree", [None, "2,1"], ids=["chain", "tree"])
def test_a_greedy_decoder_that_records_its_drafts_q_checks_clean(checker, tree):
    """A greedy decision reads only the target's argmax, so a q another decoder logs anyway
    (its draft's softmax, peaked at the drafted token) is information; it was called wrong
    output ('a greedy run recorded a proposal distribution q')."""
    import numpy as np

    from tests.storage.foreign_decoder import dist_obj

    setup = Setup("greedy-q", greedy=True, tree=tree, max_new=20)
    lines = generate(setup)
    rng = np.random.default_rng(0)
    for r in _rounds(lines):
        for n in r["nodes"]:
            q = rng.dirichlet(np.ones(32))
            q[n["token"]] += 5.0
            q /= q.sum()
            n["q"], n["q_token"] = dist_obj(q, setup), float(q[n["token"]])
    assert sum(len(r["nodes"]) for r in _rounds(lines)) > 0
    report = checker.check(lines)
    assert not report.findings, [str(f) for f in report.findings[:3]]


@pytest.mark.parametrize("depth", [0, 3, 7])
def test_a_node_depth_that_contradicts_its_parent_is_refused_in_one_line(checker, depth):
    """The tree view and the shape rules read a node's depth; one that does not follow the
    parents (here node 1, whose parent is node 0 at depth 1) was stored as given."""
    lines = generate(Setup("depth", tree="2,1", max_new=12))
    first = next(r for r in _rounds(lines) if any(n["parent"] >= 0 for n in r["nodes"]))
    node = next(n for n in first["nodes"] if n["parent"] >= 0)
    assert depth != node["depth"]
    node["depth"] = depth
    with pytest.raises(TraceFormatError, match=r"depth.*parent's \+ 1"):
        checker.check(lines)
