"""The exact rational oracle: the production verification functions, run on Fractions,
emit exactly p for every pair (p, q) on the quarter-grid simplex of three tokens."""

from fractions import Fraction

import numpy as np
import pytest

from specscope.core.verify.chain import acceptance_probability, emitted_distribution, residual_distribution

QUARTER_GRID = [
    np.array([Fraction(a, 4), Fraction(b, 4), Fraction(4 - a - b, 4)], dtype=object)
    for a in range(5)
    for b in range(5 - a)
]


def one_step_distribution(p, q, residual_fn=residual_distribution):
    """Propose x ~ q, accept with min(1, p/q), else repair from residual_fn: exact law."""
    out = np.array([Fraction(0)] * len(p), dtype=object)
    rejected = Fraction(0)
    for x, qx in enumerate(q):
        if qx == 0:
            continue
        a = acceptance_probability(p[x], qx)
        out[x] += qx * a
        rejected += qx * (1 - a)
    if rejected > 0:
        residual, mass = residual_fn(p, q)
        assert mass == rejected or residual_fn is not residual_distribution
        out = out + rejected * residual
    return out


def test_quarter_grid_has_fifteen_points():
    assert len(QUARTER_GRID) == 15


@pytest.mark.parametrize("p_index", range(15))
def test_every_quarter_grid_pair_emits_exactly_p(p_index):
    p = QUARTER_GRID[p_index]
    for q in QUARTER_GRID:
        emitted = one_step_distribution(p, q)
        assert list(emitted) == list(p), (p, q, emitted)
        assert list(emitted_distribution(p, q)) == list(p)
        accepted_mass = sum(np.minimum(p, q))
        residual_mass = sum(np.maximum(p - q, 0 * p))
        assert accepted_mass + residual_mass == 1


def test_zero_residual_is_never_divided():
    p = QUARTER_GRID[3]
    # p == q: no rejection can happen, and asking for the residual is an error, not 0/0.
    with pytest.raises(ArithmeticError):
        residual_distribution(p, p)
    assert list(emitted_distribution(p, p)) == list(p)


def test_zero_q_token_is_reachable_through_the_repair():
    p = np.array([Fraction(1, 2), Fraction(1, 2), Fraction(0)], dtype=object)
    q = np.array([Fraction(1), Fraction(0), Fraction(0)], dtype=object)
    residual, mass = residual_distribution(p, q)
    assert mass == Fraction(1, 2) and list(residual) == [0, 1, 0]
    assert list(one_step_distribution(p, q)) == list(p)


def test_negative_control_resampling_p_is_detected():
    p = np.array([Fraction(1, 10), Fraction(3, 10), Fraction(6, 10)], dtype=object)
    q = np.array([Fraction(4, 10), Fraction(4, 10), Fraction(2, 10)], dtype=object)
    wrong = one_step_distribution(p, q, residual_fn=lambda p, q: (p, None))
    assert list(wrong) == [Fraction(14, 100), Fraction(42, 100), Fraction(44, 100)]
    assert list(wrong) != list(p)
    # Over the whole grid the wrong repair is caught wherever a rejection is possible.
    caught = sum(
        list(one_step_distribution(p, q, residual_fn=lambda p, q: (p, None))) != list(p)
        for p in QUARTER_GRID
        for q in QUARTER_GRID
    )
    assert caught > 100
