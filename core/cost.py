"""The idealised cost model of speculative decoding.

Units: the time of one ordinary target decoding step is 1. A draft step costs c, a target
verification of the k drafted tokens costs v (v(k) in general, measured).
"""

from __future__ import annotations

from typing import Sequence


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)
    for constant, independent per-position acceptance alpha (k + 1 at alpha = 1)."""
    _check_alpha(alpha)
    _check_k(k)
    return float(sum(alpha**i for i in range(k + 1)))


def expected_tokens_from_survival(acceptance_by_position: Sequence[float]) -> float:
    """E[tokens per round] = 1 + sum_i P(the first i proposals are all accepted).

    `acceptance_by_position[i]` is the probability that proposal i + 1 is accepted given
    that the first i were (a conditional rate, as measured per position); the survival
    probability of the first i proposals is the product of the first i rates.
    """
    expected, survival = 1.0, 1.0
    for rate in acceptance_by_position:
        _check_alpha(rate)
        survival *= rate
        expected += survival
    return expected


def speedup(expected: float, k: int, c: float, v: float = 1.0) -> float:
    """Idealised speedup E / (k c + v) over plain decoding."""
    _check_k(k)
    if c < 0 or v <= 0:
        raise ValueError(f"costs must satisfy c >= 0 and v > 0, got c={c!r}, v={v!r}")
    return expected / (k * c + v)


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    return speedup(expected_tokens(alpha, k), k, c, v)
