"""A tree node in the inspector: p' (its parent's running target distribution when the node
was tried) against its q row, and every residual update at its parent, from the round's
record (live) or replayed from the stored p and q (a trace); "not stored" otherwise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.views.inspector import RoundInspectorWidget
from specscope.app.gui.views.tree_inspect import RECOMPUTED, RECORDED, node_residuals
from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.storage.codec import PartialDistribution
from tests.tiny_models import noisy_copy, tiny_lm


def tree_run(mode: str):
    target = tiny_lm("llama", seed=3, init_range=0.3)
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(noisy_copy(target, 0.3), tree="3,2,1", children=mode),
        sampling=SamplingConfig(temperature=1.0),
        seed=5,
    )
    return dec.generate([3, 9, 27, 17], 30)


@pytest.mark.parametrize("mode", ["sampled", "distinct", "topk"])
def test_recorded_and_replayed_updates_agree_and_explain_each_decision(mode):
    out = tree_run(mode)
    seen_later_sibling = False
    for r in out.rounds:
        recorded_updates = {(u.parent, u.child) for u in r.tree.updates}
        for node in r.nodes:
            live = node_residuals(r, node.index, mode)
            replay = node_residuals(dataclasses.replace(r, tree=None), node.index, mode)
            assert live.source == RECORDED and replay.source == RECOMPUTED
            assert live.tried == replay.tried == dict(r.tree.tried).get(node.parent, live.tried)
            assert {(node.parent, u.child) for u in live.updates} == {
                x for x in recorded_updates if x[0] == node.parent
            }
            for a, b in zip(live.updates, replay.updates, strict=True):
                np.testing.assert_allclose(a.p_after, b.p_after, atol=1e-12)
            if node.status == "unvisited":
                assert live.rank is None and live.p_prime is None
                continue
            np.testing.assert_allclose(live.p_prime, replay.p_prime, atol=1e-12)
            if live.rank > 1:  # a later sibling: p' is the previous rejection's update, not the parent's p
                seen_later_sibling = True
                np.testing.assert_allclose(live.p_prime, live.updates[live.rank - 2].p_after)
                assert not np.allclose(live.p_prime, node.p)
            # the draw decided against min(1, p'(x)/q_c(x))
            assert (node.u < live.accept_p) == (node.status == "accepted")
    assert seen_later_sibling


def test_missing_fields_say_not_stored():
    out = tree_run("sampled")
    r = next(r for r in out.rounds if r.tree.updates)
    child = r.tree.updates[0].child
    bare = dataclasses.replace(r, tree=None)
    assert node_residuals(bare, child, None).source.startswith("not stored")  # no children mode
    top_n = dataclasses.replace(
        bare,
        nodes=tuple(
            dataclasses.replace(n, p=PartialDistribution(np.where(n.p == n.p.max(), n.p, 0), [int(np.argmax(n.p))]))
            for n in bare.nodes
        ),
    )
    view = node_residuals(top_n, child, "sampled")
    assert view.source.startswith("not stored") and "top-N" in view.source and view.p_prime is None


def test_the_inspector_plots_p_prime_against_the_childs_q(qtbot):
    out = tree_run("sampled")
    model = RunModel()
    model.begin(out.config)
    model.extend(out.rounds)
    inspector = RoundInspectorWidget(model)
    qtbot.addWidget(inspector)
    r = next(r for r in out.rounds if any(len(kids) > 1 for _, kids in r.tree.tried))
    parent, kids = next((p, kids) for p, kids in r.tree.tried if len(kids) > 1)
    second = kids[1]
    model.select(r.index, second)
    values = inspector.values
    view = node_residuals(r, second, "sampled")
    ids = values["tokens"]
    np.testing.assert_allclose(values["p"], view.p_prime[ids])  # p', not the parent's first p
    np.testing.assert_allclose(values["q"], r.nodes[second].q[ids])
    assert values["tree"]["rank"] == 2 and values["tree"]["tried"] == tuple(kids)
    assert values["tree"]["updates"][0][0] == kids[0]
    assert "p′₀ = p at" in values["header"] and "tried #2" in values["header"]
    assert "p′" in inspector.pq_plot.titleLabel.text


def test_updates_recorded_without_their_vectors_are_replayed_from_p_and_q():
    out = tree_run("distinct")
    r = next(r for r in out.rounds if len(r.tree.updates) and any(len(k) > 1 for _, k in r.tree.tried))
    parent, kids = next((p, k) for p, k in r.tree.tried if len(k) > 1)
    masses_only = dataclasses.replace(
        r.tree, updates=tuple(dataclasses.replace(u, p_after=None) for u in r.tree.updates)
    )
    view = node_residuals(dataclasses.replace(r, tree=masses_only), kids[1], "distinct")
    assert view.source == RECOMPUTED
    np.testing.assert_allclose(view.p_prime, node_residuals(r, kids[1], "distinct").p_prime, atol=1e-12)


@pytest.mark.parametrize("mode", ["sampled", "distinct", "topk"])
def test_top_n_records_give_the_same_acceptance_test(mode):
    """Above 4096 tokens a round keeps top-N rows: the test's entries (p'(x), q(x), the earlier
    siblings' q) are kept, so each node's min(1, p'(x)/q_c(x)) is the full rows' own."""
    target = tiny_lm("llama", seed=3, init_range=0.3)

    def run(vectors):
        dec = SpeculativeDecoder(
            target,
            DraftModelProposer(noisy_copy(target, 0.3), tree="3,2,1", children=mode),
            sampling=SamplingConfig(temperature=1.0),
            seed=5,
            vectors=vectors,
            top_n=4,
        )
        return dec.generate([3, 9, 27, 17], 30).rounds

    checked = 0
    for full, top in zip(run("full"), run("top"), strict=True):
        for node in full.nodes:
            want = node_residuals(full, node.index, mode).accept_p
            if want is not None:
                assert node_residuals(top, node.index, mode).accept_p == pytest.approx(want, abs=1e-9)
                checked += 1
    assert checked > 20
