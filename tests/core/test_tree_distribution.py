"""Sampled tree decoding has exactly the target's distribution (chi-square against the exact
enumeration of tests/core/test_distribution.py, one children mode per sampler setting), and
the same test rejects a tree verifier whose residual is not updated after a rejection.
Also: a tree run without caches matches the cached run."""

import pytest
import torch
from scipy.stats import chisquare

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.tree_verify import STALE_RESIDUAL

from ..tiny_models import noisy_copy, tiny_lm
from .test_distribution import ALPHA, LENGTH, PROMPT, SETTINGS, VOCAB, exact_distribution

SAMPLES = 3000
CASES = [(SETTINGS[0], "sampled"), (SETTINGS[1], "distinct"), (SETTINGS[2], "topk")]


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("gpt2", vocab=VOCAB, seed=0, init_range=1.0, layers=1, hidden=16)
    return target, noisy_copy(target, 1.0)


def tree_fit(target, draft, cfg, children, verifier=None):
    expected = exact_distribution(target, cfg)
    dec = SpeculativeDecoder(target, DraftModelProposer(draft, tree="3,2", children=children), sampling=cfg)
    if verifier is not None:
        dec.tree_verifier = verifier
    counts: dict = {}
    for seed in range(SAMPLES):
        out = tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens)
        assert expected[out] > 0, f"emitted {out}, which has probability 0 under the target"
        counts[out] = counts.get(out, 0) + 1
    big = [s for s, p in expected.items() if p * SAMPLES >= 5]
    observed = [counts.get(s, 0) for s in big]
    wanted = [expected[s] * SAMPLES for s in big]
    if SAMPLES - sum(wanted) > 0:
        observed.append(SAMPLES - sum(observed))
        wanted.append(SAMPLES - sum(wanted))
    return chisquare(observed, wanted).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("cfg, children", CASES, ids=lambda c: c if isinstance(c, str) else c.describe())
def test_sampled_tree_output_is_the_target_distribution(models, cfg, children):
    target, draft = models
    assert tree_fit(target, draft, cfg, children) > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_stale_tree_residual(models):
    target, draft = models
    assert tree_fit(target, draft, SETTINGS[0], "sampled", verifier=STALE_RESIDUAL) < ALPHA


@pytest.mark.parametrize("tree", ["3,2,1", "dynamic:nodes=8,depth=3,topk=3"])
def test_no_cache_tree_run_matches_the_cached_run(tree):
    target = tiny_lm("llama", seed=6, init_range=0.3, dtype=torch.float64)
    draft = noisy_copy(target, 0.3)
    for temperature in (0.0, 1.0):
        cfg = SamplingConfig(temperature=temperature)
        cached = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree), sampling=cfg, seed=3)
        uncached = SpeculativeDecoder(target, DraftModelProposer(draft, tree=tree), sampling=cfg, seed=3, use_cache=False)
        a, b = cached.generate([7, 8, 9, 10], 24), uncached.generate([7, 8, 9, 10], 24)
        assert a.new_tokens == b.new_tokens
        assert [len(r.nodes) for r in a.rounds] == [len(r.nodes) for r in b.rounds]
        assert all(r.target_cache.after == 0 for r in b.rounds)
