"""Closed-form estimators (categories, booleans, numbers) on simulated data with known truth.

Each test simulates many independent collections with a fixed seed and checks
three things with tolerances derived from sampling laws: the mean estimate is
within 4 standard errors of the mean of the truth, the stated standard error
matches the observed spread (chi-square law of the sample variance, 1e-4 tails),
and 95% intervals cover the truth 93-97% of the time.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis import counts_arrays, decode_counts
from veil.server.analysis.files import write_outputs
from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError
from veil.shared.kinds import BooleanParams, CategoryParams, NumberParams


def _document(params, cohort: dict, metric: str = "m") -> dict:
    return {
        "metric": metric,
        "kind": params.kind,
        "params": params.to_dict(),
        "start": None,
        "end": None,
        "reports": cohort["reports"],
        "cohorts": [{"cohort": 0, **cohort}],
    }


def _check(estimates: np.ndarray, std_errors: np.ndarray, truth: np.ndarray | float) -> None:
    runs = estimates.shape[0]
    error = estimates.mean(axis=0) - truth
    # mean of R runs: standard error sd / sqrt(R); 4 of them
    assert np.all(np.abs(error) < 4 * estimates.std(axis=0, ddof=1) / np.sqrt(runs)), error
    ratio = estimates.var(axis=0, ddof=1) / np.mean(std_errors**2, axis=0)
    dof = runs - 1
    assert np.all(ratio > stats.chi2.ppf(1e-4, dof) / dof), ratio
    assert np.all(ratio < stats.chi2.isf(1e-4, dof) / dof), ratio
    covered = np.abs(estimates - truth) <= stats.norm.isf(0.025) * std_errors
    # >= 2000 intervals: binomial sd of the coverage <= 0.49%, the band is >= 4 sds each side
    assert covered.size >= 2000
    assert 0.93 <= covered.mean() <= 0.97, covered.mean()


def test_categories_unbiased_with_honest_errors() -> None:
    params = CategoryParams(categories=("a", "b", "c", "d"), p=0.5, q=0.75, f=0.5)
    shares = np.array([0.5, 0.3, 0.15, 0.05])
    p_star, q_star = params.effective_probs
    rng = np.random.default_rng(31)
    runs, reports = 1000, 20_000
    estimates = np.zeros((runs, 4))
    std_errors = np.zeros((runs, 4))
    for run in range(runs):
        values = rng.multinomial(reports, shares)
        ones = rng.binomial(values, q_star) + rng.binomial(reports - values, p_star)
        result = decode_counts(_document(params, {"reports": reports, "ones": ones.tolist()}))
        estimates[run] = result.column("proportion")
        std_errors[run] = result.column("prop_std_error")
    _check(estimates, std_errors, shares)


def test_booleans_unbiased_with_honest_errors() -> None:
    params = BooleanParams(alpha=0.4, beta=0.3)
    yes_if_false, yes_if_true = params.yes_probs
    rng = np.random.default_rng(32)
    runs, reports, share = 4000, 5_000, 0.3
    truthful = rng.binomial(reports, share, size=runs)
    ones = rng.binomial(truthful, yes_if_true) + rng.binomial(reports - truthful, yes_if_false)
    estimates = np.zeros(runs)
    std_errors = np.zeros(runs)
    for run in range(runs):
        result = decode_counts(_document(params, {"reports": reports, "ones": int(ones[run])}))
        assert result.rows[0]["value"] == "true"
        estimates[run] = result.rows[0]["proportion"]
        std_errors[run] = result.rows[0]["prop_std_error"]
    _check(estimates[:, None], std_errors[:, None], share)


def _grid_points(params: NumberParams, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    return rng.binomial(params.resolution, 0.3, size=size)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_number_means_unbiased_with_honest_errors(mechanism: str) -> None:
    delta = 1e-6 if mechanism == "gaussian" else None
    params = NumberParams(low=-5.0, high=5.0, mechanism=mechanism, epsilon=1.0, delta=delta,
                          resolution=64)
    rng = np.random.default_rng(33)
    runs, reports = 2000, 1000
    grid = _grid_points(params, rng, (runs, reports))
    if mechanism == "laplace":
        # discrete Laplace as the difference of two geometric variables
        keep = 1 - np.exp(-1 / params.laplace_scale)
        noise = rng.geometric(keep, size=grid.shape) - rng.geometric(keep, size=grid.shape)
    else:
        noise = np.rint(rng.normal(0, params.gaussian_sigma, size=grid.shape))
    values = params.low + params.step * (grid + noise)
    truth = params.low + params.step * params.resolution * 0.3
    estimates = np.zeros(runs)
    std_errors = np.zeros(runs)
    for run in range(runs):
        cohort = {"reports": reports, "sum": float(values[run].sum()),
                  "sum_squares": float((values[run] ** 2).sum())}
        row = decode_counts(_document(params, cohort)).rows[0]
        estimates[run], std_errors[run] = row["estimate"], row["std_error"]
    _check(estimates[:, None], std_errors[:, None], truth)


def test_one_bit_mean_unbiased_with_honest_errors() -> None:
    params = NumberParams(low=0.0, high=100.0, mechanism="1bitmean", epsilon=1.0, resolution=64)
    rng = np.random.default_rng(34)
    runs, reports = 3000, 5000
    # every report is an independent Bernoulli(E_j[N(j)] / 2^32): its count is Binomial
    points = np.arange(params.resolution + 1)
    weights = stats.binom.pmf(points, params.resolution, 0.3)
    one_prob = sum(w * params.one_bit_numerator(int(j)) for j, w in zip(points, weights, strict=True))
    ones = rng.binomial(reports, one_prob / PROB_ONE, size=runs)
    truth = params.low + (params.high - params.low) * 0.3
    estimates = np.zeros(runs)
    std_errors = np.zeros(runs)
    for run in range(runs):
        row = decode_counts(_document(params, {"reports": reports, "ones": int(ones[run])})).rows[0]
        estimates[run], std_errors[run] = row["estimate"], row["std_error"]
    _check(estimates[:, None], std_errors[:, None], truth)


def test_closed_form_degenerate_inputs() -> None:
    category = CategoryParams(categories=("a", "b"), f=1.0)
    with pytest.raises(ParameterError, match="no information"):
        decode_counts(_document(category, {"reports": 10, "ones": [5, 5]}))
    with pytest.raises(ParameterError, match="no reports"):
        decode_counts(_document(BooleanParams(), {"reports": 0, "ones": 0}))
    number = NumberParams(low=0.0, high=1.0)
    with pytest.raises(ParameterError, match="only 1 report"):
        decode_counts(_document(number, {"reports": 1, "sum": 0.5, "sum_squares": 0.25}))
    with pytest.raises(ParameterError, match=r"cohorts\[0\]\.sum: must be a finite number"):
        counts_arrays(_document(number, {"reports": 3, "sum": "x", "sum_squares": 1.0}))
    with pytest.raises(ParameterError, match="5 exceeds the cohort's 3 reports"):
        counts_arrays(_document(BooleanParams(), {"reports": 3, "ones": 5}))
    flat = NumberParams(low=0.0, high=1.0, mechanism="1bitmean", epsilon=1e-12)
    with pytest.raises(ParameterError, match=r"epsilon=1e-12 .* no information"):
        decode_counts(_document(flat, {"reports": 10, "ones": 5}))


def test_number_interval_stays_in_range_when_the_estimate_does_not(tmp_path) -> None:
    """A mean far outside [low, high] (only forged reports do that) keeps an interval inside
    [low, high] (the true mean is there), says so, and still draws its chart."""
    params = NumberParams(low=0.0, high=10.0)
    values = [5.0] * 999 + [params.payload_range[1]]
    document = _document(params, {"reports": 1000, "sum": sum(values),
                                  "sum_squares": sum(v * v for v in values)})
    honest = decode_counts(document)
    assert "warning" not in honest.summary
    poisoned = [5.0] * 900 + [params.payload_range[1]] * 100
    result = decode_counts(_document(params, {"reports": 1000, "sum": sum(poisoned),
                                              "sum_squares": sum(v * v for v in poisoned)}))
    row = result.rows[0]
    assert row["estimate"] > params.high + 1.96 * row["std_error"]
    assert params.low <= row["low_95"] <= row["high_95"] == params.high
    assert "forged reports" in result.summary["warning"]
    paths = write_outputs(result, tmp_path)
    assert paths["chart"].stat().st_size > 0
