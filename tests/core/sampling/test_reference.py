import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specscope.core import SamplingConfig, process_logits, sample_from

SETTINGS = [
    SamplingConfig(1.0, 0, 1.0),
    SamplingConfig(0.7, 0, 1.0),
    SamplingConfig(1.3, 5, 1.0),
    SamplingConfig(1.0, 0, 0.8),
    SamplingConfig(0.8, 10, 0.9),
    SamplingConfig(2.0, 3, 0.5),
]


def transformers_distribution(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The same transforms by transformers' own warpers, in the order generate() uses."""
    scores = torch.tensor(logits, dtype=torch.float64)
    ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(cfg.temperature)(ids, scores)
    if cfg.top_k:
        scores = TopKLogitsWarper(cfg.top_k)(ids, scores)
    if cfg.top_p < 1.0:
        scores = TopPLogitsWarper(cfg.top_p)(ids, scores)
    return torch.softmax(scores, dim=-1).numpy()


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: c.describe())
def test_transforms_match_transformers_warpers(cfg):
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(50, 40))
    ours = process_logits(logits, cfg)
    theirs = transformers_distribution(logits, cfg)
    np.testing.assert_allclose(ours, theirs, atol=1e-12)
    np.testing.assert_allclose(ours.sum(axis=-1), 1.0)


def test_top_p_keeps_smallest_set_reaching_the_mass():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)
    kept = process_logits(logits, SamplingConfig(1.0, 0, 0.79)) > 0
    assert kept.tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.79
    kept = process_logits(logits, SamplingConfig(1.0, 0, 0.81)) > 0
    assert kept.tolist() == [True, True, True, False]
    kept = process_logits(logits, SamplingConfig(1.0, 0, 0.4)) > 0
    assert kept.tolist() == [True, False, False, False]


def test_top_k_then_top_p_order():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # top-k=2 renormalises to [4/7, 3/7]; top-p=0.5 then keeps only the first.
    out = process_logits(logits, SamplingConfig(1.0, 2, 0.5))
    np.testing.assert_allclose(out, [1.0, 0.0, 0.0, 0.0])


def test_greedy_keeps_the_plain_softmax():
    logits = np.array([[1.0, 2.0, 3.0]])
    out = process_logits(logits, SamplingConfig(temperature=0))
    np.testing.assert_allclose(out[0], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.2), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
    ],
)
def test_bad_sampler_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_raise(bad):
    logits = np.array([0.0, 1.0, bad])
    with pytest.raises(ValueError, match="non-finite"):
        process_logits(logits, SamplingConfig())


def test_inverse_cdf_sampling_never_returns_zero_mass_tokens():
    probs = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    draws = np.linspace(0, 1, 10001, endpoint=False)
    tokens = np.array([sample_from(probs, u) for u in draws])
    assert set(tokens.tolist()) == {1, 3}
    assert (tokens == 1).mean() == pytest.approx(0.25, abs=1e-3)
    assert sample_from(probs, np.nextafter(1.0, 0.0)) == 3
