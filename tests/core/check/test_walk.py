"""core/check/walk.py: one proof for every draft shape. A chain round is proved as the width-1
tree its record describes (the same findings as the same round recorded as a tree with those
facts), the recorded values are checked on trees as on chains, and the deep replay costs one
forward per deepest path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report, recompute_findings
from specscope.core.check.tree_rules import recompute_rows
from specscope.core.check.walk import chain_facts
from specscope.core.records import TreeRound
from tests.tiny_models import noisy_copy, tiny_lm

T1 = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    return target, noisy_copy(target, 0.3)


def _chain_run(models, cfg, want):
    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=cfg)
    for seed in range(40):
        out = dec.generate([1, 2, 3, 4, seed], 30, seed=seed)
        at = next((i for i, r in enumerate(out.rounds) if want(r)), None)
        if at is not None:
            return out, at
    raise AssertionError("no such round in the runs tried")


def _as_tree(rnd, greedy):
    """The chain round recorded as a tree round whose facts are the chain's."""
    fields = {f.name: getattr(rnd, f.name) for f in dataclasses.fields(rnd)}
    facts = dataclasses.replace(
        chain_facts(rnd, residual=not greedy),
        positions=tuple(rnd.prefix_len + n.index for n in rnd.nodes),  # depth - 1 = index in a chain
        visible=tuple(tuple(range(n.index + 1)) for n in rnd.nodes),
        kept_rows=tuple(rnd.prefix_len + n.index for n in rnd.nodes if n.status == "accepted"),
    )
    return TreeRound(**fields, tree=facts)


def _node(rnd, j, **changes):
    nodes = list(rnd.nodes)
    nodes[j] = dataclasses.replace(nodes[j], **changes)
    return dataclasses.replace(rnd, nodes=tuple(nodes))


def _walk_findings(config, rounds, at):
    """(rule, node, position) of the findings at round `at`, without the tree-only rules that a
    tree record adds (its declared shape and layout)."""
    report = check_report(config, rounds)
    return sorted(
        (f.rule, f.node, f.position)
        for f in report.findings
        if f.round == at and f.rule not in ("tree-shape", "tree-layout")
    )


@pytest.mark.parametrize(
    ("cfg", "tamper"),
    [
        (T1, lambda r: _node(r, r.rejected_node, u=0.0)),  # the rejected draft now passes its test
        (T1, lambda r: dataclasses.replace(r, residual_mass=float(r.residual_mass) + 0.01)),
        (
            T1,
            lambda r: dataclasses.replace(
                r,
                emitted=tuple(dataclasses.replace(e, draw=0.999999) if e.kind == "repaired" else e for e in r.emitted),
            ),
        ),
        (GREEDY, lambda r: _node(r, r.rejected_node, target_argmax=r.nodes[r.rejected_node].token)),
        (T1, lambda r: dataclasses.replace(r, emitted=tuple(e for e in r.emitted if e.kind != "repaired"))),
    ],
    ids=["decision", "residual-mass", "repair-draw", "greedy", "repair-dropped"],
)
def test_a_chain_round_and_the_same_round_recorded_as_a_tree_get_the_same_findings(models, cfg, tamper):
    out, at = _chain_run(models, cfg, lambda r: r.rejected_node is not None and r.rejected_node > 0)
    rnd = out.rounds[at]
    chain = out.rounds[:at] + [tamper(rnd)]
    tree = out.rounds[:at] + [_as_tree(tamper(rnd), cfg.greedy)]
    as_chain = _walk_findings(out.config, chain, at)
    assert as_chain, "the tampered round passed"
    assert as_chain == _walk_findings(out.config, tree, at)
    clean = out.rounds[:at] + [_as_tree(rnd, cfg.greedy)]
    assert _walk_findings(out.config, clean, at) == []


def test_a_tree_node_whose_recorded_p_token_is_not_its_vectors_entry_is_flagged(models):
    target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,1", children="sampled"), sampling=T1)
    out = dec.generate([1, 2, 3, 4], 24, seed=3)
    assert check_report(out.config, out.rounds).findings == []
    rnd = out.rounds[0]
    j = rnd.tree.tried[0][1][0]
    bad = _node(rnd, j, p_token=float(rnd.nodes[j].p_token) + 0.125)
    findings = check_report(out.config, [bad, *out.rounds[1:]]).findings
    assert any(
        f.rule == "acceptance-draw" and f.node == j and "differs from the p vector" in f.message for f in findings
    )


class _Counting:
    """The target, counting its forwards."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


def _ancestors(rnd, node):
    out = {-1} if node >= 0 else set()
    while node >= 0:
        node = rnd.nodes[node].parent
        if node >= 0:
            out.add(node)
    return out


def test_the_deep_replay_costs_one_forward_per_deepest_path(models):
    target, draft = models
    chain = SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=T1).generate([1, 2, 3], 20, seed=1)
    tree = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,1"), sampling=T1).generate(
        [1, 2, 3], 20, seed=1
    )
    for out, is_chain in ((chain, True), (tree, False)):
        context = list(out.config.prompt_ids)
        for rnd in out.rounds:
            counting = _Counting(target)
            rows, bonus = recompute_rows(out.config, rnd, context, counting)
            accepted = [n.index for n in rnd.nodes if n.status == "accepted"]
            needed = {n.parent for n in rnd.nodes if n.status != "unvisited"}
            if rnd.bonus_p is not None:
                needed.add(accepted[-1] if accepted else -1)
            deepest = {x for x in needed if not any(x in _ancestors(rnd, y) for y in needed)}
            assert counting.calls == len(deepest) == (1 if is_chain else len(deepest)), rnd.index
            for n in rnd.nodes:  # the replayed rows are the recorded ones (a correct decoder)
                if n.status != "unvisited":
                    assert np.abs(np.asarray(rows[n.index]) - np.asarray(n.p)).max() < 1e-4
            if rnd.bonus_p is not None:
                assert np.abs(np.asarray(bonus) - np.asarray(rnd.bonus_p)).max() < 1e-4
            context += rnd.tokens
        assert recompute_findings(out.config, out.rounds, target) == []
