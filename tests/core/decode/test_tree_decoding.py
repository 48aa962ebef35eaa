"""Token trees end to end: greedy tree decoding equals transformers' greedy generate, both
caches equal a full recompute of the accepted prefix at every round, EOS on an interior
node, the budget cutting a path."""

import pytest
import torch
from transformers import DynamicCache

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.records import TreeRound
from tests.core.decode.test_greedy_equality import prompts, reference_greedy
from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)
TREES = ["3,2,1,1", "2,2,2,nodes=10", "paths:0;1;2;0.0;0.1;1.0;0.0.0", "dynamic:nodes=12,depth=4,topk=3"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def models(request):
    target = tiny_lm(request.param, seed=0, init_range=0.3, dtype=torch.float64)
    return request.param, target, noisy_copy(target, 0.3)


@pytest.mark.parametrize("tree", TREES)
def test_greedy_tree_decoding_equals_transformers_generate(models, tree):
    arch, target, draft = models
    accepted = rejected = deep = 0
    for prompt in prompts(64, 6, seed=3):
        expected = reference_greedy(target, prompt, 20)
        dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree), sampling=GREEDY)
        out = dec.generate(prompt, max_new_tokens=20)
        assert out.new_tokens == expected, (arch, tree, prompt)
        for r in out.rounds:
            assert isinstance(r, TreeRound) and r.target_forwards == 1
            # the draft grows the tree with one forward per depth, not one per node
            depth = max(n.depth for n in r.nodes)
            assert r.draft_forwards == depth if not tree.startswith("dynamic") else depth <= r.draft_forwards <= 4
            accepted += r.accepted
            rejected += sum(n.status == "rejected" for n in r.nodes)
            # a path that took a sibling other than the first: the tree did something a chain cannot
            deep += any(
                r.nodes[i].status == "accepted" and i not in [c[1][0] for c in r.tree.tried] for i in r.tree.path
            )
    assert accepted > 0 and rejected > 0 and deep > 0


def fresh_keys(model, prefix):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([prefix]), cache=cache, use_cache=True)
    return cache.layers[0].keys


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize(
    "tree, children, temperature",
    [
        ("3,2,1", "topk", 0.0),
        ("3,2,1", "sampled", 1.0),
        ("2,2,2", "distinct", 1.0),
        ("dynamic:nodes=10,depth=4,topk=3", "topk", 1.0),
    ],
)
def test_both_caches_equal_a_full_recompute_at_every_round(arch, tree, children, temperature):
    target = tiny_lm(arch, seed=3, init_range=0.3)
    draft = noisy_copy(target, 0.3)
    proposer = DraftModelProposer(draft, tree=tree, children=children)
    dec2 = SpeculativeDecoder(target, proposer, sampling=SamplingConfig(temperature=temperature), seed=5)
    prompt = [3, 9, 27, 17, 51, 25]
    context = list(prompt)
    rounds = []
    for rnd in dec2.rounds(prompt, max_new_tokens=40):
        context += rnd.tokens
        committed = rnd.prefix_len + rnd.accepted
        assert rnd.target_cache.after == dec2.target_lm.processed == committed
        assert rnd.target_cache.pending == tuple(context[committed:])
        assert rnd.target_cache.peak == rnd.prefix_len + len(rnd.nodes)
        torch.testing.assert_close(
            dec2.target_lm.cache.layers[0].keys, fresh_keys(target, context[:committed]), atol=1e-5, rtol=0
        )
        after = dec2.proposer.lm.processed
        assert rnd.draft_cache.after == after and rnd.prefix_len <= after <= committed
        torch.testing.assert_close(
            dec2.proposer.lm.cache.layers[0].keys, fresh_keys(draft, context[:after]), atol=1e-5, rtol=0
        )
        # the draft cache at its peak held the prefix and the expanded nodes only
        assert rnd.draft_cache.peak <= rnd.prefix_len + len(rnd.nodes)
        rounds.append(rnd)
    assert len(rounds) >= 5
    assert any(r.accepted >= 2 for r in rounds) and any(r.rejected_node is not None for r in rounds)


def test_eos_on_an_interior_node_ends_the_output(models):
    arch, target, draft = models
    hits = 0
    for prompt, at in zip(prompts(64, 12, seed=7), [2, 5, 8, 11] * 3):
        free = reference_greedy(target, prompt, 16)
        eos = free[at]
        expected = reference_greedy(target, prompt, 16, eos=eos)
        dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2,2,1"), sampling=GREEDY, eos_token_id=eos)
        out = dec.generate(prompt, max_new_tokens=16)
        assert out.new_tokens == expected and out.stop_reason == "eos"
        last = out.rounds[-1]
        assert last.eos and last.tokens[-1] == eos
        if last.emitted[-1].kind == "accepted":
            node = last.emitted[-1].node
            hits += any(n.parent == node for n in last.nodes)  # EOS accepted at a node with children
    assert hits > 0


def test_budget_cuts_a_path(models):
    arch, target, draft = models
    for budget in (1, 2, 3, 5):
        for prompt in prompts(64, 4, seed=11):
            dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="2,2,2,2"), sampling=GREEDY)
            out = dec.generate(prompt, max_new_tokens=budget)
            assert out.new_tokens == reference_greedy(target, prompt, budget)
            last = out.rounds[-1]
            assert len(out.new_tokens) == budget and last.budget_stop
            assert max(n.depth for n in last.nodes) <= last.remaining_budget


def test_tree_options_are_checked():
    draft = tiny_lm("llama", seed=0)
    with pytest.raises(ValueError, match="children must be one of"):
        DraftModelProposer(draft, tree="2,2", children="beam")
    with pytest.raises(ValueError, match="children='topk'"):
        DraftModelProposer(draft, tree="dynamic:nodes=8,depth=3,topk=2", children="sampled")
    with pytest.raises(ValueError, match="branching"):
        DraftModelProposer(draft, tree="2,x")
    p = DraftModelProposer(draft, tree="3,1", children="sampled")
    assert p.params()["tree"] == "3,1" and p.params()["children"] == "sampled"


def test_the_chain_stays_the_default(models):
    arch, target, draft = models
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=GREEDY)
    out = dec.generate([1, 2, 3], max_new_tokens=10)
    assert not any(isinstance(r, TreeRound) for r in out.rounds)
    assert all(len(r.nodes) <= 3 for r in out.rounds)
