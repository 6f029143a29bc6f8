"""Calibration of the string decoder where the randomization is far from symmetric, where
strings sit near the detection limit and where few reports leave the missing share vague.

Collections are drawn exactly from the RAPPOR model
(:mod:`veil.simulations.calibration_strings`); every seed is fixed and every tolerance is
derived from a sampling distribution named beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis import StringDecoder, build_map, simulate_string_counts
from veil.shared.kinds import StringParams
from veil.simulations.calibration_strings import StringCase, string_calibration
from veil.simulations.discovery_experiment import string_channel_params
from veil.simulations.populations import distribution_weights

RUNS = 300


@pytest.mark.parametrize(
    "params",
    [string_channel_params(4.0), StringParams()],
    ids=["channel-h1-p0-q1", "defaults"],
)
def test_standard_errors_match_the_spread_with_asymmetric_randomization(
    params: StringParams,
) -> None:
    """With h = 1, p = 0, q = 1 a common string's bits read ones at rates near q* while
    the rest read near p*: one pooled rate understated its standard error (SE/SD 0.68,
    coverage 78% for the top string). Each bit's own variance (a sandwich covariance) must
    give SE/SD near 1 for the three most common strings, and the defaults must stay so."""
    case = StringCase.from_shape("zipf1.5 over 100, 50 decoys", params, 100_000, "zipf1.5", 100,
                                 decoys=50)
    cell = string_calibration(case, RUNS, seed=2611)
    # s^2 / sigma^2 ~ chi-square(R-1): the stated SE over the observed SD lies within
    # the central 1 - 2e-4 of that law's square root (per rank)
    dof = RUNS - 1
    low = math.sqrt(dof / stats.chi2.isf(1e-4, dof))
    high = math.sqrt(dof / stats.chi2.ppf(1e-4, dof))
    assert all(low < ratio < high for ratio in cell.se_ratio), (cell.se_ratio, low, high)
    # 900 intervals: binomial sd of the coverage sqrt(.95 * .05 / 900) = 0.73%, so
    # 92.5-97.5% is 3.4 sds either side of 95%
    assert 0.925 <= float(np.mean(cell.coverage)) <= 0.975, cell.coverage


def _shown_totals(reports: int, runs: int, seed: int) -> tuple[np.ndarray, list[dict]]:
    """Shown allocated + missing share of a list holding every true value (truth 1)."""
    params = StringParams()
    shares = distribution_weights("zipf1.5", 100)
    candidates = [f"v{i + 1}" for i in range(100)] + [f"decoy-{i}" for i in range(50)]
    candidate_map = build_map(params, candidates)
    rng = np.random.default_rng(seed)
    totals = np.zeros(runs)
    summaries = []
    for run in range(runs):
        counts = simulate_string_counts(params, candidate_map[:, :100], shares, reports, rng)
        summary = StringDecoder(params).fit(*counts, candidates, candidate_map).summary_
        totals[run] = summary["allocated_proportion"] + summary["missing_proportion"]
        summaries.append(summary)
    return totals, summaries


@pytest.mark.parametrize("reports", [1_500, 5_000])
def test_the_shown_allocated_and_missing_shares_add_up_to_one_on_average(reports: int) -> None:
    """Clipping the missing share to what the detected strings leave made the shown total
    read 0.85 at 1,500 reports and 0.88 at 5,000. The shown missing share is the unbiased
    one; the detected shares (clipped at 1 only) plus it must average 1."""
    runs = 200
    totals, summaries = _shown_totals(reports, runs, seed=reports)
    # mean of R totals: standard error sd / sqrt(R); within 4 of them
    tolerance = 4 * totals.std(ddof=1) / math.sqrt(runs)
    assert abs(totals.mean() - 1.0) < tolerance, (totals.mean(), tolerance)
    for summary in summaries:
        low, high = summary["missing_proportion_low"], summary["missing_proportion_high"]
        assert 0.0 <= low <= high <= 1.0
        assert 0.0 <= summary["missing_proportion_clipped"] <= 1.0 - summary["allocated_proportion"]


def test_a_fit_that_detects_nothing_says_the_missing_share_is_unknown() -> None:
    """At 200 reports nothing is detected; the summary must not read "0% allocated, 0%
    missing": the missing share's interval reaches 1 (all of the population may be
    missing from an empty table) and the description says the reports are too few."""
    _, summaries = _shown_totals(200, 10, seed=7)
    empty = [s for s in summaries if s["detected"] == 0]
    assert empty
    for summary in empty:
        assert summary["missing_proportion_high"] == 1.0
        assert summary["missing_proportion_high"] - summary["missing_proportion_low"] > 0.5


def test_the_missing_share_reads_low_by_the_detected_strings_selection() -> None:
    """Strings near the detection limit (Zipf(1.5) over 100 values, 100,000 reports): the
    detected ones are those whose estimates came out high, so against its truth (1 less
    the true shares of the detected strings) the missing share reads low by their excess,
    as docs/analysis.md states; the total it forms with the unbiased allocated share stays
    unbiased for 1."""
    params = StringParams()
    shares = distribution_weights("zipf1.5", 100)
    candidates = [f"v{i + 1}" for i in range(100)]
    candidate_map = build_map(params, candidates)
    rng = np.random.default_rng(2612)
    runs = 200
    error = np.zeros(runs)
    excess = np.zeros(runs)
    total = np.zeros(runs)
    for run in range(runs):
        counts = simulate_string_counts(params, candidate_map, shares, 100_000, rng)
        decoder = StringDecoder(params).fit(*counts, candidates, candidate_map)
        summary, detected = decoder.summary_, decoder.detected_
        error[run] = summary["missing_proportion"] - (1.0 - shares[detected].sum())
        excess[run] = float((decoder.proportions_ - shares)[detected].sum())
        total[run] = summary["allocated_proportion_unbiased"] + summary["missing_proportion"]
    # means of R runs: standard error sd / sqrt(R); 4 of them
    def tolerance(x: np.ndarray) -> float:
        return float(4 * x.std(ddof=1) / math.sqrt(runs))

    assert abs(total.mean() - 1.0) < tolerance(total), (total.mean(), tolerance(total))
    assert excess.mean() > tolerance(excess), (excess.mean(), tolerance(excess))
    assert abs(error.mean() + excess.mean()) < tolerance(error + excess)
