"""IBU (server/analysis/ibu.py): the fit is the likelihood's maximizer on the simplex, and
its counts are drawn with the oracle's law.

Every figure uses a fixed seed; tolerances come from the laws' variances as each test says.
"""

from __future__ import annotations

import numpy as np
import pytest

from veil.server.analysis.ibu import AffineChannel, draw_counts, ibu, simplex_start
from veil.shared.errors import ParameterError


def _grr(d: int, epsilon: float, reports: int) -> AffineChannel:
    e = np.exp(epsilon)
    return AffineChannel.identity(d, 1 / (e + d - 1), e / (e + d - 1), reports, multinomial=True)


def test_grr_interior_fit_is_the_channel_inversion() -> None:
    """With every share well inside the simplex, GRR's multinomial likelihood peaks at the
    inverted channel (the unbiased estimate), so exact IBU must land there."""
    channel = _grr(5, 2.0, 200_000)
    counts = draw_counts(channel, np.array([0.4, 0.3, 0.15, 0.1, 0.05]), np.random.default_rng(3))
    unbiased = (counts / 200_000 - channel.low) / channel.spread
    fit = ibu(channel, counts, tol=1e-14)
    assert fit.converged
    np.testing.assert_allclose(fit.shares, unbiased, atol=1e-6)


@pytest.mark.parametrize("multinomial", [True, False])
def test_shares_are_non_negative_and_sum_to_one(multinomial: bool) -> None:
    d, reports = 50, 100_000
    e = np.exp(0.5)
    low, high = (1 / (e + d - 1), e / (e + d - 1)) if multinomial else (1 / (e + 1), 0.5)
    channel = AffineChannel.identity(d, low, high, reports, multinomial=multinomial)
    truth = np.zeros(d)
    truth[:5] = [0.4, 0.3, 0.2, 0.05, 0.05]
    counts = draw_counts(channel, truth, np.random.default_rng(4))
    unbiased = (counts / reports - low) / (high - low)
    assert unbiased.min() < 0  # the unbiased estimate leaves the simplex here
    fit = ibu(channel, counts, start=simplex_start(unbiased))
    assert fit.converged and fit.shares.min() >= 0
    assert fit.shares.sum() == pytest.approx(1.0, abs=1e-12)
    # IBU is the better estimate at small epsilon: the zero shares cost it little
    assert np.abs(fit.shares - truth).sum() < 0.9 * np.abs(unbiased - truth).sum()


def test_draw_counts_has_the_oracles_law() -> None:
    """Binary counts with a background: mean ``trials * (low + spread * (D s + rate b))``;
    over 2,000 draws the mean count is within 5 standard errors of it (the sd of one
    count is at most sqrt(trials) / 2)."""
    design = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    import scipy.sparse as sp

    trials = np.array([1000.0, 1000.0, 1000.0, 1000.0])
    channel = AffineChannel(sp.csc_matrix(design), 0.2, 0.7, trials, background_rate=0.25)
    shares = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(5)
    draws = np.stack([draw_counts(channel, shares, rng) for _ in range(2000)])
    expected = trials * channel.rates(shares)
    bound = 5 * np.sqrt(1000) / 2 / np.sqrt(2000)
    assert np.all(np.abs(draws.mean(axis=0) - expected) < bound)


def test_bad_counts_are_refused_by_name() -> None:
    channel = AffineChannel.identity(3, 0.2, 0.6, 10)
    with pytest.raises(ParameterError, match="counts"):
        ibu(channel, np.array([1.0, 2.0]))
    with pytest.raises(ParameterError, match="counts"):
        ibu(channel, np.array([1.0, 20.0, 2.0]))
