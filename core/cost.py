"""The idealised cost model of speculative decoding.

Units: the time of one ordinary target decoding step is 1. A draft step costs c, a target
verification of the k drafted tokens costs v (v(k) in general, measured).
"""

from __future__ import annotations

from collections.abc import Sequence


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
    return round_speedup(expected, k, c, v)


def expected_tokens_from_rounds(accepted_per_round: Sequence[int]) -> float:
    """E[tokens per round] = 1 + sum_i S_i, S_i = the fraction of ALL rounds whose first i
    proposals were accepted (rounds that drafted fewer than i tokens count as not surviving).

    With a fixed draft length this equals the survival form of the per-position rates; when
    the draft length varies (prompt lookup finds no match and drafts nothing) it does not
    overstate E the way rates measured only over drafted positions would.
    """
    if not accepted_per_round:
        raise ValueError("no rounds to measure")
    if any(a < 0 for a in accepted_per_round):
        raise ValueError("accepted counts must be >= 0")
    return 1.0 + sum(accepted_per_round) / len(accepted_per_round)


def round_speedup(expected: float, drafted: float, c: float, v: float = 1.0) -> float:
    """E / (n c + v) with n the mean drafted tokens per round, a measured (fractional) count.

    For a fixed-length draft n = k and this is `speedup`. c is the proposer's cost per
    drafted token, so n c is what proposing costs per round.
    """
    if drafted < 0:
        raise ValueError(f"the mean drafted count must be >= 0, got {drafted!r}")
    if c < 0 or v <= 0:
        raise ValueError(f"costs must satisfy c >= 0 and v > 0, got c={c!r}, v={v!r}")
    return expected / (drafted * c + v)


def predicted_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    return speedup(expected_tokens(alpha, k), k, c, v)
