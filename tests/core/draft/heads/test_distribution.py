"""Sampled decoding with a draft head has exactly the target's distribution: the chi-square
test of tests/core/verify/test_chain_distribution.py (the same tiny 5-token target, prompt and length: the
joint distribution of the first 3 tokens, enumerated exactly) with a head drafting, at
T = 0.5 (so the head's q must be the tempered distribution). EAGLE-3 with a reduced draft
vocabulary (3 of the 5 tokens: q is zero on two, so the repair's residual carries them) and
Medusa (each head's q independent of the tokens drafted before it).

SAMPLES seeds, not test_distribution's 4000: each kind's test is paired with a negative
control, the same test on the same seeds with the head's q for drafting differing from the q
the verifier is given, which it must reject. EAGLE-3 reports q before the temperature
(sampled from q_T, verified with q_1 ∝ q_T^(1/2)): p = 5e-15 measured; Medusa hands the
verifier its two heads' q rows in the wrong order: p = 9e-21 (the correct heads: p = 0.44 and
0.25). The power is no accident of these seeds: 200 resamples of 600 from 2,000-3,000 broken
runs were all rejected at ALPHA, the weakest at p = 1e-7. Both bugs move q between the draft
and the verifier, where a head can break exactness: the target's side is the decoder's own,
tested with a draft model in test_distribution. (At T = 0.5 Medusa's flat q hides the
untempered bug, p = 0.04 on 3,000 runs, and EAGLE-3's two rows are too alike for the swap
to show: each control is the bug its head's q makes visible.) A sampled draft verified as if
q were one-hot, vLLM #40149, is no negative control: it is still exact, only less often
accepted (point-mass verification is exact for any drawn token); and a q left indexed by
draft id is refused outright by the verifier, a drawn token with q = 0."""

from __future__ import annotations

import dataclasses

import pytest

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import build_proposer
from tests.core.chi_square import count_outputs, fit_pvalue, stat_models
from tests.core.head_checkpoints import write_eagle3, write_medusa
from tests.core.verify.test_chain_distribution import ALPHA, LENGTH, PROMPT, exact_distribution

SAMPLES = 600
SAMPLING = SamplingConfig(temperature=0.5)


def untempered_q(proposer):
    """The bug: q reported as the raw softmax, not the tempered one it was drawn from (at
    T = 0.5, q_T is proportional to q_1 squared, so q_1 is the normalised square root)."""
    return _reported_q(proposer, lambda q: q.sqrt() / q.sqrt().sum(dim=-1, keepdim=True))


def rows_swapped_q(proposer):
    """The bug: the verifier is given the draft positions' q rows in the wrong order (a
    Medusa head indexed off by one): position 1's token checked against head 2's q."""
    return _reported_q(proposer, lambda q: q.flip(0))


def _reported_q(proposer, report):
    propose = proposer.propose

    def misreported(context, k, sampling, rng):
        draft = propose(context, k, sampling, rng)
        return draft if draft.q is None else dataclasses.replace(draft, q=report(draft.q))

    proposer.propose = misreported
    return proposer


BUGS = {"eagle3": untempered_q, "medusa": rows_swapped_q}


def head_draws(spec, seeds):
    """The decoder's continuation for each seed (run in a worker: the head is loaded there)."""
    head, kind, broken = spec
    proposer = build_proposer(head)
    dec = SpeculativeDecoder(stat_models()[0], BUGS[kind](proposer) if broken else proposer, k=2, sampling=SAMPLING)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def head_fit(kind, folder, broken=False):
    expected = exact_distribution(stat_models()[0], SAMPLING)
    return fit_pvalue(count_outputs(head_draws, (checkpoint(kind, folder), kind, broken), SAMPLES), expected)


def checkpoint(kind, folder):
    target = stat_models()[0]
    # small output layers: flat q, so about half the drafts are accepted (a random head with
    # peaky q has about 0.05 accepted a run, and the test would hardly see q at all)
    if kind == "eagle3":  # a 1-layer target: every feature is the embeddings' output
        write_eagle3(folder, target, seed=3, draft_vocab=3, layers=[0, 0, 0], head_scale=0.1)
    else:
        write_medusa(folder, target, seed=3, heads=2, head_scale=0.1)
    return f"{kind}:{folder}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_sampled_head_output_is_the_target_distribution(kind, tmp_path):
    assert head_fit(kind, tmp_path / kind) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_statistical_test_detects_a_misreported_q(kind, tmp_path):
    assert head_fit(kind, tmp_path / kind, broken=True) < ALPHA
