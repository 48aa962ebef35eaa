"""The checker never guesses (issue 31): recorded traces of every kind, written with every
subset of the optional fields the format allows (a seeded random sample of the subsets, and
the two extremes), check clean; each fault of the zoo, written the same way, is flagged at
its first round where its fields allow it, and otherwise the rule that would flag it is
named as not checked. Token trees written by another decoder (TraceFile with parents)
included.

Every trace goes through the JSONL importer into a store and is checked from the store, as
`specscope check` reads it.
"""

from __future__ import annotations

import functools
import io
import json
import random

import numpy as np
import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.decode.stops import Stops
from specscope.core.faults.zoo import FAULTS, faulty_decoder
from specscope.core.sampling.reference import sample_from
from specscope.storage import TraceStore, TraceWriter, export_run, import_run
from specscope.storage.jsonl.trace_file import TraceFile
from tests.tiny_models import noisy_copy, tiny_lm

# --------------------------------------------------------------------------- optional fields


def _drop(d: dict, *keys: str) -> None:
    for key in keys:
        d.pop(key, None)


def _dists(line: dict):
    """Every distribution object of a round line."""
    for n in line["nodes"]:
        for key in ("p", "q"):
            if n.get(key):
                yield n[key]
    for key in ("bonus_p", "residual"):
        if line.get(key):
            yield line[key]
    for u in (line.get("tree") or {}).get("updates", []):
        if u.get("p_after"):
            yield u["p_after"]


def _no_full(d: dict) -> None:
    if d.get("top_ids") is not None:
        d["full"] = None


def _no_top(d: dict) -> None:
    if d.get("full") is not None:
        _drop(d, "top_ids", "top_probs")


def _no_stats(d: dict) -> None:
    _drop(d, "support", "minimum", "total")


def _tree_part(key: str):
    def apply(line: dict) -> None:
        if line.get("tree"):
            _drop(line["tree"], key)

    return apply


def _updates(change):
    def apply(line: dict) -> None:
        for u in (line.get("tree") or {}).get("updates", []):
            change(u)

    return apply


# name -> (where: header | round | node | emitted | dist | end, change in place)
HEADER_FIELDS = ("prompt_text", "models", "library_versions", "extra", "storage", "stops")
CONFIG_FIELDS = ("seed", "proposer", "device", "dtype", "use_cache", "fault", "position_limit")
ROUND_FIELDS = (
    "emitted_before",
    "prefix_len",
    "remaining_budget",
    "k",
    "greedy",
    "bonus_p",
    "rejected_node",
    "residual",
    "residual_mass",
    "eos",
    "budget_stop",
    "bonus_withheld",
    "target_cache",
    "draft_cache",
    "timings",
    "draft_forwards",
    "target_forwards",
    "tree",
    "stop",
    "pieces",
)
NODE_FIELDS = ("index", "depth", "q", "u", "p_token", "q_token", "ratio", "overlap", "target_argmax", "confidence")
EMITTED_FIELDS = ("node", "draw")
END_FIELDS = ("stop_reason", "new_tokens", "error", "ended_at", "wall_s")


def optional_fields(tree: bool) -> dict[str, tuple[str, object]]:
    fields: dict[str, tuple[str, object]] = {}
    for key in HEADER_FIELDS:
        fields[f"header.{key}"] = ("header", lambda h, key=key: _drop(h, key))
    for key in CONFIG_FIELDS:
        fields[f"config.{key}"] = ("header", lambda h, key=key: _drop(h["config"], key))
    for key in ROUND_FIELDS:
        fields[key] = ("round", lambda r, key=key: _drop(r, key))
    for key in NODE_FIELDS + (() if tree else ("parent",)):  # a tree's parents are required
        fields[f"node.{key}"] = ("node", lambda n, key=key: _drop(n, key))
    for key in EMITTED_FIELDS:
        fields[f"emitted.{key}"] = ("emitted", lambda e, key=key: _drop(e, key))
    fields["dist.full"] = ("dist", _no_full)
    fields["dist.top"] = ("dist", _no_top)
    fields["dist.stats"] = ("dist", _no_stats)
    for key in ("spec", "updates", "positions", "visible", "kept_rows"):
        fields[f"tree.{key}"] = ("round", _tree_part(key))
    fields["tree.updates.p_after"] = ("round", _updates(lambda u: u.update(p_after=None)))
    fields["tree.updates.mass"] = ("round", _updates(lambda u: _drop(u, "mass")))
    fields["tree.updates.exact"] = ("round", _updates(lambda u: _drop(u, "exact_ids", "exact_probs")))
    for key in END_FIELDS:
        fields[f"end.{key}"] = ("end", lambda e, key=key: _drop(e, key))
    fields["end"] = ("end", None)  # no end line at all
    return fields


def without(lines: list[dict], names: set[str], fields: dict) -> str:
    """The trace with the named optional fields left out of every line, as JSONL text."""
    out = []
    # a JSON round trip copies the lines (JSON values only) several times faster than deepcopy
    for i, line in enumerate(json.loads(json.dumps(lines))):
        record = "run" if i == 0 else line.get("record")
        if record == "end" and "end" in names:
            continue
        for name in sorted(names):
            where, change = fields[name]
            if (record == "run" and where == "header") or (record == "end" and where == "end" and change is not None):
                change(line)
            elif record == "round":
                if where == "round":
                    change(line)
                elif where == "node":
                    for n in line["nodes"]:
                        change(n)
                elif where == "emitted":
                    for e in line["emitted"]:
                        change(e)
        if record == "round":  # distribution fields last: a dropped residual has none to change
            for name in sorted(names):
                where, change = fields[name]
                if where == "dist":
                    for d in list(_dists(line)):
                        change(d)
        out.append(json.dumps(line))
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- recorded traces


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def _eos_for(target, draft) -> int:
    """A token the clean run emits early, so that EOS lands inside a round."""
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=1.0))
    return dec.generate([1, 2, 3, 4], 16, seed=0).new_tokens[6]


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _piece(token: int) -> str:
    """A fake tokenizer's text: pieces of one to three characters, so stop strings span tokens."""
    return LETTERS[token % 26] * (1 + token % 3)


@functools.cache
def _clean_greedy(target, draft) -> tuple[int, ...]:
    """The clean greedy run's output, decoded once: every stop setup cuts its stop from it."""
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0))
    return tuple(dec.generate([1, 2, 3, 4], 30, seed=0).new_tokens)


def _stops_for(target, draft, a: int = 5, b: int = 3, sequence: bool = False) -> Stops:
    """A stop the clean greedy run completes at output position a + b - 1: a string spanning
    tokens (its first character dropped) or a token sequence."""
    out = _clean_greedy(target, draft)
    if sequence:
        return Stops(sequences=(tuple(out[a : a + b]),))
    return Stops(strings=("".join(_piece(t) for t in out[a : a + b])[1:],))


def _decoders(target, draft, eos):
    t1 = SamplingConfig(temperature=1.0)
    greedy = SamplingConfig(temperature=0)
    tree = lambda spec, children: DraftModelProposer(draft, tree=spec, children=children)  # noqa: E731
    return {
        "chain-greedy": SpeculativeDecoder(
            target, DraftModelProposer(draft), k=4, sampling=SamplingConfig(temperature=0)
        ),
        "chain-sampled-eos": SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=t1, eos_token_id=eos),
        "chain-topk-topp-budget": SpeculativeDecoder(
            target, DraftModelProposer(draft), k=3, sampling=SamplingConfig(temperature=0.8, top_k=8, top_p=0.9)
        ),
        "coupled": SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=t1, coupling_seed=5),
        "tree-sampled": SpeculativeDecoder(target, tree("3,2,1", "sampled"), sampling=t1, eos_token_id=eos),
        "tree-distinct": SpeculativeDecoder(
            target, tree("2,2", "distinct"), sampling=SamplingConfig(temperature=1.0, top_k=8)
        ),
        "tree-topk-greedy": SpeculativeDecoder(target, tree("3,2,1", "topk"), sampling=SamplingConfig(temperature=0)),
        "tree-dynamic": SpeculativeDecoder(
            target, tree("dynamic:nodes=8,depth=3,topk=2", "topk"), sampling=SamplingConfig(temperature=1.0, top_p=0.9)
        ),
        "chain-greedy-stop-string": SpeculativeDecoder(
            target, DraftModelProposer(draft), k=4, sampling=greedy, stops=_stops_for(target, draft), token_piece=_piece
        ),
        "tree-greedy-stop-ids": SpeculativeDecoder(
            target,
            tree("3,2,1", "topk"),
            sampling=greedy,
            stops=_stops_for(target, draft, sequence=True),
            token_piece=_piece,
        ),
    }


def _exported(store, dec, full: bool, seed: int, max_new: int = 14, prompt=(1, 2, 3, 4)) -> list[dict]:
    config = dec.run_config(list(prompt), max_new, seed=seed)
    with TraceWriter(store, config, full_vectors=full, top_n=6) as writer:
        writer.record(dec.rounds(list(prompt), max_new, config=config))
    buf = io.StringIO()
    export_run(store, config.run_id, buf)
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def _hf_trace(store, target, draft, full: bool) -> list[dict]:
    from specscope.core.engines import TransformersEngine

    engine = TransformersEngine(target, kind="assisted", draft=draft, k=3, sampling=SamplingConfig(temperature=1.0))
    return _exported(store, engine, full, seed=1)


@pytest.fixture(scope="module")
def traces(models, tmp_path_factory):
    """(kind, vectors) -> the exported JSONL lines of a clean run."""
    target, draft = models
    eos = _eos_for(target, draft)
    out = {}
    with TraceStore(tmp_path_factory.mktemp("rec") / "rec.sqlite") as store:
        for full in (True, False):
            vectors = "full" if full else "top-n"
            for name, dec in _decoders(target, draft, eos).items():
                out[(name, vectors)] = _exported(store, dec, full, seed=1)
            out[("transformers", vectors)] = _hf_trace(store, target, draft, full)
    return out


class Checker:
    """Imports JSONL text into one store and checks it from there; counts what it checked."""

    def __init__(self, path):
        self.store = TraceStore(path)
        self.n = 0

    def check(self, text: str):
        self.n += 1
        run_id = import_run(self.store, io.StringIO(text), run_id=f"r{self.n}")
        info = self.store.get_run(run_id)
        return check_report(info.config, self.store.iter_rounds(run_id, full=True), end=info.end)


def subsets(fields: dict, n: int, seed: int) -> list[set[str]]:
    """Nothing left out, everything left out, and n seeded random subsets (each field left
    out with probability 1/2)."""
    names = sorted(fields)
    rng = random.Random(seed)
    return [set(), set(names)] + [{f for f in names if rng.random() < 0.5} for _ in range(n)]


KINDS = [
    (name, vectors)
    for vectors in ("full", "top-n")
    for name in (
        "chain-greedy",
        "chain-sampled-eos",
        "chain-topk-topp-budget",
        "coupled",
        "tree-sampled",
        "tree-distinct",
        "tree-topk-greedy",
        "tree-dynamic",
        "transformers",
        "chain-greedy-stop-string",
        "tree-greedy-stop-ids",
    )
]
FAST_SUBSETS, SLOW_SUBSETS = 4, 40


def _clean(traces, tmp_path, kind, n_subsets, seed):
    lines = traces[kind]
    tree = any(
        n.get("parent", i - 1) != i - 1
        for line in lines[1:]
        if line.get("record") == "round"
        for i, n in enumerate(line["nodes"])
    )
    fields = optional_fields(tree)
    checker = Checker(tmp_path / "c.sqlite")
    flagged = []
    for left_out in subsets(fields, n_subsets, seed):
        report = checker.check(without(lines, left_out, fields))
        if report.findings:
            flagged.append((sorted(left_out), [str(f) for f in report.findings[:2]]))
    assert not flagged, f"{len(flagged)} of {checker.n} subsets flagged falsely; first: {flagged[0]}"
    return checker.n


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_clean_traces_check_clean_with_any_optional_fields_left_out(traces, tmp_path, kind):
    _clean(traces, tmp_path, kind, FAST_SUBSETS, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_clean_traces_check_clean_with_many_subsets_left_out(traces, tmp_path, kind):
    _clean(traces, tmp_path, kind, SLOW_SUBSETS, seed=1)


# --------------------------------------------------------------------------- the fault zoo

FAULT_SETUPS = {
    "eos-leak": (None, SamplingConfig(temperature=1.0), "eos"),
    "budget-overshoot": (None, SamplingConfig(temperature=0), None),
    "resample-p": (None, SamplingConfig(temperature=1.0), None),
    "raw-q": (None, SamplingConfig(temperature=1.0, top_k=8), None),
    "stale-draft-cache": (None, SamplingConfig(temperature=1.0), None),
    "target-crop-off-by-one": (None, SamplingConfig(temperature=1.0), None),
    "tree-stale-residual": (("3,2,1", "sampled"), SamplingConfig(temperature=1.0), None),
    "tree-sibling-mask": (("3,2,1", "topk"), SamplingConfig(temperature=0), None),
    "tree-wrong-branch-kv": (("3,2,1", "distinct"), SamplingConfig(temperature=1.0), None),
    "tree-positions-by-index": (("2,2", "topk"), SamplingConfig(temperature=0.8, top_k=8), None),
    "coupled-draft-pick": (None, SamplingConfig(temperature=1.0), "coupled"),
    # the stop faults: greedy runs with a stop the clean run completes (seed picks where)
    "stop-last-token": (None, SamplingConfig(temperature=0), "stop-ids"),
    "budget-before-stop": (None, SamplingConfig(temperature=0), "stop-ids"),
    "stop-per-token": (None, SamplingConfig(temperature=0), "stop-string"),
}


def test_every_fault_of_the_zoo_has_a_setup():
    # but the head faults: a draft head's fault leaves a correct record of every round (the
    # verifier is untouched), so there is nothing for a rule to flag with or without fields;
    # tests/core/faults/test_head_faults.py shows where it does show (acceptance by depth)
    assert set(FAULT_SETUPS) == {name for name, f in FAULTS.items() if f.needs != "head"}


@pytest.fixture(scope="module")
def fault_traces(models, tmp_path_factory):
    """fault -> (lines of a run in which it fired, its first round), full vectors."""
    target, draft = models
    eos = _eos_for(target, draft)
    out = {}
    with TraceStore(tmp_path_factory.mktemp("faults") / "f.sqlite") as store:
        for name, (tree, cfg, extra) in FAULT_SETUPS.items():
            for seed in range(24 if extra in ("stop-ids", "stop-string") else 8):
                proposer = (
                    DraftModelProposer(draft, tree=tree[0], children=tree[1]) if tree else DraftModelProposer(draft)
                )
                kw = {"eos_token_id": eos} if extra == "eos" else {"coupling_seed": 5} if extra == "coupled" else {}
                a, b = 1 + seed, 1 + seed % 3
                if extra in ("stop-ids", "stop-string"):
                    kw = {"stops": _stops_for(target, draft, a, b, sequence=extra == "stop-ids"), "token_piece": _piece}
                dec = faulty_decoder(name, target, proposer, k=4, sampling=cfg, **kw)
                max_new = (
                    3 + seed if name == "budget-overshoot" else a + b + 1 if name == "budget-before-stop" else 14
                )  # a short budget: all accepted at its end; the stop in the round that ends it
                lines = _exported(store, dec, True, seed=seed, max_new=max_new)
                if dec.fault_rounds:
                    out[name] = (lines, dec.fault_rounds[0])
                    break
    return out


def _fault(fault_traces, tmp_path, name, n_subsets, seed):
    if name not in fault_traces:
        pytest.skip(f"{name} did not fire in its seeded runs")
    lines, first = fault_traces[name]
    tree = FAULT_SETUPS[name][0] is not None
    fields = optional_fields(tree)
    checker = Checker(tmp_path / "f.sqlite")
    complete = checker.check(without(lines, set(), fields))
    flagging = {f.rule for f in complete.findings if f.round == first}
    if not flagging:
        pytest.skip(f"{name} leaves no trace evidence (the deep replay, --recompute, finds it)")
    assert min(f.round for f in complete.findings) == first
    silent = []
    for left_out in subsets(fields, n_subsets, seed)[1:]:
        report = checker.check(without(lines, left_out, fields))
        early = [f for f in report.findings if f.round < first]
        assert not early, (name, sorted(left_out), str(early[0]))
        if not any(f.round == first for f in report.findings) and not flagging & set(report.not_checked):
            silent.append(sorted(left_out))
    assert not silent, (
        f"{name}: neither flagged nor named as not checked ({sorted(flagging)}) with {silent[0]} left out"
    )


@pytest.mark.parametrize("name", sorted(FAULT_SETUPS))
def test_each_fault_is_flagged_or_named_not_checked(fault_traces, tmp_path, name):
    _fault(fault_traces, tmp_path, name, FAST_SUBSETS, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAULT_SETUPS))
def test_each_fault_is_flagged_or_named_not_checked_many_subsets(fault_traces, tmp_path, name):
    _fault(fault_traces, tmp_path, name, SLOW_SUBSETS, seed=3)


# --------------------------------------------------------------------------- another decoder's trees

V = 40


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def toy_tree_trace(path, *, repair_from_p: bool = False, updates: bool = True, rounds: int = 12) -> None:
    """A numpy bigram decoder of a different design drafting a 2,1 token tree (two sampled
    children of the prefix, one under each), verified by the multi-draft rule (each child
    against the running residual p'), written with TraceFile: parents, the `tree` object's
    required fields (children, path, tried) and, if `updates`, each p' update. Draws are by
    inverse CDF, so they are recorded. `repair_from_p`: the bug of drawing the repair from p
    instead of the final p'."""
    rng = np.random.default_rng(3)
    target = rng.normal(size=(V, V)) * 2
    draft = target + rng.normal(size=(V, V))
    out = [1, 2, 3]
    with TraceFile(
        path, prompt_ids=out, vocab_size=V, k=2, max_new_tokens=10 * rounds, proposer="toy-tree", records=("u", "draw")
    ) as trace:
        for _ in range(rounds):
            root_p, root_q = _softmax(target[out[-1]]), _softmax(draft[out[-1]])
            kids = [sample_from(root_q, rng.random()) for _ in range(2)]
            grand = [sample_from(_softmax(draft[t]), rng.random()) for t in kids]
            tokens, parents = kids + grand, [-1, -1, 0, 1]
            p_rows = [root_p, root_p, _softmax(target[kids[0]]), _softmax(target[kids[1]])]
            q_rows = [root_q, root_q, _softmax(draft[kids[0]]), _softmax(draft[kids[1]])]
            statuses, us, emitted, tried, ups, path = ["unvisited"] * 4, [None] * 4, [], [], [], []
            node, running, children = -1, root_p, [0, 1]
            while True:
                tried.append([node, []])
                accepted = None
                for c in children:
                    tried[-1][1].append(c)
                    us[c] = rng.random()
                    if us[c] < min(1.0, running[tokens[c]] / q_rows[c][tokens[c]]):
                        accepted = c
                        break
                    statuses[c] = "rejected"
                    residual = np.maximum(running - q_rows[c], 0)
                    running = residual / residual.sum()
                    ups.append(
                        {
                            "parent": node,
                            "child": c,
                            "mass": float(residual.sum()),
                            "p_after": {"full": running.tolist()},
                        }
                    )
                if accepted is None:
                    draw = rng.random()
                    source = p_rows[children[0]] if repair_from_p else running
                    emitted.append((sample_from(source, draw), "repaired", draw))
                    break
                statuses[accepted] = "accepted"
                path.append(accepted)
                emitted.append((tokens[accepted], "accepted"))
                node, children = accepted, [c for c in range(4) if parents[c] == accepted]
                running = _softmax(target[tokens[accepted]])
                if not children:
                    draw = rng.random()
                    emitted.append((sample_from(running, draw), "bonus", draw))
                    break
            tree = {"children": "sampled", "path": path, "tried": tried}
            if updates:
                tree["updates"] = ups
            bonus = running if emitted[-1][1] == "bonus" else None
            trace.round(
                draft=tokens,
                statuses=statuses,
                p=p_rows,
                q=q_rows,
                u=us,
                parents=parents,
                emitted=[(t, kind, *rest) for t, kind, *rest in emitted],
                bonus_p=bonus,
                tree=tree,
            )
            out += [e[0] for e in emitted]
        trace.close("interrupted", stop_reason="cancelled")  # stopped by the caller, before the budget


def _check_path(path, tmp_path):
    with TraceStore(tmp_path / "toy.sqlite") as store:
        run_id = import_run(store, path)
        info = store.get_run(run_id)
        return check_report(info.config, store.iter_rounds(run_id, full=True), end=info.end)


@pytest.mark.parametrize("updates", [True, False], ids=["with-updates", "required-only"])
def test_another_decoders_token_trees_check_clean(tmp_path, updates):
    toy_tree_trace(tmp_path / "tree.jsonl", updates=updates)
    report = _check_path(tmp_path / "tree.jsonl", tmp_path)
    assert report.findings == [], [str(f) for f in report.findings[:3]]
    if not updates:
        assert "residual" in report.not_checked or "tree-walk" in report.not_checked


def test_another_decoders_tree_bug_is_flagged_or_named_not_checked(tmp_path):
    toy_tree_trace(tmp_path / "bug.jsonl", repair_from_p=True)
    report = _check_path(tmp_path / "bug.jsonl", tmp_path)
    assert {f.rule for f in report.findings} & {"draw", "residual"}, report.not_checked
    toy_tree_trace(tmp_path / "bug-min.jsonl", repair_from_p=True, updates=False)
    report = _check_path(tmp_path / "bug-min.jsonl", tmp_path)
    assert report.findings or {"draw", "tree-walk", "residual"} & set(report.not_checked)
