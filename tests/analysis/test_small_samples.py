"""The string decoder at small samples: unbiased shares and honest intervals at N = 2,000.

Counts are drawn from the RAPPOR model (see ``test_string_statistics``). Two listed
strings hold 55% and 35% of reports, 500 unlisted values share the other 10%, and
three decoys are listed with no reports. Both true strings are detected in every run
(their z is above 5 at N = 2,000 while Bonferroni over 5 candidates needs 2.3), so the
estimates are not cut by selection. Every tolerance comes from the standard errors
the decoder states (``(X' W X)^-1`` with the model variance ``rho (1 - rho) /
(N_j (q* - p*)^2)``) or from the binomial variance of a coverage count.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis import StringDecoder, build_map, simulate_string_counts
from veil.shared.kinds import StringParams

PARAMS = StringParams(k=32, h=2, m=16, p=0.5, q=0.75, f=0.5)
LISTED = ["big", "medium", "decoy-0", "decoy-1", "decoy-2"]
UNLISTED = [f"unlisted-{i}" for i in range(500)]
SHARES = np.concatenate([[0.55, 0.35], np.full(500, 0.1 / 500)])
MISSING = 0.1
RUNS = 500


def _repeated_fits(reports: int, seed: int) -> dict[str, np.ndarray]:
    """Shares and missing share with their stated standard errors over ``RUNS`` simulations."""
    true_map = build_map(PARAMS, LISTED[:2] + UNLISTED)
    candidate_map = build_map(PARAMS, LISTED)
    rng = np.random.default_rng(seed)
    out = {name: np.zeros((RUNS, 2)) for name in ("share", "share_se")}
    out.update({name: np.zeros(RUNS) for name in ("missing", "missing_se", "detected")})
    for run in range(RUNS):
        counts = simulate_string_counts(PARAMS, true_map, SHARES, reports, rng)
        decoder = StringDecoder(PARAMS).fit(*counts, LISTED, candidate_map)
        out["share"][run] = decoder.proportions_[:2]
        out["share_se"][run] = decoder.std_errors_[:2] / reports
        out["missing"][run] = decoder.summary_["missing_proportion_unbiased"]
        out["missing_se"][run] = decoder.summary_["missing_proportion_std_error"]
        out["detected"][run] = decoder.detected_[:2].all()
    return out


@pytest.fixture(scope="module", params=[2_000, 20_000])
def fits(request: pytest.FixtureRequest) -> dict[str, np.ndarray]:
    return _repeated_fits(request.param, seed=request.param)


def test_both_strings_are_always_detected(fits: dict[str, np.ndarray]) -> None:
    assert fits["detected"].all()


def test_string_shares_are_unbiased(fits: dict[str, np.ndarray]) -> None:
    # the mean of RUNS estimates has standard error rms(stated se) / sqrt(RUNS): within 4 of them
    error = fits["share"].mean(axis=0) - SHARES[:2]
    tolerance = 4 * np.sqrt(np.mean(fits["share_se"] ** 2, axis=0) / RUNS)
    assert np.all(np.abs(error) < tolerance), (error, tolerance)


def test_missing_share_is_unbiased(fits: dict[str, np.ndarray]) -> None:
    # same rule with the stated standard error of the missing share (background variance
    # from (X' W X)^-1 scaled by k / expected distinct bits per value)
    error = fits["missing"].mean() - MISSING
    tolerance = 4 * np.sqrt(np.mean(fits["missing_se"] ** 2) / RUNS)
    assert abs(error) < tolerance, (error, tolerance)


def test_95_percent_intervals_cover_the_truth_93_to_97_percent(fits: dict[str, np.ndarray]) -> None:
    z = stats.norm.isf(0.025)
    covered = np.abs(fits["share"] - SHARES[:2]) <= z * fits["share_se"]
    # 1,000 intervals: binomial sd of the coverage sqrt(.95 * .05 / 1000) = 0.69%, so
    # 93-97% is 2.9 sds either side of 95%
    assert 0.93 <= covered.mean() <= 0.97, covered.mean(axis=0)
    missing_covered = np.abs(fits["missing"] - MISSING) <= z * fits["missing_se"]
    # 500 intervals: binomial sd 0.97%; 92-98% is 3.1 sds either side of 95%
    assert 0.92 <= missing_covered.mean() <= 0.98, missing_covered.mean()


def test_an_impossible_missing_share_comes_with_its_interval_and_a_note() -> None:
    """At 300 reports the missing share's standard error is about 0.5: it often leaves [0, 1]
    (and the detected strings' unbiased shares can add up past 1, or past 1 with the
    missing share); the allocated share is shown in [0, 1], the missing one unbiased with
    its interval in [0, 1], with a note whenever it lies outside what it can be."""
    true_map = build_map(PARAMS, LISTED[:2] + UNLISTED)
    candidate_map = build_map(PARAMS, LISTED)
    rng = np.random.default_rng(17)
    notes = 0
    for _ in range(20):
        counts = simulate_string_counts(PARAMS, true_map, SHARES, 300, rng)
        summary = StringDecoder(PARAMS).fit(*counts, LISTED, candidate_map).summary_
        unbiased = summary["missing_proportion_unbiased"]
        allocated = summary["allocated_proportion_unbiased"]
        shown = summary["allocated_proportion"]
        assert shown == np.clip(allocated, 0.0, 1.0)
        # the missing share is shown unbiased, with its interval within [0, 1]; the estimate
        # clipped to what the detected strings leave is a separate figure
        assert summary["missing_proportion"] == unbiased
        assert 0.0 <= summary["missing_proportion_low"] <= summary["missing_proportion_high"] <= 1.0
        assert summary["missing_proportion_clipped"] == np.clip(unbiased, 0.0, 1.0 - shown)
        for fraction in ("signal_explained_by_detected", "signal_attributed_to_missing"):
            assert summary[fraction] is None or 0.0 <= summary[fraction] <= 1.0
        impossible = not 0.0 <= unbiased <= 1.0 - shown or allocated > 1.0
        assert ("note" in summary) == impossible
        notes += "note" in summary
    assert notes > 0
