"""Traces written by another decoder (issue 31): an adversarial audit of the checker.

tests/storage/foreign_decoder.py is a speculative decoder of another design (numpy bigram
target and draft; chains, static trees with sampled / distinct / top-k children and a dynamic
tree; greedy and sampled; full and top-N vectors; EOS, stop sequences, stop strings, budget
ends) that writes its JSONL by hand. Here:

- every clean trace checks clean (no finding of any severity) with every optional field, with
  only the required ones, with each optional field left out alone (slow) and with seeded
  random subsets left out; and the same traces written through TraceFile;
- bugs injected into the decoder or its record are flagged at their first round, by their rule;
- malformed but parsable values give a one-line import error or a finding, never a traceback
  or an internal finding, and never keep the other runs of a store from being checked;
- `specscope import` / `check` (--json, --strict) exit as documented.

Counts (variants generated and checked, bugs caught) are printed by
`pytest -s tests/storage/jsonl/test_foreign_traces.py -k counts`.
"""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest

from specscope.app.cli.entry import main as cli_main
from specscope.core.check.checker import SEVERITY, WASTED_WORK, check_report
from specscope.storage import TraceStore, import_run
from specscope.storage.errors import TraceFormatError
from specscope.storage.jsonl.trace_file import TraceFile
from tests.storage.foreign_decoder import (
    OPTIONAL,
    Setup,
    V,
    generate,
    jsonl,
    minimal,
    replace,
    strip,
    with_stop_from_run,
)

# --------------------------------------------------------------------------- the clean setups


def _setups() -> list[Setup]:
    chain, tree = Setup("chain", max_new=24), Setup("tree", tree="2,1", max_new=24)
    dynamic = Setup("dynamic", tree="dynamic:nodes=6,depth=3,topk=2", children="topk", max_new=24)
    out = []
    for vectors in ("full", "top", "top-bare"):
        v = "" if vectors == "full" else f"-{vectors}"
        out += [
            replace(chain, name=f"chain-sampled{v}", vectors=vectors),
            replace(chain, name=f"chain-greedy-eos{v}", vectors=vectors, greedy=True, eos=9, max_new=40),
            replace(chain, name=f"chain-sampled-eos{v}", vectors=vectors, eos=5, max_new=40),
            replace(tree, name=f"tree-sampled{v}", vectors=vectors),
            replace(tree, name=f"tree-distinct{v}", vectors=vectors, tree="2,2", children="distinct"),
            replace(tree, name=f"tree-topk-greedy{v}", vectors=vectors, tree="3,2,1", children="topk", greedy=True),
            replace(dynamic, name=f"dynamic{v}", vectors=vectors),
            replace(tree, name=f"tree-eos{v}", vectors=vectors, eos=5, max_new=40),
        ]
    out += [
        with_stop_from_run(replace(chain, name="chain-greedy-stop-ids", greedy=True, max_new=40), "ids", 3),
        with_stop_from_run(replace(chain, name="chain-stop-text", max_new=40), "text", 4),
        with_stop_from_run(replace(tree, name="tree-stop-text-top", vectors="top", max_new=40), "text", 5),
        with_stop_from_run(replace(dynamic, name="dynamic-stop-ids", max_new=40), "ids", 2),
        with_stop_from_run(
            replace(tree, name="tree-greedy-stop-ids", tree="3,2,1", children="topk", greedy=True, max_new=40), "ids", 3
        ),
        replace(chain, name="chain-short-budget", max_new=5, k=4),
        replace(tree, name="tree-short-budget", tree="3,2,1", max_new=4),
        replace(chain, name="chain-t0.7", temperature=0.7),
        replace(chain, name="chain-adaptive-k", adaptive=True, eos=5, max_new=40, vectors="top"),
        replace(chain, name="chain-top-k-filter", top_k=6, vectors="top", top_n=8),
        replace(tree, name="tree-top-k-filter", tree="2,2", children="distinct", top_k=6, vectors="top-bare"),
        replace(dynamic, name="dynamic-greedy", greedy=True),
        replace(tree, name="tree-chain-shaped", tree="1,1,1"),
        replace(tree, name="tree-depth-first", tree="2,2,1", depth_first=True, eos=5, max_new=40, vectors="top"),
    ]
    return out


SETUPS = _setups()
SEEDS = (0, 1)


class Checker:
    """Imports JSONL text into one store and checks the run from there, as `specscope check` does."""

    def __init__(self, path):
        self.store = TraceStore(path)
        self.n = 0

    def check(self, lines: list[dict] | str):
        self.n += 1
        text = lines if isinstance(lines, str) else jsonl(lines)
        run_id = import_run(self.store, io.StringIO(text), run_id=f"r{self.n}")
        info = self.store.get_run(run_id)
        return check_report(info.config, self.store.iter_rounds(run_id, full=True), end=info.end)


@pytest.fixture
def checker(tmp_path):
    c = Checker(tmp_path / "foreign.sqlite")
    yield c
    c.store.close()


def _clean_variants(lines: list[dict], n_random: int, seed: int, singles: bool) -> list[tuple[str, set[str]]]:
    names = sorted(OPTIONAL)
    rng = random.Random(seed)
    variants = [("every field", set()), ("required only", set(names))]
    if singles:
        variants += [(f"without {name}", {name}) for name in names]
    variants += [(f"random subset {i}", {n for n in names if rng.random() < 0.5}) for i in range(n_random)]
    return variants


def _check_clean(checker, setup: Setup, n_random: int, singles: bool) -> int:
    flagged = []
    for seed in SEEDS:
        lines = generate(replace(setup, seed=seed))
        for what, left_out in _clean_variants(lines, n_random, seed, singles and seed == SEEDS[0]):
            report = checker.check(strip(lines, left_out))
            if report.findings:
                flagged.append((seed, what, sorted(left_out), [str(f) for f in report.findings[:2]]))
    assert not flagged, f"{len(flagged)} of {checker.n} variants falsely flagged; first: {flagged[0]}"
    return checker.n


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_a_correct_foreign_decoder_checks_clean_whatever_it_leaves_out(checker, setup):
    _check_clean(checker, setup, n_random=3, singles=False)


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_a_correct_foreign_decoder_checks_clean_leaving_out_each_field(checker, setup):
    _check_clean(checker, setup, n_random=4, singles=True)


def test_required_fields_only_name_what_was_not_checked(checker):
    """Unknown stays unknown: a minimal trace is clean, and its report names the rules its
    left-out fields kept from running."""
    lines = generate(Setup("min", tree="2,1", eos=5, max_new=40, seed=0))
    report = checker.check(minimal(lines))
    assert report.findings == []
    assert {"eos", "tree-walk", "position-limit", "stop-leak", "distinct-siblings"} <= set(report.not_checked)
    assert all(why for why in report.not_checked.values())


# --------------------------------------------------------------------------- the same decoder through TraceFile


def _full(obj):
    return None if obj is None else np.asarray(obj["full"])


def _through_trace_file(lines: list[dict], path) -> None:
    """The decoder's rounds written with TraceFile (full vectors), as docs/writing-traces.md shows."""
    head = lines[0]
    cfg = head["config"]
    tree = cfg.get("proposer_params", {}).get("tree")
    with TraceFile(
        path,
        prompt_ids=head["prompt_ids"],
        vocab_size=cfg["vocab_size"],
        k=cfg["k"],
        max_new_tokens=cfg["max_new_tokens"],
        temperature=cfg["sampling"]["temperature"],
        eos_token_id=cfg["eos_token_id"],
        proposer="foreign-via-tracefile",
        records=("u", "draw"),
    ) as trace:
        for line in lines[1:-1]:
            nodes = line["nodes"]
            extra = {"tree": {k: line["tree"][k] for k in ("children", "path", "tried", "updates")}} if tree else {}
            trace.round(
                draft=[n["token"] for n in nodes],
                statuses=[n["status"] for n in nodes],
                p=[_full(n["p"]) for n in nodes],
                q=None if cfg["sampling"]["temperature"] == 0 else [_full(n["q"]) for n in nodes],
                u=[n["u"] for n in nodes],
                parents=[n["parent"] for n in nodes] if tree else None,
                emitted=[(e["token"], e["kind"], e["draw"]) for e in line["emitted"]],
                bonus_p=_full(line["bonus_p"]),
                **extra,
            )


@pytest.mark.parametrize(
    "setup", [s for s in SETUPS if s.vectors == "full" and not (s.stop_ids or s.stop_strings)], ids=lambda s: s.name
)
def test_the_same_decoder_through_trace_file_checks_clean(checker, tmp_path, setup):
    for seed in SEEDS:
        _through_trace_file(generate(replace(setup, seed=seed)), tmp_path / "tf.jsonl")
        report = checker.check((tmp_path / "tf.jsonl").read_text())
        assert report.findings == [], [str(f) for f in report.findings[:3]]


# --------------------------------------------------------------------------- injected bugs


def _rounds(lines):
    return [line for line in lines if line.get("record") == "round"]


def _first_difference(clean: list[dict], buggy: list[dict]) -> int | None:
    """The first round whose emitted tokens differ (the bug's first round)."""
    for a, b in zip(_rounds(clean), _rounds(buggy)):
        if [e["token"] for e in a["emitted"]] != [e["token"] for e in b["emitted"]]:
            return a["index"]
    return None


def _leak_after(lines, ends) -> tuple[int, str] | None:
    """(round, kind of the token after the end) of the first round that emits past an end."""
    for line in _rounds(lines):
        tokens = [e["token"] for e in line["emitted"]]
        at = next((i for i, t in enumerate(tokens) if t in ends), None)
        if at is not None and at < len(tokens) - 1:
            return line["index"], line["emitted"][at + 1]["kind"]
    return None


def _decoder_bug(base: Setup, bug: str, seeds=range(40), want: str | None = None) -> tuple[list[dict], int]:
    """A trace of `base` with `bug` that fired (first round found against the clean run)."""
    for seed in seeds:
        setup = replace(base, seed=seed)
        buggy = generate(replace(setup, bug=bug))
        if bug == "eos-leak":
            leak = _leak_after(buggy, {base.eos})
            if leak is not None and (want is None or leak[1] == want):
                return buggy, leak[0]
            continue
        if bug == "stop-leak":
            rounds = _rounds(buggy)
            hit = next((r for r in rounds if r.get("stop") and r["stop"]["position"] < len(r["emitted"]) - 1), None)
            if hit is not None and (want is None or hit["emitted"][hit["stop"]["position"] + 1]["kind"] == want):
                return buggy, hit["index"]
            continue
        if bug == "with-replacement":
            for r in _rounds(buggy):
                pairs = [(n["parent"], n["token"]) for n in r["nodes"]]
                if len(set(pairs)) < len(pairs):
                    return buggy, r["index"]
            continue
        if bug == "budget-overshoot":
            for r in _rounds(buggy):
                if len(r["emitted"]) > r["remaining_budget"] or _depth(r) > r["remaining_budget"]:
                    return buggy, r["index"]
            continue
        if bug == "end-ignored":  # the round the clean run ended in
            clean = generate(setup)
            if clean[-1]["stop_reason"] in ("eos", "stop"):
                return buggy, _rounds(clean)[-1]["index"]
            continue
        first = _first_difference(generate(setup), buggy)
        if first is not None:
            return buggy, first
    raise AssertionError(f"{bug} never fired on {base.name}")


def _depth(r) -> int:
    return max((n["depth"] for n in r["nodes"]), default=0)


def _mutate(lines, change) -> list[dict]:
    lines = json.loads(json.dumps(lines))
    return change(lines)


def _wrong_reason(reason: str):
    def change(lines):
        lines[-1]["stop_reason"] = reason
        return lines, _rounds(lines)[-1]["index"]

    return change


def _spec(spec: str, children: str | None = None):
    """The trace relabelled with another declared tree (header and every round); the first
    round the declared shape cannot hold."""

    def change(lines):
        lines[0]["config"]["proposer_params"]["tree"] = spec
        for r in _rounds(lines):
            r["tree"]["spec"] = spec
            if children:
                r["tree"]["children"] = children
                lines[0]["config"]["proposer_params"]["children"] = children
        return lines, None

    return change


def _accept_against_u(lines):
    """An accepted proposal whose recorded u is at or above min(1, p/q)."""
    for r in _rounds(lines):
        for n in r["nodes"]:
            if (
                n["status"] == "accepted"
                and n.get("q_token")
                and n["p_token"] / n["q_token"] < 0.9
                and (n["parent"] == -1 or n["parent"] == n["index"] - 1)
            ):
                n["u"] = (1 + n["p_token"] / n["q_token"]) / 2
                return lines, r["index"]
    raise AssertionError("no accepted proposal with p/q < 0.9")


def _position_limit(lines):
    r = _rounds(lines)[3]
    lines[0]["config"]["position_limit"] = r["prefix_len"] + len(r["emitted"]) - 1
    return lines, 3


def _repair_at_zero(lines):
    """A top-k tree round whose repair is a rejected child's token: its entry of the final p'
    is exactly 0 (the update zeroed it; exact_ids records it)."""
    for r in _rounds(lines):
        repair = [e for e in r["emitted"] if e["kind"] == "repaired"]
        if repair and r["tree"]["updates"]:
            last = r["tree"]["updates"][-1]
            token = r["nodes"][last["child"]]["token"]
            assert token in last["exact_ids"] and last["exact_probs"][last["exact_ids"].index(token)] == 0.0
            repair[0]["token"] = token
            r["pieces"][-1] = "zz"
            lines[-1]["new_tokens"] = [e["token"] for x in _rounds(lines) for e in x["emitted"]]
            return lines, r["index"]
    raise AssertionError("no repaired top-k round")


CHAIN_EOS = Setup("chain-eos", eos=5, max_new=40)
TREE_EOS = Setup("tree-eos", tree="2,1", eos=5, max_new=40)
DYNAMIC_TOP = Setup("dynamic-top", tree="dynamic:nodes=6,depth=3,topk=2", children="topk", vectors="top", max_new=30)
DYNAMIC_TOP_SAMPLED_ROOT = replace(DYNAMIC_TOP, tree="dynamic:nodes=6,depth=3,topk=3")


def _ended(setup: Setup, reason: str) -> list[dict]:
    """A clean trace of `setup` (the first seed) whose run ended for `reason`."""
    for seed in range(40):
        lines = generate(replace(setup, seed=seed))
        if lines[-1]["stop_reason"] == reason:
            return lines
    raise AssertionError(f"no run of {setup.name} ended at {reason}")


def _stop_setup(at: int = 4) -> Setup:
    """A greedy chain with a stop sequence its clean run completes (mid-round for at = 1, 3, 7)."""
    return with_stop_from_run(Setup("stop", greedy=True, max_new=40), "ids", at)


# name -> (how the buggy trace is made, the rules that may flag its first round)
BUGS = {
    "eos inside an accepted block": (lambda: _decoder_bug(CHAIN_EOS, "eos-leak", want="accepted"), {"eos"}),
    "eos then a bonus": (
        lambda: _decoder_bug(replace(CHAIN_EOS, greedy=True, eos=24), "eos-leak", want="bonus"),
        {"eos"},
    ),
    "eos then a repair": (lambda: _decoder_bug(CHAIN_EOS, "eos-leak", want="repaired"), {"eos"}),
    "eos leak in a tree": (lambda: _decoder_bug(TREE_EOS, "eos-leak"), {"eos", "round-structure", "tree-walk"}),
    "stop then accepted tokens": (lambda: _decoder_bug(_stop_setup(1), "stop-leak", [0], "accepted"), {"stop-leak"}),
    "stop then a bonus": (lambda: _decoder_bug(_stop_setup(3), "stop-leak", [0], "bonus"), {"stop-leak"}),
    "stop then a repair": (lambda: _decoder_bug(_stop_setup(7), "stop-leak", [0], "repaired"), {"stop-leak"}),
    "stop leak in a tree": (
        lambda: _decoder_bug(
            with_stop_from_run(Setup("ts", tree="3,2,1", children="topk", greedy=True, max_new=40), "ids", 3),
            "stop-leak",
            seeds=[0],
        ),
        {"stop-leak", "round-structure", "tree-walk"},
    ),
    "eos ignored, the run goes on": (lambda: _decoder_bug(CHAIN_EOS, "end-ignored"), {"eos"}),
    "eos ignored in a tree": (
        lambda: _decoder_bug(replace(TREE_EOS, vectors="top"), "end-ignored"),
        {"eos", "round-structure", "tree-walk"},
    ),
    "stop ignored, the run goes on": (
        lambda: _decoder_bug(_stop_setup(3), "end-ignored", [0]),
        {"stop-flag", "stop-leak"},
    ),
    "stop string ignored in a tree": (
        lambda: _decoder_bug(with_stop_from_run(replace(TREE_EOS, eos=None), "text", 4), "end-ignored", [0]),
        {"stop-flag", "stop-leak", "round-structure", "tree-walk"},
    ),
    "eos run says budget": (lambda: _mutate(_ended(CHAIN_EOS, "eos"), _wrong_reason("budget")), {"run-end"}),
    "stop run says eos": (
        lambda: _mutate(_ended(_stop_setup(), "stop"), _wrong_reason("eos")),
        {"finish-reason", "run-end"},
    ),
    "budget overshoot": (
        lambda: _decoder_bug(Setup("over", max_new=20), "budget-overshoot"),
        {"budget", "draft-budget"},
    ),
    "tree budget overshoot": (
        lambda: _decoder_bug(Setup("tover", tree="2,1", max_new=20), "budget-overshoot"),
        {"budget", "draft-budget", "round-structure", "tree-walk"},
    ),
    "repair from p (chain)": (lambda: _decoder_bug(Setup("rp"), "repair-from-p"), {"draw", "residual"}),
    "repair from p (tree)": (
        lambda: _decoder_bug(Setup("rpt", tree="2,1"), "repair-from-p"),
        {"draw", "residual", "round-structure", "tree-walk"},
    ),
    "siblings repeat without replacement": (
        lambda: _decoder_bug(Setup("wr", tree="2,2", children="distinct"), "with-replacement"),
        {"distinct-siblings"},
    ),
    "siblings repeat without replacement (top-N)": (
        lambda: _decoder_bug(Setup("wrt", tree="2,2", children="distinct", vectors="top"), "with-replacement"),
        {"distinct-siblings"},
    ),
    "accepted with u >= p/q": (lambda: _mutate(generate(Setup("u")), _accept_against_u), {"acceptance-draw"}),
    "accepted with u >= p'/q in a tree": (
        lambda: _mutate(generate(Setup("ut", tree="2,1")), _accept_against_u),
        {"acceptance-draw", "tree-walk"},
    ),
    "position past the limit": (lambda: _mutate(generate(Setup("pos")), _position_limit), {"position-limit"}),
    "tree over its node budget": (lambda: _mutate(generate(Setup("nb", tree="2,1")), _spec("1,1")), {"tree-shape"}),
    "tree deeper than its depth": (
        lambda: _mutate(generate(DYNAMIC_TOP), _spec("dynamic:nodes=6,depth=2,topk=2")),
        {"tree-shape"},
    ),
    "sampled children under a dynamic tree": (
        lambda: _mutate(generate(DYNAMIC_TOP), _spec(DYNAMIC_TOP.tree, "sampled")),
        {"tree-shape"},
    ),
    "top-N repair at p' = 0": (lambda: _mutate(generate(DYNAMIC_TOP), _repair_at_zero), {"residual", "draw"}),
}


def _bug_round(lines: list[dict], first: int | None) -> int:
    return 0 if first is None else first


@pytest.mark.parametrize("name", sorted(BUGS))
def test_each_injected_bug_is_flagged_at_its_first_round(checker, name):
    make, rules = BUGS[name]
    lines, first = make()
    first = _bug_round(lines, first)
    if name.startswith("tree deeper"):
        first = next(r["index"] for r in _rounds(lines) if _depth(r) > 2)
    report = checker.check(lines)
    assert report.findings, f"{name}: not flagged"
    assert not [f for f in report.findings if f.rule == "internal"]
    at_first = {f.rule for f in report.findings if f.round == first}
    assert min(f.round for f in report.findings) == first, [str(f) for f in report.findings[:3]]
    assert at_first & rules, f"{name}: round {first} flagged by {sorted(at_first)}, expected one of {sorted(rules)}"
    # with only the required fields: flagged there, or the rule that would flag it named not
    # checked (a wrong end line needs the end line, which is optional: kept for those)
    bare = checker.check(
        minimal(lines) if "says" not in name else strip(lines, set(OPTIONAL) - {"end", "end.stop_reason"})
    )
    assert not [f for f in bare.findings if f.round < first], [str(f) for f in bare.findings[:3]]
    assert any(f.round == first for f in bare.findings) or rules & set(bare.not_checked), (name, bare.not_checked)


@pytest.mark.parametrize(
    "reason, setup",
    [
        ("stop", CHAIN_EOS),
        ("eos", _stop_setup()),
        ("budget", _stop_setup()),
        ("eos", Setup("b", max_new=20)),
        ("stop", Setup("b", max_new=20)),
    ],
    ids=["eos-says-stop", "stop-says-eos", "stop-says-budget", "budget-says-eos", "budget-says-stop"],
)
def test_a_finish_reason_the_tokens_contradict_is_flagged(checker, reason, setup):
    for seed in range(10):
        lines = generate(replace(setup, seed=seed))
        if lines[-1]["stop_reason"] != reason:
            break
    assert lines[-1]["stop_reason"] != reason
    lines[-1]["stop_reason"] = reason
    report = checker.check(lines)
    assert {f.rule for f in report.findings} & {"finish-reason", "run-end"}, [str(f) for f in report.findings]
    assert all(SEVERITY[f.rule] != WASTED_WORK for f in report.findings)


def test_an_end_count_with_tokens_past_the_stop_is_flagged(checker):
    lines, first = _decoder_bug(_stop_setup(1), "stop-leak", seeds=[0])
    report = checker.check(lines)
    assert "end-count" in {f.rule for f in report.findings}
    lines, first = _decoder_bug(CHAIN_EOS, "eos-leak")
    assert "end-count" in {f.rule for f in checker.check(lines).findings}


def test_budget_counted_with_tokens_past_the_stop_is_flagged(checker):
    """A leaking decoder whose leaked tokens reach the budget sets budget_stop: stop-budget."""
    for at in range(2, 12):
        setup = with_stop_from_run(Setup("sb", greedy=True, max_new=40), "ids", at)
        buggy = generate(replace(setup, bug="stop-leak"))
        hit = next((r for r in _rounds(buggy) if r.get("stop") and r["stop"]["position"] < len(r["emitted"]) - 1), None)
        if hit is None:
            continue
        budget = hit["emitted_before"] + len(hit["emitted"])
        buggy = generate(replace(setup, bug="stop-leak", max_new=budget))
        hit = next((r for r in _rounds(buggy) if r.get("stop")), None)
        if hit is None or not hit["budget_stop"] or hit["stop"]["position"] == len(hit["emitted"]) - 1:
            continue
        report = checker.check(buggy)
        assert "stop-budget" in {f.rule for f in report.findings if f.round == hit["index"]}
        return
    raise AssertionError("no leak reached the budget")


def test_a_repeated_sibling_does_not_stop_the_other_runs(tmp_path, capsys):
    """A finding, not an abort: the store's other runs are still checked and reported."""
    buggy, first = _decoder_bug(Setup("wr", tree="2,2", children="distinct"), "with-replacement")
    paths = []
    for i, lines in enumerate([generate(Setup("clean-a", seed=3)), buggy, generate(Setup("clean-b", tree="2,1"))]):
        paths.append(tmp_path / f"{i}.jsonl")
        paths[-1].write_text(jsonl(lines))
    db = str(tmp_path / "s.sqlite")
    for path in paths:
        assert cli_main(["import", str(path), "--db", db]) == 0
    capsys.readouterr()
    assert cli_main(["check", db, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_run = {r["run_id"]: r for r in report["runs"]}
    assert set(by_run) == {"foreign-clean-a", "foreign-wr", "foreign-clean-b"}
    assert by_run["foreign-clean-a"]["findings"] == [] and by_run["foreign-clean-b"]["findings"] == []
    rules = {f["rule"] for f in by_run["foreign-wr"]["findings"]}
    assert "distinct-siblings" in rules and "internal" not in rules
    assert min(f["round"] for f in by_run["foreign-wr"]["findings"]) == first


# --------------------------------------------------------------------------- malformed but parsable


def _node0(lines, i=0):
    return _rounds(lines)[0]["nodes"][i]


def _set(get, **values):
    def change(lines):
        get(lines).update(values)
        return lines

    return change


def _each_round(change):
    def apply(lines):
        for r in _rounds(lines):
            change(r)
        return lines

    return apply


CHAIN, CHAIN_TOP = Setup("mc", max_new=20), Setup("mct", max_new=20, vectors="top")
TREE, TREE_TOP = Setup("mt", tree="2,1", max_new=20), Setup("mtt", tree="2,1", max_new=20, vectors="top")
GREEDY_TOP = Setup("mgt", greedy=True, max_new=20, vectors="top")
ROUND0 = lambda lines: _rounds(lines)[0]  # noqa: E731
TREE0 = lambda lines: _rounds(lines)[0]["tree"]  # noqa: E731
CONFIG = lambda lines: lines[0]["config"]  # noqa: E731
END = lambda lines: lines[-1]  # noqa: E731

MALFORMED = {
    "u null on a visited node": (CHAIN, _set(_node0, u=None)),
    "u a string": (CHAIN, _set(_node0, u="0.5")),
    "u = 1": (CHAIN, _set(_node0, u=1.0)),
    "p_token null": (CHAIN_TOP, _set(_node0, p_token=None)),
    "p_token negative": (CHAIN, _set(_node0, p_token=-0.5)),
    "p_token above 1": (CHAIN, _set(_node0, p_token=3.0)),
    "q_token null": (CHAIN_TOP, _set(_node0, q_token=None)),
    "q_token 0": (CHAIN, _set(_node0, q_token=0.0)),
    "ratio negative": (CHAIN, _set(_node0, ratio=-1.0)),
    "overlap above 1": (CHAIN, _set(_node0, overlap=5.0)),
    "draw above 1": (
        CHAIN,
        _each_round(lambda r: [e.update(draw=1.5) for e in r["emitted"] if e["kind"] != "accepted"]),
    ),
    "draw null": (CHAIN, _each_round(lambda r: [e.update(draw=None) for e in r["emitted"]])),
    "residual_mass negative": (
        CHAIN,
        _each_round(lambda r: r.update(residual_mass=-1.0) if r["residual_mass"] else None),
    ),
    "k null": (CHAIN, _set(ROUND0, k=None)),
    "k a boolean": (CHAIN, _set(ROUND0, k=True)),
    "prefix_len negative": (CHAIN, _set(ROUND0, prefix_len=-5)),
    "remaining_budget huge": (CHAIN, _set(ROUND0, remaining_budget=2**62)),
    "parent -2": (TREE, _set(lambda lines: _node0(lines, 2), parent=-2)),
    "parent past the nodes": (TREE, _set(lambda lines: _node0(lines, 2), parent=9)),
    "parent is itself": (TREE, _set(lambda lines: _node0(lines, 2), parent=2)),
    "parent null": (TREE, _set(lambda lines: _node0(lines, 2), parent=None)),
    "depth not the parent's + 1": (TREE, _set(lambda lines: _node0(lines, 2), depth=7)),
    "status unknown": (CHAIN, _set(_node0, status="maybe")),
    "end status unknown": (CHAIN, _set(END, status="weird")),
    "stop_reason unknown": (CHAIN, _set(END, stop_reason="length")),
    "completed with stop_reason cancelled": (CHAIN, _set(END, stop_reason="cancelled")),
    "p sums to 0.5": (
        CHAIN,
        lambda lines: _set(_node0, p={"full": [x / 2 for x in _node0(lines)["p"]["full"]]})(lines),
    ),
    "p all zero": (CHAIN, _set(_node0, p={"full": [0.0] * V})),
    "q all zero": (CHAIN, _set(_node0, q={"full": [0.0] * V})),
    "top-N total 0.7": (CHAIN_TOP, lambda lines: _node0(lines)["p"].update(total=0.7) or lines),
    "top-N probabilities null": (CHAIN_TOP, lambda lines: _node0(lines)["p"].update(top_probs=[None] * 4) or lines),
    "top-N listed in ascending order": (
        GREEDY_TOP,
        _each_round(
            lambda r: [
                d.update(top_ids=d["top_ids"][::-1], top_probs=d["top_probs"][::-1])
                for n in r["nodes"]
                for d in [n["p"]]
            ]
        ),
    ),
    "NaN": (CHAIN, "NaN"),
    "Infinity": (CHAIN, "Infinity"),
    "emitted kind unknown": (CHAIN, lambda lines: ROUND0(lines)["emitted"][0].update(kind="magic") or lines),
    "emitted node past the nodes": (CHAIN, lambda lines: ROUND0(lines)["emitted"][0].update(node=99) or lines),
    "no nodes, tokens emitted": (TREE, _set(ROUND0, nodes=[])),
    "a tree object on a chain round": (CHAIN, _set(ROUND0, tree={"children": "sampled", "path": [], "tried": []})),
    "tree children unknown": (TREE, _set(TREE0, children="weird")),
    "tree path past the nodes": (TREE, _set(TREE0, path=[99])),
    "tree path repeats a node": (TREE, _set(TREE0, path=[0, 0])),
    "tree tried malformed": (TREE, _set(TREE0, tried=[[-1]])),
    "tree update's child past the nodes": (TREE, _set(TREE0, updates=[{"parent": -1, "child": 99, "mass": 0.5}])),
    "tree update's mass null": (TREE, _each_round(lambda r: [u.update(mass=None) for u in r["tree"]["updates"]])),
    "tree update's mass 0 (top-N)": (
        TREE_TOP,
        _each_round(lambda r: [u.update(mass=0.0) for u in r["tree"]["updates"]]),
    ),
    "tree positions negative": (TREE, lambda lines: TREE0(lines).update(positions=[-1] * 4) or lines),
    "tree kept_rows negative": (TREE, _set(TREE0, kept_rows=[-3])),
    "tree spec garbage": (TREE, _set(TREE0, spec="banana")),
    "tree spec too big": (TREE, _set(TREE0, spec="dynamic:nodes=999999999,depth=2,topk=2")),
    "proposer_params.children unknown": (
        TREE,
        lambda lines: (
            [CONFIG(lines)["proposer_params"].update(children="weird")]
            and [r.pop("tree") for r in _rounds(lines)]
            and lines
        ),
    ),
    "proposer_params.children a number": (
        TREE,
        lambda lines: (
            [CONFIG(lines)["proposer_params"].update(children=7)] and [r.pop("tree") for r in _rounds(lines)] and lines
        ),
    ),
    "proposer_params.tree a number": (
        TREE,
        lambda lines: (
            [CONFIG(lines)["proposer_params"].update(tree=7)] and [r.pop("tree") for r in _rounds(lines)] and lines
        ),
    ),
    "target cache negative": (CHAIN, _set(ROUND0, target_cache={"before": -5, "peak": -5, "after": -5, "pending": []})),
    "stop index past the stops": (
        CHAIN,
        lambda lines: (
            (
                [lines[0]["stops"].update(ids=[[7, 7]])]
                and [r.update(stop=None) for r in _rounds(lines)]
                and ROUND0(lines).update(stop={"kind": "ids", "index": 5, "position": 0})
            )
            or lines
        ),
    ),
    "pieces of the wrong length": (CHAIN, _set(ROUND0, pieces=["a"])),
    "position_limit 0": (CHAIN, _set(CONFIG, position_limit=0)),
    "position_limit null": (CHAIN, _set(CONFIG, position_limit=None)),
    "max_new_tokens 0": (CHAIN, _set(CONFIG, max_new_tokens=0)),
    "unrecorded names every field": (
        CHAIN,
        lambda lines: (
            lines[0].update(
                unrecorded=[
                    "u",
                    "draw",
                    "q",
                    "p_token",
                    "q_token",
                    "eos",
                    "budget_stop",
                    "bonus_withheld",
                    "target_cache",
                    "k",
                    "updates",
                    "kept_rows",
                    "eos_token_id",
                ]
            )
            or lines
        ),
    ),
}


def _malformed_text(name: str) -> str:
    setup, change = MALFORMED[name]
    lines = generate(setup)
    if isinstance(change, str):  # a literal JSON does not allow
        return jsonl(lines).replace(repr(_node0(lines)["u"]), change, 1)
    return jsonl(change(json.loads(json.dumps(lines))))


INTERNAL_WORDS = ("NoneType", "not supported between", "object has no attribute", "Traceback", "index out of")


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_values_give_one_line_errors_or_findings(checker, name):
    try:
        report = checker.check(_malformed_text(name))
    except TraceFormatError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("line ")
        return
    assert not [str(f) for f in report.findings if f.rule == "internal"]
    assert not [str(f) for f in report.findings if any(w in f.message for w in INTERNAL_WORDS)]


def test_a_malformed_run_does_not_stop_the_others(tmp_path, capsys):
    """Every importable malformed run and a clean one in one store: `specscope check` reports
    each of them, none with an internal finding, and the clean one clean."""
    db = str(tmp_path / "m.sqlite")
    imported = []
    for i, name in enumerate(sorted(MALFORMED)):
        path = tmp_path / f"{i}.jsonl"
        path.write_text(_malformed_text(name).replace('"run_id": "foreign-', f'"run_id": "m{i}-', 1))
        if cli_main(["import", str(path), "--db", db]) == 0:
            imported.append(name)
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1
    clean = tmp_path / "clean.jsonl"
    clean.write_text(jsonl(generate(Setup("clean", tree="2,1"))))
    assert cli_main(["import", str(clean), "--db", db]) == 0
    capsys.readouterr()
    cli_main(["check", db, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert len(report["runs"]) == len(imported) + 1
    assert not [f for r in report["runs"] for f in r["findings"] if f["rule"] == "internal"]
    assert next(r for r in report["runs"] if r["run_id"] == "foreign-clean")["findings"] == []


# --------------------------------------------------------------------------- the command line


def test_cli_exit_codes(tmp_path, capsys):
    """Clean: 0. Wrong output: 1. Wasted work only: 0, and 1 with --strict."""
    cases = {
        "clean": generate(Setup("c", tree="2,1")),
        "wrong": _decoder_bug(CHAIN_EOS, "eos-leak")[0],
        "wasted": _mutate(generate(Setup("w", max_new=20)), lambda lines: _rounds(lines)[-1].update(k=5) or lines),
    }
    for name, lines in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(jsonl(lines))
        db = str(tmp_path / f"{name}.sqlite")
        assert cli_main(["import", str(path), "--db", db]) == 0
        capsys.readouterr()
        status, strict = cli_main(["check", db]), cli_main(["check", db, "--strict"])
        out = capsys.readouterr().out
        assert cli_main(["check", db, "--json"]) == status
        report = json.loads(capsys.readouterr().out)
        want = {"clean": (0, 0), "wrong": (1, 1), "wasted": (0, 1)}[name]
        assert (status, strict) == want, (name, out)
        assert "not checked:" in out
        if name == "wasted":
            assert report["wrong_output"] == 0 and report["wasted_work"] >= 1


# --------------------------------------------------------------------------- counts


def test_counts(tmp_path, capsys):
    """What the fast tests generate: printed for the record (`-s -k counts`)."""
    variants = len(SETUPS) * len(SEEDS) * len(_clean_variants([], 3, 0, False))
    slow = len(SETUPS) * (
        len(_clean_variants([], 4, 0, True)) + (len(SEEDS) - 1) * len(_clean_variants([], 4, 0, False))
    )
    print(
        f"\nclean setups {len(SETUPS)}; variants checked: fast {variants}, slow {slow}; "
        f"injected bugs {len(BUGS)}; malformed values {len(MALFORMED)}"
    )
    assert variants > 100
