"""Multiple-testing corrections against their definitions, on hand-checkable p-values."""

from __future__ import annotations

import numpy as np
import pytest

from veil.server.analysis.stats import (
    STOREY_LAMBDA,
    adjust_p_values,
    check_correction,
    normal_isf,
    normal_sf,
    null_share,
)
from veil.shared.errors import ParameterError

P = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216, 0.6, 0.9])


def test_benjamini_hochberg_by_its_step_up_definition() -> None:
    adjusted = adjust_p_values(P, "bh")
    n = P.size
    for level in (0.01, 0.05, 0.1, 0.25):
        # step-up: reject the r smallest, r = the largest rank with p_(r) <= r * level / n
        ranks = np.flatnonzero(np.sort(P) <= np.arange(1, n + 1) * level / n)
        expected = 0 if ranks.size == 0 else ranks[-1] + 1
        assert np.count_nonzero(adjusted <= level) == expected


def test_storey_is_bh_scaled_by_the_estimated_null_share() -> None:
    # (1 + #{p > 0.5}) / (n (1 - 0.5)) = (1 + 2) / 6 = 0.5
    assert null_share(P, P.size) == pytest.approx(3 / 6)
    storey = adjust_p_values(P, "storey")
    bh = adjust_p_values(P, "bh")
    small = P <= STOREY_LAMBDA
    assert np.allclose(storey[small], np.minimum(0.5 * bh[small], 1.0))
    assert np.all(storey[~small] == 1.0)  # p-values above lambda are never rejected
    # at level 0.1: BH rejects 2 (0.001, 0.008); halving its adjusted p-values rejects 7
    assert np.count_nonzero(bh < 0.1) == 2 and np.count_nonzero(storey < 0.1) == 7


def test_screened_out_hypotheses_count_as_nulls() -> None:
    # 12 tested plus 88 screened out (p-value 1): (1 + 2 + 88) / 50, capped at 1
    assert null_share(P, 100) == 1.0
    assert np.allclose(adjust_p_values(P, "storey", 100)[P <= 0.5], adjust_p_values(P, "bh", 100)[P <= 0.5])


def test_all_null_p_values_give_a_null_share_near_one() -> None:
    uniform = np.random.default_rng(1).uniform(size=10_000)
    # #{p > 0.5} ~ Binomial(10,000, 0.5): the estimate is 1 within 4 sds of 2 sqrt(0.25 / 10,000)
    assert abs(null_share(uniform, uniform.size) - 1.0) < 4 * 2 * 0.005


def test_correction_names() -> None:
    assert check_correction("FDR") == "bh"
    assert check_correction("adaptive-bh") == "storey"
    with pytest.raises(ParameterError, match="correction"):
        check_correction("holm")


def test_the_normal_quantile_inverts_the_normal_tail_far_into_it() -> None:
    # normal_isf (the standard library's AS 241) against scipy's ndtri, from the tails
    # Bonferroni reaches with 10^6 candidates down to p = 1e-300, and at the ends
    from scipy.special import ndtri

    p = np.concatenate([np.logspace(-300, -1, 300), np.linspace(0.01, 0.99, 99)])
    ours = np.array([normal_isf(float(value)) for value in p])
    assert np.allclose(ours, -ndtri(p), rtol=1e-13, atol=0)
    assert np.allclose(normal_sf(ours), p, rtol=1e-12, atol=0)
    assert normal_isf(0.025) == pytest.approx(1.959963984540054, rel=1e-15)
    assert normal_isf(0.0) == np.inf and normal_isf(1.0) == -np.inf
    assert np.isnan(normal_isf(1.5))
