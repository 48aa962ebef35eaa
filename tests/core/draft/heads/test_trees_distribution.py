"""Sampled decoding with a draft head drafting a token tree has exactly the target's
distribution: the chi-square test of tests/core/verify/test_chain_distribution.py (its 5-token target,
prompt and length, the first 3 tokens' joint distribution enumerated exactly) at T = 1, with
an EAGLE-3 head (a reduced draft vocabulary of 3 tokens: the repair's residual carries the
other two) drafting the static tree 2,2 with i.i.d. sampled children, one head step a depth
under the tree mask (core.draft.heads.trees).

The negative control runs the same head and seeds with the tree verifier's stale residual
(core.verify.tree.STALE_RESIDUAL: a rejected sibling leaves p' as it was, so the next
sibling is judged against the un-updated target row), which the test must reject.
Measured (Dec 3 2026, two workers on a 2-core machine at load average 7): the correct
decoder p = 0.53 on 1,000 seeds and 0.60 on these 600; the stale residual p = 2e-14 on these
200 seeds (1e-53 on 600); the file ran in 53 s."""

from __future__ import annotations

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import build_proposer
from specscope.core.verify.tree import STALE_RESIDUAL
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.head_checkpoints import write_eagle3
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, exact_distribution

SAMPLES = 600
CONTROL_SAMPLES = 200
SAMPLING = SamplingConfig(temperature=1.0)
TREE = "2,2"


def tree_draws(spec, seeds):
    """The decoder's continuation for each seed (run in a worker: the head is loaded there)."""
    head, stale = spec
    dec = SpeculativeDecoder(
        stat_models()[0], build_proposer(head), sampling=SAMPLING, verifier=STALE_RESIDUAL if stale else None
    )
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def tree_fit(folder, stale=False, samples=SAMPLES):
    # a 1-layer target: every feature is the embeddings' output; small output layer: flat q,
    # so siblings are often both tried and drafts are often accepted
    write_eagle3(folder, stat_models()[0], seed=3, draft_vocab=3, layers=[0, 0, 0], head_scale=0.1)
    spec = f"eagle3:{folder},tree={TREE},children=sampled"
    expected = exact_distribution(stat_models()[0], SAMPLING)
    return fit_pvalue(count_outputs(tree_draws, (spec, stale), samples), expected)


@pytest.mark.slow
def test_a_head_tree_with_sampled_children_has_the_target_distribution(tmp_path):
    assert tree_fit(tmp_path / "eagle3") > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_stale_residual_under_a_head_tree(tmp_path):
    assert tree_fit(tmp_path / "eagle3", stale=True, samples=CONTROL_SAMPLES) < ALPHA
