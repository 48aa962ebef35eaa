"""`k="auto"` in the decoder: exact (greedy equals plain greedy, sampled output keeps the target's
distribution) whatever lengths the policy picks, its choices are the rounds' k, and the run's
config records the policy and the measured verify cost."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.decode.draft_length import AUTO_K_MAX
from specscope.core.draft.registry import build_proposer
from tests.core.decode.test_greedy_equality import prompts, reference_greedy
from tests.core.verify.test_chain_distribution import ALPHA, goodness_of_fit
from tests.tiny_models import noisy_copy, tiny_lm

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=0, init_range=0.3, dtype=torch.float64)
    return target, noisy_copy(target, 0.05)


def test_auto_k_greedy_equals_plain_greedy_and_the_ks_are_the_policys(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k="auto", sampling=GREEDY)
    ks: list[int] = []
    for prompt in prompts(64, 6, seed=3):
        out = dec.generate(prompt, max_new_tokens=40)
        assert out.new_tokens == reference_greedy(target, prompt, 40), prompt
        assert out.config.k == AUTO_K_MAX
        chosen = dec._policy.chosen
        # each round drafted what the policy chose (capped by the budget left)
        assert [r.k for r in out.rounds] == [
            min(c, r.remaining_budget) for c, r in zip(chosen, out.rounds, strict=True)
        ]
        assert all(len(r.nodes) == r.k for r in out.rounds)
        ks += [r.k for r in out.rounds]
    assert all(1 <= k <= AUTO_K_MAX for k in ks)


def test_auto_k_with_prompt_lookup_and_a_tree_stays_greedy_exact(pair):
    target, draft = pair
    for proposer in (PromptLookupProposer(), DraftModelProposer(draft, tree="3,2,1,1")):
        dec = SpeculativeDecoder(target, proposer, k="auto", sampling=GREEDY)
        for prompt in prompts(64, 3, seed=5):
            out = dec.generate(prompt, max_new_tokens=24)
            assert out.new_tokens == reference_greedy(target, prompt, 24)
            if proposer.tree is not None:  # the depth cap: never past the tree's own depth (4)
                assert all(max((n.depth for n in r.nodes), default=0) <= min(r.k, 4) for r in out.rounds)


def test_auto_k_records_the_policy_and_its_measured_verify_cost(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, DraftModelProposer(draft), k="auto", sampling=GREEDY)
    params = dec.run_config([1, 2, 3], 8).proposer_params
    assert params["k_policy"] == "auto" and params["k_max"] == AUTO_K_MAX
    table = params["verify_ms"]
    assert sorted(int(n) for n in table) == list(range(1, AUTO_K_MAX + 2))  # 1 .. k_max + 1 positions
    assert all(v > 0 for v in table.values())
    fixed = SpeculativeDecoder(target, DraftModelProposer(draft), k=3, sampling=GREEDY)
    assert "k_policy" not in fixed.run_config([1, 2, 3], 8).proposer_params


def test_auto_k_head_greedy_equals_plain_greedy():
    """A draft head (EAGLE-3, the bundled target's) under auto: its prefill round drafts nothing."""
    from specscope.core.loading import bundled_path, load_model

    target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    proposer = build_proposer("eagle3")
    dec = SpeculativeDecoder(target, proposer, k="auto", sampling=GREEDY)
    prompt = [1, 2, 3, 4, 5, 6]
    out = dec.generate(prompt, max_new_tokens=24)
    assert out.new_tokens == reference_greedy(target, prompt, 24)
    assert len(out.rounds[0].nodes) == 0 and len(dec._policy.chosen) == len(out.rounds)


def test_bad_k_words_are_refused_in_one_line(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="k"):
        SpeculativeDecoder(target, DraftModelProposer(draft), k="fast")


@pytest.mark.slow
def test_auto_k_sampled_output_keeps_the_target_distribution():
    """Chi-square against exact enumeration (tests/core/verify/test_chain_distribution.py) with the
    lengths chosen by the policy from past rounds' acceptance and timings."""
    p = goodness_of_fit(SpeculativeDecoder, SamplingConfig(temperature=1.0), k="auto", samples=2000)
    assert p > ALPHA, p


def test_auto_k_with_the_transformers_engine_runs_its_own_heuristic_schedule(pair):
    from specscope.core.decode.factory import Models, RunSettings, build_decoder

    target, draft = pair
    models = Models(target, draft=draft, draft_name="noisy")
    engine = build_decoder(RunSettings(k="auto", engine="transformers", proposer="draft:noisy"), models)
    assert engine.params()["num_assistant_tokens_schedule"] == "heuristic" and engine.k == 4
    fixed = build_decoder(RunSettings(k=3, engine="transformers", proposer="draft:noisy"), models)
    assert fixed.params()["num_assistant_tokens_schedule"] == "constant" and fixed.k == 3


@pytest.mark.parametrize("k", ["auto", 3])
def test_a_tree_chosen_by_cost_stays_greedy_exact_and_keeps_what_the_policy_chose(pair, k):
    """dynamic:nodes=auto: each round grows the depth and width the policy chose (k caps the
    depth; the widest first, then the chain) and keeps the node count it chose from the
    candidates' values and the measured verify cost."""
    target, draft = pair
    proposer = DraftModelProposer(draft, tree="dynamic:nodes=auto,depth=4,topk=2")
    dec = SpeculativeDecoder(target, proposer, k=k, sampling=GREEDY)
    for prompt in prompts(64, 3, seed=7):
        out = dec.generate(prompt, max_new_tokens=24)
        assert out.new_tokens == reference_greedy(target, prompt, 24)
        policy = dec._policy
        drafted = [r for r in out.rounds if r.nodes]
        assert [len(r.nodes) for r in drafted] == policy.budgets
        cap = 4 if k == "auto" else 3
        assert all(max(n.depth for n in r.nodes) <= min(d, cap) for r, d in zip(drafted, policy.chosen, strict=True))
        for r, width in zip(drafted, policy.widths, strict=True):
            assert max(Counter(n.parent for n in r.nodes).values()) <= width
        assert policy.widths[:3] == [2, 2, 1]  # the prompt-reading round measures no cost: the widest again
    params = out.config.proposer_params
    assert params["tree_nodes"] == "auto" and params["verify_ms"]
    assert ("k_policy" in params) == (k == "auto")


def test_a_head_tree_chosen_by_cost_is_greedy_exact():
    from specscope.core.loading import bundled_path, load_model

    target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    dec = SpeculativeDecoder(
        target, build_proposer("eagle3,tree=dynamic:nodes=auto,depth=5,topk=3"), k="auto", sampling=GREEDY
    )
    prompt = [1, 2, 3, 4, 5, 6]
    out = dec.generate(prompt, max_new_tokens=32)
    assert out.new_tokens == reference_greedy(target, prompt, 32)
    assert [len(r.nodes) for r in out.rounds if r.nodes] == dec._policy.budgets
