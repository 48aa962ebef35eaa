import pytest

from specscope.core import (
    expected_tokens,
    expected_tokens_from_survival,
    predicted_speedup,
    speedup,
)
from specscope.core.cost import expected_tokens_from_rounds, round_speedup


def test_constant_alpha_expected_tokens_matches_worked_numbers():
    assert expected_tokens(0.7, 5) == pytest.approx(2.94117, abs=1e-5)
    assert expected_tokens(0.8, 6) == pytest.approx(3.951424, abs=1e-9)
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-9)
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0


def test_speedup_matches_worked_numbers():
    assert predicted_speedup(0.8, 6, c=0.1, v=1.0) == pytest.approx(2.47, abs=0.005)
    assert predicted_speedup(0.1, 6, c=0.1, v=1.0) == pytest.approx(0.69, abs=0.005)
    assert predicted_speedup(0.8, 4, c=0.1, v=1.0) == pytest.approx(2.401, abs=0.0005)
    assert predicted_speedup(0.2, 4, c=0.1, v=1.0) == pytest.approx(0.893, abs=0.0005)


def test_survival_form_equals_constant_form_for_constant_rates():
    assert expected_tokens_from_survival([0.8] * 6) == pytest.approx(expected_tokens(0.8, 6))


def test_survival_form_is_not_one_plus_sum_of_marginals():
    rates = [0.9, 0.5, 0.2]
    # 1 + 0.9 + 0.9*0.5 + 0.9*0.5*0.2
    assert expected_tokens_from_survival(rates) == pytest.approx(1 + 0.9 + 0.45 + 0.09)
    assert expected_tokens_from_survival(rates) != pytest.approx(1 + sum(rates))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_alpha_outside_unit_interval_is_rejected(bad):
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(bad, 3)


def test_speedup_rejects_bad_costs():
    with pytest.raises(ValueError):
        speedup(3.0, 4, c=-1.0)
    with pytest.raises(ValueError):
        speedup(3.0, 4, c=0.1, v=0.0)


def test_expected_tokens_from_rounds_counts_rounds_that_drafted_nothing():
    # fixed length: equals the survival form of the per-position rates
    accepted = [3, 1, 0, 3, 2]  # k = 3
    rates = []
    reached = len(accepted)
    for i in range(1, 4):
        passed = sum(a >= i for a in accepted)
        rates.append(passed / reached)
        reached = passed
    assert expected_tokens_from_rounds(accepted) == pytest.approx(expected_tokens_from_survival(rates))
    # two rounds with nothing drafted lower E below what the drafted rounds alone give
    assert expected_tokens_from_rounds(accepted + [0, 0]) < expected_tokens_from_rounds(accepted)
    with pytest.raises(ValueError):
        expected_tokens_from_rounds([])


def test_round_speedup_with_a_fractional_drafted_count():
    assert round_speedup(3.0, 4, 0.1, 1.2) == pytest.approx(speedup(3.0, 4, 0.1, 1.2))
    assert round_speedup(2.0, 1.5, 0.2, 1.0) == pytest.approx(2.0 / 1.3)
    assert round_speedup(1.0, 0.0, 0.5, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        round_speedup(1.0, -1.0, 0.1, 1.0)
