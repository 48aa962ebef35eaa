"""A head's EAGLE-2 style early stop (`stop=P`): a chain ends once the product of the head's own
probabilities of its tokens falls below P. The decision is taken after a token is kept, from
the drafted path alone, so the output stays exact: greedy equals plain greedy, sampled output
has the target's distribution (the chi-square of test_distribution)."""

from __future__ import annotations

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import SpecError, build_proposer, parse_spec
from specscope.core.loading import bundled_path, load_model
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.decode.test_greedy_equality import reference_greedy
from tests.core.draft.heads.test_distribution import SAMPLES, SAMPLING, checkpoint
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, exact_distribution

GREEDY = SamplingConfig(temperature=0)
PROMPT_IDS = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.fixture(scope="module")
def target():
    return load_model(bundled_path("target"), device="cpu", dtype="float32")


def test_stop_shortens_drafts_and_greedy_still_equals_plain_greedy(target):
    expected = reference_greedy(target, PROMPT_IDS, 32)
    full = SpeculativeDecoder(target, build_proposer("eagle3"), k=6, sampling=GREEDY).generate(PROMPT_IDS, 32)
    stopped = SpeculativeDecoder(target, build_proposer("eagle3,stop=0.5"), k=6, sampling=GREEDY).generate(
        PROMPT_IDS, 32
    )
    assert full.new_tokens == expected and stopped.new_tokens == expected
    drafted = [len(r.nodes) for r in stopped.rounds[1:]]
    assert all(len(r.nodes) == r.k for r in full.rounds[1:])  # without stop: every round drafts k
    assert any(n < r.k for n, r in zip(drafted, stopped.rounds[1:], strict=True))
    # where it stopped, the path confidence had just fallen below 0.5 (and not before)
    for r in stopped.rounds[1:]:
        if 0 < len(r.nodes) < r.k:
            path = 1.0
            for i, n in enumerate(r.nodes):
                path *= n.confidence
                assert (path < 0.5) == (i == len(r.nodes) - 1)


def test_stop_is_recorded_and_bad_values_are_refused():
    proposer = build_proposer("eagle3,stop=0.25")
    assert proposer.params()["stop"] == 0.25
    assert "stop" not in build_proposer("eagle3").params()
    for spec, words in (
        ("eagle3,stop=1.5", "must lie in [0, 1)"),
        ("eagle3,stop=x", "must be a number"),
        ("eagle3,stop=0.3,tree=3,2", "ends a chain"),
    ):
        with pytest.raises(SpecError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            build_proposer(parse_spec(spec))


def stop_draws(spec, seeds):
    dec = SpeculativeDecoder(stat_models()[0], build_proposer(spec), k=3, sampling=SAMPLING)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


@pytest.mark.slow
def test_sampled_output_with_early_stop_is_the_target_distribution(tmp_path):
    spec = checkpoint("eagle3", tmp_path / "eagle3") + ",stop=0.5"
    expected = exact_distribution(stat_models()[0], SAMPLING)
    assert fit_pvalue(count_outputs(stop_draws, spec, SAMPLES), expected) > ALPHA
