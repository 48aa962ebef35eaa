"""Sampled output has exactly the target's distribution.

A tiny-vocabulary target is enumerated exactly (every continuation of length L, its
probability under the target after temperature/top-k/top-p, computed with transformers'
own logits warpers) and compared with the empirical distribution of the decoder's outputs
by a chi-square goodness-of-fit test at significance level ALPHA. The seeds are fixed, so
the test is deterministic; ALPHA is the chance that a correct decoder would fail it for a
random choice of seeds. The same test must reject a decoder that repairs from p instead of
the residual. The seeds run on every core (tests/core/chi_square.py); the counts do not depend
on how they are split.
"""

import itertools

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.verify.tree import TreeVerifier
from tests.core.chi_square import VOCAB, count_outputs, fit_pvalue, stat_models

ALPHA = 1e-3
LENGTH = 3
PROMPT = [0, 1]
SAMPLES = 4000
CONTROL_SAMPLES = 1000  # the negative control's: see its docstring

SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
]


def ResampleFromP(*args, **kwargs):
    """A classic bug: the repair token is drawn from p instead of max(p - q, 0)."""
    return SpeculativeDecoder(*args, verifier=TreeVerifier(residual=lambda p, q: (p, 1.0)), **kwargs)


def warped(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    scores = logits.double()[None]
    ids = torch.zeros((1, 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(cfg.temperature)(ids, scores)
    if cfg.top_k:
        scores = TopKLogitsWarper(cfg.top_k)(ids, scores)
    if cfg.top_p < 1.0:
        scores = TopPLogitsWarper(cfg.top_p)(ids, scores)
    return torch.softmax(scores, dim=-1)[0]


def exact_distribution(target, cfg) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of length LENGTH, by full forwards."""
    probs = {}
    with torch.inference_mode():
        for seq in itertools.product(range(VOCAB), repeat=LENGTH):
            logits = target(torch.tensor([PROMPT + list(seq)])).logits[0]
            prob = 1.0
            for t, token in enumerate(seq):
                prob *= float(warped(logits[len(PROMPT) - 1 + t], cfg)[token])
            probs[seq] = prob
    total = sum(probs.values())
    assert abs(total - 1) < 1e-9
    return probs


def draws(spec, seeds):
    """The decoder's continuation for each seed (run in a worker: the models are rebuilt there)."""
    decoder_cls, cfg, k = spec
    target, draft = stat_models()
    dec = decoder_cls(target, DraftModelProposer(draft), k=k, sampling=cfg)
    return [tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens) for seed in seeds]


def goodness_of_fit(decoder_cls, cfg, k=2, samples=SAMPLES):
    expected = exact_distribution(stat_models()[0], cfg)
    return fit_pvalue(count_outputs(draws, (decoder_cls, cfg, k), samples), expected)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_output_distribution_is_the_target_distribution(cfg):
    assert goodness_of_fit(SpeculativeDecoder, cfg) > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_wrong_verifier():
    """1000 seeds, not 4000: the wrong verifier scores chi2 = 141 on 15 degrees of freedom there,
    p = 1e-22 (chi2 = 687, p = 1e-132 at 4000), an overwhelming verdict already; a larger sample
    only adds power, so the positive tests' 4000 catch this bug too."""
    assert goodness_of_fit(ResampleFromP, SETTINGS[0], samples=CONTROL_SAMPLES) < ALPHA
