"""Closed-form decoders at small and large samples: N = 2,000, 20,000 and 1,000,000.

For each decoder (categories, booleans, numbers with laplace, gaussian and 1bitmean)
and each N, ``RUNS`` collections are drawn with a fixed seed from the mechanism's exact
law, with reports as independent draws from the population (the decoders' model):

* bit kinds: multinomial (or binomial) true values, then binomial counts of ones with
  the realized probabilities ``p*, q*`` (categories), ``y0, y1`` (booleans) or
  ``N(j) / 2^32`` (1bitmean, averaged over the population's grid points);
* laplace and gaussian: a report is ``low + step (j + Z)`` with ``j`` the population's
  grid point and ``Z`` the discrete noise, both integers, so the histogram of the ``N``
  reports over their (bounded: ``|Z| <= noise_bound``) support is multinomial with the
  convolution of the two laws; the sum and sum of squares follow from it exactly.

Each case checks (a) the mean estimate lies within 4 standard errors of the truth, the
standard error of the mean of ``RUNS`` estimates being ``rms(stated se) / sqrt(RUNS)``;
(b) 95% intervals cover the truth 93-97% of the time; (c) every share the output states
lies in [0, 1], except unbiased table shares, which then come with a ``note`` naming
them, and every interval lies in [0, 1] (shares) or ``[low, high]`` (means).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis import decode_counts
from veil.server.analysis.closed_form import SUM_ROUNDING
from veil.server.analysis.results import DecodeResult
from veil.shared.bits import PROB_ONE
from veil.shared.kinds import BooleanParams, CategoryParams, GrrParams, NumberParams

SIZES = (2_000, 20_000, 1_000_000)
# 1,200 runs: the binomial sd of a coverage from 1,200 independent intervals is
# sqrt(0.95 * 0.05 / 1200) = 0.63%, so 93-97% is 3.2 sds either side of 95%
# (categories pool several intervals per run: more intervals, so no wider)
RUNS = 1_200
Z95 = float(stats.norm.isf(0.025))
CATEGORY = CategoryParams(categories=("a", "b", "c", "d", "e"), p=0.5, q=0.75, f=0.5)
CATEGORY_SHARES = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
BOOLEAN = BooleanParams(alpha=0.4, beta=0.3)
TRUE_SHARE = 0.05
GRID_SHARE = 0.3  # population: grid point j ~ Binomial(resolution, 0.3)


def _document(params: Any, cohort: dict[str, Any]) -> dict[str, Any]:
    return {"metric": "m", "kind": params.kind, "params": params.to_dict(), "start": None,
            "end": None, "reports": cohort["reports"], "cohorts": [{"cohort": 0, **cohort}]}


def _number_params(mechanism: str) -> NumberParams:
    return NumberParams(low=-5.0, high=5.0, mechanism=mechanism, epsilon=1.0,
                        delta=1e-6 if mechanism == "gaussian" else None, resolution=64)


def _check_unbiased_and_covered(estimates: np.ndarray, std_errors: np.ndarray,
                                truth: np.ndarray | float) -> None:
    """(a) and (b) for ``RUNS`` x columns estimates with their stated standard errors."""
    # the mean of RUNS estimates has standard error rms(stated se) / sqrt(RUNS): within 4
    error = estimates.mean(axis=0) - truth
    tolerance = 4 * np.sqrt(np.mean(std_errors**2, axis=0) / RUNS)
    assert np.all(np.abs(error) < tolerance), (error, tolerance)
    covered = np.abs(estimates - truth) <= Z95 * std_errors
    assert 0.93 <= covered.mean() <= 0.97, covered.mean(axis=0)


def _check_shares_stated(result: DecodeResult, noted: bool = False) -> None:
    """(c) for a frequency table: intervals in [0, 1]; a share outside it is named in a
    note, and a note appears only then (or when ``noted``, for another reason)."""
    outside = [row["value"] for row in result.rows if not 0.0 <= row["proportion"] <= 1.0]
    for row in result.rows:  # never an empty interval, even for a share far below 0
        assert 0.0 <= row["prop_low_95"] <= row["prop_high_95"] <= 1.0, row
    assert ("note" in result.summary) == (bool(outside) or noted), (outside, result.summary)
    for label in outside:
        assert repr(label) in result.summary["note"]


@pytest.mark.parametrize("reports", SIZES)
def test_categories(reports: int) -> None:
    p_star, q_star = CATEGORY.effective_probs
    rng = np.random.default_rng(reports + 1)
    values = rng.multinomial(reports, CATEGORY_SHARES, size=RUNS)
    ones = rng.binomial(values, q_star) + rng.binomial(reports - values, p_star)
    # one column per category, then the sum of the shares (allocated, truth 1)
    estimates, std_errors = np.zeros((RUNS, CATEGORY.k + 1)), np.zeros((RUNS, CATEGORY.k + 1))
    notes = 0
    for run in range(RUNS):
        result = decode_counts(_document(CATEGORY, {"reports": reports,
                                                    "ones": ones[run].tolist()}))
        summary = result.summary
        estimates[run] = [*result.column("proportion"), summary["allocated_proportion_unbiased"]]
        std_errors[run] = [*result.column("prop_std_error"),
                           summary["allocated_proportion_std_error"]]
        allocated = summary["allocated_proportion_unbiased"]
        assert summary["allocated_proportion"] == np.clip(allocated, 0.0, 1.0)
        clipped = not -SUM_ROUNDING <= allocated <= 1.0 + SUM_ROUNDING
        _check_shares_stated(result, noted=clipped)
        assert ("allocated_proportion_unbiased keeps" in summary.get("note", "")) == clipped
        notes += "note" in summary
    # variance rho (1 - rho) / (N (q* - p*)^2) with rho = p* + share (q* - p*); the sum's
    # is Var(set bits of a report) / (N (q* - p*)^2), the shares' covariances included
    _check_unbiased_and_covered(estimates, std_errors, [*CATEGORY_SHARES, 1.0])
    assert notes > 0  # category "e" (share 0) reads below 0 in about half the runs


def test_a_grr_sum_of_shares_is_one_and_never_noted_as_clipped() -> None:
    """GRR's shares add up to 1 exactly; rounding made their float sum 1.0000000000000002
    in about half the decodes, which the summary then called clipped to [0, 1]."""
    params = GrrParams(categories=("a", "b", "c", "d", "e", "f", "g"), epsilon=1.0)
    rng = np.random.default_rng(3)
    for _ in range(200):
        counts = rng.multinomial(5_000, rng.dirichlet(np.ones(7))).tolist()
        summary = decode_counts(_document(params, {"reports": 5_000,
                                                   "responses": counts})).summary
        assert abs(summary["allocated_proportion_unbiased"] - 1.0) < SUM_ROUNDING
        assert "allocated_proportion_unbiased keeps" not in summary.get("note", "")


@pytest.mark.parametrize("reports", SIZES)
def test_booleans(reports: int) -> None:
    yes_if_false, yes_if_true = BOOLEAN.yes_probs
    rng = np.random.default_rng(reports + 2)
    truthful = rng.binomial(reports, TRUE_SHARE, size=RUNS)
    ones = rng.binomial(truthful, yes_if_true) + rng.binomial(reports - truthful, yes_if_false)
    estimates, std_errors = np.zeros(RUNS), np.zeros(RUNS)
    for run in range(RUNS):
        result = decode_counts(_document(BOOLEAN, {"reports": reports, "ones": int(ones[run])}))
        assert [row["value"] for row in result.rows] == ["true", "false"]
        estimates[run] = result.rows[0]["proportion"]
        std_errors[run] = result.rows[0]["prop_std_error"]
        _check_shares_stated(result)
        assert 0.0 <= result.summary["yes_share"] <= 1.0
    # variance mean (1 - mean) / (N (y1 - y0)^2), mean the binomial rate of yes
    _check_unbiased_and_covered(estimates, std_errors, TRUE_SHARE)


def _report_law(params: NumberParams) -> tuple[np.ndarray, np.ndarray]:
    """Support (grid steps) and probabilities of ``j + Z``: the population's grid point
    plus the mechanism's discrete noise, the noise's law as the encoder draws it."""
    bound = params.noise_bound
    noise = np.arange(-bound, bound + 1)
    if params.mechanism == "laplace":
        r = math.exp(-1.0 / params.laplace_scale)
        noise_pmf = r ** np.abs(noise.astype(float))
    else:
        # the encoder draws with variance (sigma (1 + 1e-12))^2 (veil.simulations.encoding)
        sigma = params.gaussian_sigma * (1 + 1e-12)
        noise_pmf = np.exp(-(noise.astype(float) ** 2) / (2 * sigma**2))
    grid_pmf = stats.binom.pmf(np.arange(params.resolution + 1), params.resolution, GRID_SHARE)
    pmf = np.convolve(grid_pmf, noise_pmf / noise_pmf.sum())
    return np.arange(-bound, bound + params.resolution + 1), pmf / pmf.sum()


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian", "1bitmean"])
@pytest.mark.parametrize("reports", SIZES)
def test_number_means(mechanism: str, reports: int) -> None:
    params = _number_params(mechanism)
    rng = np.random.default_rng(reports + 3)
    truth = params.low + (params.high - params.low) * GRID_SHARE
    if mechanism == "1bitmean":
        # each report is an independent Bernoulli(E_j[N(j)] / 2^32): the count is binomial
        points = np.arange(params.resolution + 1)
        weights = stats.binom.pmf(points, params.resolution, GRID_SHARE)
        numerators = np.array([params.one_bit_numerator(int(j)) for j in points], float)
        ones = rng.binomial(reports, float(weights @ numerators) / PROB_ONE, size=RUNS)
        cohorts = [{"reports": reports, "ones": int(count)} for count in ones]
    else:
        steps, pmf = _report_law(params)
        values = params.low + params.step * steps
        histograms = rng.multinomial(reports, pmf, size=RUNS).astype(float)
        cohorts = [{"reports": reports, "sum": float(h @ values),
                    "sum_squares": float(h @ values**2)} for h in histograms]
    estimates, std_errors = np.zeros(RUNS), np.zeros(RUNS)
    for run, cohort in enumerate(cohorts):
        row = decode_counts(_document(params, cohort)).rows[0]
        estimates[run], std_errors[run] = row["estimate"], row["std_error"]
        assert params.low <= row["low_95"] <= row["high_95"] <= params.high, row
    # laplace/gaussian: variance s^2 / N with s^2 the reports' sample variance;
    # 1bitmean: width^2 b (1 - b) / (N spread^2), b the share of ones
    _check_unbiased_and_covered(estimates, std_errors, truth)
