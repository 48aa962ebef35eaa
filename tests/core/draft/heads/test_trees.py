"""Draft heads drafting token trees (core.draft.heads.trees), decoded through the tree layout
and verifier, with random-initialised heads (tests/core/head_checkpoints.py):

- greedy output equals plain greedy decoding for EAGLE, EAGLE-3 and MTP with a dynamic and a
  static tree, and Medusa with static trees, with and without the target cache;
- every node's q row is what the head gives along that node's path drafted as a chain from
  the target's features of the prefix (the tree mask and positions are the chain's);
- after every round the head cache holds exactly the entries a chain run keeps (the real
  entries of the committed positions, built from the target's features), and the checker
  finds the traced rounds clean;
- the tree and children parameters of the head kinds: parsed, checked by the settings check
  as the draft kind's are, Medusa's tree refused beyond its heads in one line.
"""

from __future__ import annotations

import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.check.checker import check_report
from specscope.core.decode.settings import RunSettings
from specscope.core.draft.registry import KINDS, SpecError, build_proposer, parse_spec
from specscope.core.sampling.device import process_logits_torch
from tests.core.draft.heads.test_formats import PROMPT, fresh_head_keys, head_spec, one_line, plain_greedy
from tests.core.head_checkpoints import WRITERS
from tests.tiny_models import tiny_lm

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(temperature=1.0)
DYNAMIC = "dynamic:nodes=16,depth=5,topk=4"
STATIC = "3,2,1"
RECURRENT = ["eagle", "eagle3", "mtp"]


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", seed=0, init_range=0.3, layers=4, vocab=64)


@pytest.fixture(scope="module")
def small_vocab_target():
    """Eight tokens and peaky rows: sampled drafts are often accepted, so paths are long."""
    return tiny_lm("llama", seed=3, init_range=1.0, layers=4, vocab=8)


def tree_spec(kind, folder, target, tree, children="topk", **kw):
    spec = f"{head_spec(kind, folder, target, **kw)},tree={tree}"
    return spec if children == "topk" else f"{spec},children={children}"


@pytest.mark.parametrize("kind", RECURRENT)
@pytest.mark.parametrize("tree", [DYNAMIC, STATIC])
def test_greedy_tree_output_equals_plain_greedy(kind, tree, target, tmp_path):
    spec = tree_spec(kind, tmp_path, target, tree)
    want = plain_greedy(target, PROMPT, 30)
    for use_cache in (True, False):
        out = SpeculativeDecoder(target, build_proposer(spec), sampling=GREEDY, use_cache=use_cache).generate(
            PROMPT, 30
        )
        assert out.new_tokens == want, (kind, tree, use_cache)
        assert out.rounds[1].tree.spec == tree and max(len(r.nodes) for r in out.rounds) > 5
        assert all(r.target_forwards == 1 for r in out.rounds)


@pytest.mark.parametrize("tree", [STATIC, "paths:0;1;2;0.0;0.1;1.0;0.0.0", "dynamic:nodes=8,depth=3,topk=3"])
def test_greedy_medusa_tree_output_equals_plain_greedy(tree, target, tmp_path):
    spec = tree_spec("medusa", tmp_path, target, tree)
    want = plain_greedy(target, PROMPT, 30)
    for use_cache in (True, False):
        out = SpeculativeDecoder(target, build_proposer(spec), sampling=GREEDY, use_cache=use_cache).generate(
            PROMPT, 30
        )
        assert out.new_tokens == want, (tree, use_cache)
        assert all(r.draft_forwards == 1 for r in out.rounds[1:]) and max(len(r.nodes) for r in out.rounds) > 6


def test_a_medusa_tree_at_depth_d_chooses_from_head_d(target, tmp_path):
    """Every node at one depth was chosen from the same row (Medusa head d reads only the
    last feature), and the rows of two depths differ."""
    out = SpeculativeDecoder(
        target,
        build_proposer(tree_spec("medusa", tmp_path, target, STATIC, "sampled")),
        sampling=SAMPLED,
        vectors="full",
        seed=1,
    ).generate(PROMPT, 12)
    rnd = out.rounds[1]
    by_depth = {}
    for node in rnd.nodes:
        by_depth.setdefault(node.depth, []).append(node.q)
    assert sorted(by_depth) == [1, 2, 3]
    for rows in by_depth.values():
        assert all((row == rows[0]).all() for row in rows)
    assert not (by_depth[1][0] == by_depth[2][0]).all()


def chain_q(proposer, target, context, path, sampling):
    """The q row a head with an empty cache gives after the prefix `context` (from one full
    target forward's features) and then `path` drafted as a chain: what a tree node whose
    ancestors are `path` must have been chosen from."""
    layers = proposer.target_features(target)
    head = proposer.head
    head.reset()
    with torch.inference_mode():
        states = target(torch.tensor([context]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in layers], dim=-1)[: len(context) - 1]
        hidden = head.step(features[None], torch.tensor([context[1:]]), from_target=True)[0, -1]
        for token in path:
            hidden = head.step(hidden[None, None], torch.tensor([[token]]), from_target=False)[0, -1]
        q = process_logits_torch(head.logits(hidden), sampling)
    if head.draft_to_target is None:
        return q
    return torch.zeros(target.config.vocab_size, dtype=torch.float64).index_copy_(0, head.draft_to_target, q)


@pytest.mark.parametrize("kind", RECURRENT)
def test_every_node_is_drafted_from_its_own_path(kind, tmp_path):
    """The tree mask and positions: node i's q (and its recorded confidence) equals the head's q
    after its ancestors fed as a chain (a wrong mask lets siblings or cousins in; a position by
    index, not by depth, moves the rotary phase): checked at every node of every round, in float64."""
    target = tiny_lm("llama", seed=3, init_range=1.0, layers=4, vocab=8, dtype=torch.float64)
    spec = tree_spec(kind, tmp_path, target, "3,2,2", "sampled")
    out = SpeculativeDecoder(target, build_proposer(spec), sampling=SAMPLED, vectors="full", seed=2).generate(
        PROMPT, 16
    )
    checked, chain = 0, build_proposer(spec)
    for rnd in out.rounds:
        context = PROMPT + list(out.new_tokens[: rnd.emitted_before])
        for node in rnd.nodes:
            path, parent = [], node.parent
            while parent >= 0:
                path.insert(0, rnd.nodes[parent].token)
                parent = rnd.nodes[parent].parent
            want = chain_q(chain, target, context, path, SAMPLED)
            torch.testing.assert_close(torch.as_tensor(node.q), want, rtol=1e-9, atol=1e-9)
            # at T = 1 q is the head's own softmax: the confidence the node records (eagle3: read
            # through its reduced vocabulary)
            assert node.confidence == pytest.approx(float(want[node.token]), rel=1e-9, abs=1e-12)
            checked += 1
    assert checked >= 3 * 15


@pytest.mark.parametrize("kind", RECURRENT)
@pytest.mark.parametrize("tree, children", [(STATIC, "sampled"), (DYNAMIC, "topk")])
def test_the_head_cache_keeps_what_a_chain_keeps_and_the_trace_checks_clean(
    kind, tree, children, small_vocab_target, tmp_path
):
    target = small_vocab_target
    spec = tree_spec(kind, tmp_path, target, tree, children)
    proposer = build_proposer(spec)
    dec = SpeculativeDecoder(target, proposer, sampling=SAMPLED, seed=5)
    context = list(PROMPT[:5])
    handle = dec.start(context, 60, keep_rounds=True)
    previous_committed, accepted = 0, 0
    for rnd in handle:
        # as after a chain round: the entries of the previous round's committed positions,
        # built from the target's own features (what a fresh head computes over that prefix)
        assert proposer.cache_length == rnd.draft_cache.after == previous_committed
        if proposer.cache_length:
            want = fresh_head_keys(spec, target, context[: proposer.cache_length + 1])
            torch.testing.assert_close(proposer.head.kvs[0].keys, want, rtol=1e-4, atol=1e-5)
        if max((node.depth for node in rnd.nodes), default=0) > 1:
            assert rnd.draft_cache.peak > rnd.draft_cache.after  # the nodes had entries while drafting
        accepted += rnd.accepted
        previous_committed = rnd.prefix_len + rnd.accepted
        context += rnd.tokens
    assert accepted >= 5, "too few accepted drafts for the test to mean anything"
    result = handle.result
    report = check_report(result.config, result.rounds)
    assert report.findings == [] and not report.not_checked, [str(f) for f in report.findings[:3]]


@pytest.mark.parametrize("tree, children", [(STATIC, "sampled"), (DYNAMIC, "topk")])
def test_a_tree_run_without_target_cache_gives_the_same_output(tree, children, small_vocab_target, tmp_path):
    spec = tree_spec("eagle3", tmp_path, small_vocab_target, tree, children)
    for temperature in (0.0, 1.0):
        cfg = SamplingConfig(temperature=temperature)
        runs = [
            SpeculativeDecoder(
                small_vocab_target, build_proposer(spec), sampling=cfg, seed=4, use_cache=cache
            ).generate(PROMPT, 20)
            for cache in (True, False)
        ]
        assert runs[0].new_tokens == runs[1].new_tokens
        assert [len(r.nodes) for r in runs[0].rounds] == [len(r.nodes) for r in runs[1].rounds]


def test_tree_parameters_of_the_head_kinds():
    for kind in ("eagle", "eagle3", "medusa", "mtp"):
        assert KINDS[kind].param("tree") is not None and KINDS[kind].param("children").default == "topk"
    assert parse_spec(f"eagle3,tree={DYNAMIC}").params == {"tree": DYNAMIC}
    assert parse_spec("eagle3:/a/head,tree=3,2,1,children=sampled").params == {"tree": "3,2,1", "children": "sampled"}
    errors = RunSettings(proposer="eagle3,tree=3,x").validate()
    assert "branching factor" in errors["tree"]
    errors = RunSettings(proposer=f"eagle3,tree={DYNAMIC},children=sampled").validate()
    assert "children='topk'" in errors["children"]
    assert RunSettings(proposer=f"eagle3,tree={DYNAMIC}").validate() == {}


def test_the_bundled_head_builds_with_a_tree():
    proposer = build_proposer(f"eagle3,tree={DYNAMIC}")
    assert str(proposer.tree) == DYNAMIC and proposer.children == "topk"
    assert proposer.params() == {
        "head": "bundled:eagle3-target",
        "draw": "sampled",
        "tree": DYNAMIC,
        "children": "topk",
    }


def test_a_medusa_tree_deeper_than_its_heads_is_refused_in_one_line(target, tmp_path):
    spec = head_spec("medusa", tmp_path, target)  # 3 heads
    for tree in ("3,2,1,1", "paths:0;0.0;0.0.0;0.0.0.0"):
        with pytest.raises(SpecError) as exc:
            build_proposer(f"{spec},tree={tree}")
        assert "a tree 4 deep needs 4 Medusa heads, this checkpoint has 3" in one_line(exc)
        assert "4 Medusa heads" in RunSettings(proposer=f"{spec},tree={tree}").validate()["proposer"]
    assert build_proposer(f"{spec},tree=3,2,1").tree.depth == 3


def test_a_head_tree_cannot_be_coupled(target, tmp_path):
    with pytest.raises(ValueError) as exc:
        SpeculativeDecoder(target, build_proposer(tree_spec("eagle", tmp_path, target, STATIC)), coupling_seed=3)
    assert "cannot be coupled" in one_line(exc)


def test_every_kind_is_covered():
    assert set(WRITERS) == set(RECURRENT) | {"medusa"}
