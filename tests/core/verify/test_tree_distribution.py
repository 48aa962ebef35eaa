"""Sampled tree decoding has exactly the target's distribution (chi-square against the exact
enumeration of tests/core/verify/test_chain_distribution.py, one children mode per sampler setting), and
the same test rejects a tree verifier whose residual is not updated after a rejection.
Also: a tree run without caches matches the cached run."""

import pytest
import torch

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.verify.tree import STALE_RESIDUAL
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, SETTINGS, exact_distribution
from tests.tiny_models import noisy_copy, tiny_lm

SAMPLES = 3000
CONTROL_SAMPLES = 500  # the negative control's: see its docstring
CASES = [(SETTINGS[0], "sampled"), (SETTINGS[1], "distinct"), (SETTINGS[2], "topk")]


def tree_draws(spec, seeds):
    """The tree decoder's continuation for each seed (run in a worker: the models are rebuilt there)."""
    cfg, children, stale, tree = spec
    target, draft = stat_models()
    dec = SpeculativeDecoder(
        target,
        DraftModelProposer(draft, tree=tree, children=children),
        sampling=cfg,
        verifier=STALE_RESIDUAL if stale else None,
    )
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def tree_fit(cfg, children, stale=False, samples=SAMPLES, tree="3,2"):
    expected = exact_distribution(stat_models()[0], cfg)
    return fit_pvalue(count_outputs(tree_draws, (cfg, children, stale, tree), samples), expected)


@pytest.mark.slow
@pytest.mark.parametrize("cfg, children", CASES, ids=lambda c: c if isinstance(c, str) else c.describe())
def test_sampled_tree_output_is_the_target_distribution(cfg, children):
    assert tree_fit(cfg, children) > ALPHA


@pytest.mark.slow
def test_a_tree_whose_width_and_depth_are_chosen_by_cost_keeps_the_target_distribution():
    """nodes=auto: each round's width, depth and kept node count come from the run's past rounds
    (their timings and which nodes were accepted); the verify rules are the same, so exact."""
    assert tree_fit(SETTINGS[0], "topk", tree="dynamic:nodes=auto,depth=3,topk=2") > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_stale_tree_residual():
    """500 seeds, not 3000: the stale residual scores chi2 = 416 on 10 degrees of freedom there,
    p = 3e-83 (chi2 = 2594, p underflowing to 0, at 3000), an overwhelming verdict already."""
    assert tree_fit(SETTINGS[0], "sampled", stale=True, samples=CONTROL_SAMPLES) < ALPHA


@pytest.mark.parametrize("tree", ["3,2,1", "dynamic:nodes=8,depth=3,topk=3"])
def test_no_cache_tree_run_matches_the_cached_run(tree):
    target = tiny_lm("llama", seed=6, init_range=0.3, dtype=torch.float64)
    draft = noisy_copy(target, 0.3)
    for temperature in (0.0, 1.0):
        cfg = SamplingConfig(temperature=temperature)
        cached = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree), sampling=cfg, seed=3)
        uncached = SpeculativeDecoder(
            target, DraftModelProposer(draft, tree=tree), sampling=cfg, seed=3, use_cache=False
        )
        a, b = cached.generate([7, 8, 9, 10], 24), uncached.generate([7, 8, 9, 10], 24)
        assert a.new_tokens == b.new_tokens
        assert [len(r.nodes) for r in a.rounds] == [len(r.nodes) for r in b.rounds]
        assert all(r.target_cache.after == 0 for r in b.rounds)
