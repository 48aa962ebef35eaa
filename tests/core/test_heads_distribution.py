"""Sampled decoding with a draft head has exactly the target's distribution: the chi-square
test of tests/core/test_distribution.py (the same tiny target, prompt, length and sample)
with a head drafting. EAGLE-3 with a reduced draft vocabulary (3 of the 5 tokens: q is zero
on two, so the repair's residual carries them) and Medusa (each head's q independent of the
tokens drafted before it). The same test rejects an EAGLE-3 head that reports q before the
temperature (sampled at T = 0.5 from q_T, verified with the raw softmax q_1 ∝ q_T^(1/2)). (A sampled draft verified as if q were
one-hot, vLLM #40149, is still exact, only less often accepted: point-mass verification is
exact for any drawn token; and a q left indexed by draft id is refused outright by the
verifier, a drawn token with q = 0.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import build_proposer

from .chi_square import count_outputs, fit_pvalue, stat_models
from .head_checkpoints import write_eagle3, write_medusa
from .test_distribution import ALPHA, LENGTH, PROMPT, SAMPLES, exact_distribution

CONTROL_SAMPLES = 1000
T1 = SamplingConfig(temperature=1.0)


def untempered_q(proposer):
    """The bug: q reported as the raw softmax, not the tempered one it was drawn from (at
    T = 0.5, q_T is proportional to q_1 squared, so q_1 is the normalised square root)."""
    propose = proposer.propose

    def untempered(context, k, sampling, rng):
        draft = propose(context, k, sampling, rng)
        if draft.q is None:
            return draft
        raw = draft.q.sqrt()
        return dataclasses.replace(draft, q=raw / raw.sum(dim=-1, keepdim=True))

    proposer.propose = untempered
    return proposer


def head_draws(spec, seeds):
    """The decoder's continuation for each seed (run in a worker: the head is loaded there)."""
    head, cfg, broken = spec
    proposer = build_proposer(head)
    dec = SpeculativeDecoder(stat_models()[0], untempered_q(proposer) if broken else proposer, k=2, sampling=cfg)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def head_fit(head, cfg=T1, broken=False, samples=SAMPLES):
    expected = exact_distribution(stat_models()[0], cfg)
    return fit_pvalue(count_outputs(head_draws, (head, cfg, broken), samples), expected)


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
    assert head_fit(checkpoint(kind, tmp_path / kind)) > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_an_untempered_q(tmp_path):
    """1000 seeds: p = 4e-23 measured, an overwhelming verdict already."""
    head = checkpoint("eagle3", tmp_path / "eagle3")
    assert head_fit(head, SamplingConfig(temperature=0.5), broken=True, samples=CONTROL_SAMPLES) < ALPHA
