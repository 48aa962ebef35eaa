"""The verification rule of speculative sampling as small pure functions.

They use only elementwise numpy operations, so they work on float arrays in the decoder
and on object arrays of fractions.Fraction in the exact oracle test.
"""

from __future__ import annotations

import numpy as np


def acceptance_probability(p_x, q_x):
    """min(1, p(x) / q(x)) for a proposed token x with q(x) > 0."""
    if not q_x > 0:
        raise ValueError("a proposed token must have positive proposal probability q(x)")
    ratio = p_x / q_x
    return ratio if ratio < 1 else type(ratio)(1)


def residual_distribution(p: np.ndarray, q: np.ndarray):
    """(normalised max(p - q, 0), its mass r). Never divides a zero residual."""
    positive = np.maximum(p - q, 0 * p)
    mass = positive.sum()
    if not mass > 0:
        raise ArithmeticError(
            "a draft token was rejected although max(p - q, 0) has zero mass: "
            "p and q are numerically inconsistent"
        )
    return positive / mass, mass


def emitted_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact distribution of the token one verification step emits when x ~ q is proposed.

    accepted mass min(p, q) plus the rejection mass spread over the residual; equals p
    whenever the rule is implemented right.
    """
    accepted = np.minimum(p, q)
    rejected = 1 - accepted.sum()
    if not rejected > 0:
        return accepted
    residual, _ = residual_distribution(p, q)
    return accepted + rejected * residual
