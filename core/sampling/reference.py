"""Sampling transforms and categorical draws, in float64 numpy.

p and q are always the distributions *after* temperature -> top-k -> top-p, the order
transformers applies its logits warpers. Both sides of the verifier go through the same
function, so the q a token was sampled from is exactly the q the verifier divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingConfig:
    """temperature=0 means greedy; top_k=0 and top_p=1.0 switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        tp = self.top_p
        if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not (0.0 < tp <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1] (1 = off), got {tp!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def sparse_rows(self) -> bool:
        """Sampling with a top-k filter: every processed row has few nonzero entries (about
        top_k), which the records find through their nonzeros instead of whole-row passes."""
        return not self.greedy and self.top_k > 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p={self.top_p:g}")
        return " ".join(parts)


def check_finite(logits: np.ndarray, who: str) -> None:
    if not np.isfinite(logits).all():
        bad = int((~np.isfinite(logits)).sum())
        raise ValueError(f"{who} produced {bad} non-finite logits (NaN or inf); refusing to sample")


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (logits must be finite)."""
    z = np.asarray(logits, dtype=np.float64)
    e: np.ndarray = z - z.max(axis=-1, keepdims=True)  # a new array: the in-place steps below are safe
    np.exp(e, out=e)
    e /= e.sum(axis=-1, keepdims=True)
    return e


def _top_k_mask(scaled: np.ndarray, top_k: int) -> np.ndarray:
    # Keep every token whose logit reaches the k-th largest (ties at the threshold stay,
    # as in transformers' TopKLogitsWarper).
    vocab = scaled.shape[-1]
    if top_k >= vocab:
        return np.ones_like(scaled, dtype=bool)
    kth = np.partition(scaled, vocab - top_k, axis=-1)[..., vocab - top_k, None]
    return scaled >= kth


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    # Smallest set of most probable tokens whose mass reaches top_p.
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    cumulative = np.cumsum(sorted_probs, axis=-1)
    # Number of tokens kept = 1 + number of prefixes whose mass is still below top_p.
    keep_count = 1 + (cumulative < top_p).sum(axis=-1, keepdims=True)
    keep_sorted = np.arange(probs.shape[-1]) < keep_count
    mask: np.ndarray = np.zeros_like(keep_sorted)
    np.put_along_axis(mask, order, keep_sorted, axis=-1)
    return mask


def process_logits(logits: np.ndarray, config: SamplingConfig, checked: bool = False) -> np.ndarray:
    """Logits (..., V) -> the sampling distribution (..., V) in float64.

    In greedy mode this is the plain softmax (temperature 1, no filters): the decision uses
    its argmax, and the distribution itself is kept only so people can see it.
    `checked=True` skips the finite check for logits the caller has already checked.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if not checked:
        check_finite(logits, "the model")
    if config.greedy:
        return softmax(logits)
    if config.temperature == 1:
        scaled = logits  # x / 1.0 == x exactly; finite logits stay finite
    else:
        scaled = logits / config.temperature
        if config.temperature < 1 and not np.isfinite(scaled).all():  # T >= 1 cannot overflow
            raise ValueError(f"temperature {config.temperature:g} overflows the logits")
    if config.top_k:
        scaled = np.where(_top_k_mask(scaled, config.top_k), scaled, -np.inf)
    probs = softmax(scaled)
    if config.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, config.top_p), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample_from(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from a 1-D distribution with a given uniform u in [0, 1).

    Deterministic in u, and never returns a zero-probability token: the first index whose
    cumulative mass exceeds u * total has strictly positive mass.
    """
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from a distribution with zero total mass")
    index = int(np.searchsorted(cdf, u * total, side="right"))
    if index >= len(cdf):  # only reachable through rounding at u -> 1
        index = int(np.flatnonzero(probs)[-1])
    return index
