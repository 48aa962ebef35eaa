"""A head chain with prompt lookup first (`lookup=N`): a round copies what followed an earlier
occurrence of the context's last N (up to N + 2) tokens, and the head drafts only where there
is none. The choice reads the context alone, so the output stays exact: greedy equals plain
greedy, sampled output has the target's distribution (the chi-square of test_distribution)."""

from __future__ import annotations

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.ngram_index import NgramIndex
from specscope.core.draft.registry import SpecError, build_proposer, parse_spec
from specscope.core.loading import bundled_path, load_model
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.decode.test_greedy_equality import reference_greedy
from tests.core.draft.heads.test_distribution import SAMPLES, SAMPLING, checkpoint
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, exact_distribution

GREEDY = SamplingConfig(temperature=0)
PROMPT_IDS = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]  # repeats: lookup finds a continuation at once


@pytest.fixture(scope="module")
def target():
    return load_model(bundled_path("target"), device="cpu", dtype="float32")


def test_lookup_rounds_copy_the_context_and_greedy_still_equals_plain_greedy(target):
    expected = reference_greedy(target, PROMPT_IDS, 40)
    result = SpeculativeDecoder(target, build_proposer("eagle3,lookup=2"), k=4, sampling=GREEDY).generate(
        PROMPT_IDS, 40
    )
    assert result.new_tokens == expected
    index = NgramIndex(2, 4)
    copied = drafted = 0
    for r in result.rounds[1:]:
        context = PROMPT_IDS + list(result.new_tokens[: r.emitted_before])
        want = index.lookup(context, r.k)
        tokens = [n.token for n in r.nodes]
        if want:  # lookup found one: the round is its copy and the head did not run
            assert tokens == want and r.draft_forwards == 0
            copied += 1
        else:  # none: the head drafted k tokens
            assert len(tokens) == r.k and r.draft_forwards > 0
            drafted += 1
    assert copied and drafted  # both kinds of round occurred


def test_lookup_is_recorded_and_bad_values_are_refused():
    assert build_proposer("eagle3,lookup=3").params()["lookup"] == 3
    assert "lookup" not in build_proposer("eagle3").params()
    for spec, words in (
        ("eagle3,lookup=0", "n-gram length in 1..16"),
        ("eagle3,lookup=x", "must be an integer"),
        ("eagle3,lookup=2,tree=3,2", "a tree or Medusa"),
    ):
        with pytest.raises(SpecError, match=words):
            build_proposer(parse_spec(spec))


def lookup_draws(spec, seeds):
    dec = SpeculativeDecoder(stat_models()[0], build_proposer(spec), k=3, sampling=SAMPLING)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


@pytest.mark.slow
def test_sampled_output_with_lookup_first_is_the_target_distribution(tmp_path):
    """On the 5-token target every context of the test repeats a token, so rounds alternate
    between copies (point masses) and head drafts (the head's q)."""
    spec = checkpoint("eagle3", tmp_path / "eagle3") + ",lookup=1"
    expected = exact_distribution(stat_models()[0], SAMPLING)
    assert fit_pvalue(count_outputs(lookup_draws, spec, SAMPLES), expected) > ALPHA
