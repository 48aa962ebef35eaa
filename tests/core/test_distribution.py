"""Sampled output has exactly the target's distribution.

A tiny-vocabulary target is enumerated exactly (every continuation of length L, its
probability under the target after temperature/top-k/top-p, computed with transformers'
own logits warpers) and compared with the empirical distribution of the decoder's outputs
by a chi-square goodness-of-fit test at significance level ALPHA. The seeds are fixed, so
the test is deterministic; ALPHA is the chance that a correct decoder would fail it for a
random choice of seeds. The same test must reject a decoder that repairs from p instead of
the residual.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.verify import ChainVerifier

from ..tiny_models import noisy_copy, tiny_lm

ALPHA = 1e-3
VOCAB = 5
LENGTH = 3
PROMPT = [0, 1]
SAMPLES = 4000

SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
]


def ResampleFromP(*args, **kwargs):
    """A classic bug: the repair token is drawn from p instead of max(p - q, 0)."""
    return SpeculativeDecoder(*args, verifier=ChainVerifier(residual=lambda p, q: (p, 1.0)), **kwargs)


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


def goodness_of_fit(decoder_cls, target, draft, cfg, k=2):
    expected = exact_distribution(target, cfg)
    dec = decoder_cls(target, DraftModelProposer(draft), k=k, sampling=cfg)
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(SAMPLES):
        out = tuple(dec.generate(PROMPT, LENGTH, seed=seed).new_tokens)
        assert expected[out] > 0, f"emitted {out}, which has probability 0 under the target"
        counts[out] = counts.get(out, 0) + 1
    # Cells with small expectations are pooled so the chi-square approximation holds.
    big = [s for s, p in expected.items() if p * SAMPLES >= 5]
    observed = [counts.get(s, 0) for s in big]
    wanted = [expected[s] * SAMPLES for s in big]
    rest_observed, rest_wanted = SAMPLES - sum(observed), SAMPLES - sum(wanted)
    if rest_wanted > 0:
        observed.append(rest_observed)
        wanted.append(rest_wanted)
    return chisquare(observed, wanted).pvalue


@pytest.fixture(scope="module")
def models():
    target = tiny_lm("gpt2", vocab=VOCAB, seed=0, init_range=1.0, layers=1, hidden=16)
    draft = noisy_copy(target, 1.0)  # far from the target: many rejections and repairs
    return target, draft


@pytest.mark.slow
@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_output_distribution_is_the_target_distribution(models, cfg):
    target, draft = models
    assert goodness_of_fit(SpeculativeDecoder, target, draft, cfg) > ALPHA


@pytest.mark.slow
def test_statistical_test_detects_a_wrong_verifier(models):
    target, draft = models
    assert goodness_of_fit(ResampleFromP, target, draft, SETTINGS[0]) < ALPHA
