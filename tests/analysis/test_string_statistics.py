"""The string decoder on simulated data with known truth.

Counts are drawn directly from the RAPPOR model (cohort sizes multinomial,
values multinomial within each cohort, each reported bit Binomial with q* where
the Bloom bit is set and p* where it is not), which is exact in distribution for
independent reports. Every test uses a fixed seed; every tolerance is derived
from a stated sampling distribution.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from scipy import stats
from threadpoolctl import threadpool_limits

from veil.server.analysis import StringDecoder, build_map, simulate_string_counts
from veil.shared.kinds import StringParams

PARAMS = StringParams(k=32, h=2, m=16, p=0.5, q=0.75, f=0.5)
REPORTS = 200_000
TRUE = [f"true-{i}" for i in range(5)]
SHARES = np.array([0.35, 0.25, 0.2, 0.12, 0.08])
DECOYS = [f"decoy-{i}" for i in range(45)]
# 400 runs x 5 strings = 2000 intervals
REPETITIONS = 400


@pytest.fixture(scope="module")
def repeated_fits() -> tuple[np.ndarray, np.ndarray]:
    """Shares and stated standard errors of the five true strings over repeated runs."""
    candidates = TRUE + DECOYS
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(20261122)
    estimates = np.zeros((REPETITIONS, len(TRUE)))
    std_errors = np.zeros_like(estimates)
    for run in range(REPETITIONS):
        reports, ones = simulate_string_counts(PARAMS, candidate_map[:, :5], SHARES, REPORTS, rng)
        decoder = StringDecoder(PARAMS).fit(reports, ones, candidates, candidate_map)
        estimates[run] = decoder.proportions_[:5]
        std_errors[run] = decoder.std_errors_[:5] / REPORTS
    return estimates, std_errors


def test_estimates_are_unbiased(repeated_fits: tuple[np.ndarray, np.ndarray]) -> None:
    estimates, _ = repeated_fits
    mean_error = estimates.mean(axis=0) - SHARES
    # standard error of a mean of R runs: sd / sqrt(R); 4 of them (two-sided 6e-5 per string)
    tolerance = 4 * estimates.std(axis=0, ddof=1) / np.sqrt(REPETITIONS)
    assert np.all(np.abs(mean_error) < tolerance), (mean_error, tolerance)


def test_stated_standard_errors_match_the_observed_spread(
    repeated_fits: tuple[np.ndarray, np.ndarray],
) -> None:
    estimates, std_errors = repeated_fits
    ratio = estimates.var(axis=0, ddof=1) / np.mean(std_errors**2, axis=0)
    # s^2 / sigma^2 ~ chi-square(R-1): accept the central 1 - 2e-4 of that law
    dof = REPETITIONS - 1
    low, high = stats.chi2.ppf(1e-4, dof) / dof, stats.chi2.isf(1e-4, dof) / dof
    assert np.all((ratio > low) & (ratio < high)), (ratio, low, high)


def test_95_percent_intervals_cover_the_truth_95_percent_of_the_time(
    repeated_fits: tuple[np.ndarray, np.ndarray],
) -> None:
    estimates, std_errors = repeated_fits
    z = stats.norm.isf(0.025)
    covered = np.abs(estimates - SHARES) <= z * std_errors
    # 2000 intervals: binomial sd of the coverage sqrt(.95 * .05 / 2000) = 0.49%,
    # so the 93-97% band is about 4 standard deviations wide on each side
    assert 0.93 <= covered.mean() <= 0.97, covered.mean()


def _false_positive_runs(correction: str, runs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per run: decoys reported and strings reported, with 5 true strings and 300 decoys."""
    decoys = [f"decoy-{i}" for i in range(300)]
    candidates = TRUE + decoys
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(seed)
    false = np.zeros(runs, dtype=int)
    reported = np.zeros(runs, dtype=int)
    for run in range(runs):
        reports, ones = simulate_string_counts(PARAMS, candidate_map[:, :5], SHARES, REPORTS, rng)
        decoder = StringDecoder(PARAMS, correction=correction, alpha=0.05).fit(
            reports, ones, candidates, candidate_map
        )
        false[run] = decoder.detected_[5:].sum()
        reported[run] = decoder.detected_.sum()
    return false, reported


def test_bonferroni_keeps_the_family_wise_error_rate() -> None:
    runs = 300
    false, reported = _false_positive_runs("bonferroni", runs, seed=11)
    # runs with any false positive ~ Binomial(runs, FWER <= 0.05): allow 3 sds above 0.05
    bound = runs * 0.05 + 3 * np.sqrt(runs * 0.05 * 0.95)
    assert np.count_nonzero(false) <= bound, (np.count_nonzero(false), bound)
    assert np.all(reported - false == 5)  # the five true strings are always found


@pytest.mark.parametrize(("correction", "seed"), [("bh", 12), ("storey", 17)])
def test_fdr_corrections_keep_the_false_discovery_rate(correction: str, seed: int) -> None:
    runs = 300
    false, reported = _false_positive_runs(correction, runs, seed=seed)
    proportion = false / np.maximum(reported, 1)
    # a [0, 1] variable with mean <= 0.05 has variance <= 0.05 * 0.95: 3 sds of the mean
    bound = 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs)
    assert proportion.mean() <= bound, (proportion.mean(), bound)


def _mostly_present_runs(runs: int, seed: int) -> dict[str, np.ndarray]:
    """40 listed strings present (8 strong, 32 near the detection limit) and 20 decoys:
    per correction and run, [decoys reported, strings reported]."""
    true = [f"present-{i}" for i in range(40)]
    candidates = true + [f"decoy-{i}" for i in range(20)]
    candidate_map = build_map(PARAMS, candidates)
    shares = np.concatenate([np.full(8, 0.09), np.full(32, 0.28 / 32)])
    rng = np.random.default_rng(seed)
    tallies = {name: np.zeros((runs, 2), dtype=int) for name in ("storey", "bh")}
    for run in range(runs):
        reports, ones = simulate_string_counts(PARAMS, candidate_map[:, :40], shares, 100_000, rng)
        for name, tally in tallies.items():
            decoder = StringDecoder(PARAMS, correction=name).fit(
                reports, ones, candidates, candidate_map
            )
            assert decoder.summary_["fit"] == "joint"
            tally[run] = decoder.detected_[40:].sum(), decoder.detected_.sum()
    return tallies


def test_storey_keeps_the_fdr_and_finds_more_when_most_candidates_are_present() -> None:
    runs = 300
    tallies = _mostly_present_runs(runs, seed=18)
    for name, tally in tallies.items():
        proportion = tally[:, 0] / np.maximum(tally[:, 1], 1)
        # a [0, 1] variable with mean <= 0.05 has variance <= 0.05 * 0.95: 3 sds of the mean
        assert proportion.mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs), (name, proportion.mean())
    true_found = {name: (tally[:, 1] - tally[:, 0]) for name, tally in tallies.items()}
    # Storey's threshold is never stricter than BH's (its estimated null share is at most
    # 1); with two thirds of the list present it is looser: at least one more string per
    # run on average, and more by over 3 standard errors of the mean gain
    gain = true_found["storey"] - true_found["bh"]
    assert np.all(gain >= 0)
    assert gain.mean() >= 1.0 and gain.mean() > 3 * gain.std(ddof=1) / np.sqrt(runs), gain.mean()


@pytest.mark.parametrize(("decoys", "fit", "seed"), [(100, "lasso", 13), (40, "joint", 19)])
def test_values_missing_from_the_list_go_to_the_background_not_to_decoys(
    decoys: int, fit: str, seed: int
) -> None:
    """1,000 unlisted values with equal shares hold 30% of reports; the listed ones stay
    unbiased and the error rates hold, through the Lasso path and the joint fit."""
    unlisted = [f"unlisted-{i}" for i in range(1000)]
    shares = np.concatenate([SHARES * 0.7, np.full(1000, 0.3 / 1000)])
    candidates = TRUE + [f"decoy-{i}" for i in range(decoys)]
    true_map = build_map(PARAMS, TRUE + unlisted)
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(seed)
    runs = 100
    missing = np.zeros(runs)
    missing_se = np.zeros(runs)
    errors = np.zeros((runs, 5))
    false = 0
    false_share = np.zeros(runs)
    for run in range(runs):
        reports, ones = simulate_string_counts(PARAMS, true_map, shares, REPORTS, rng)
        strict = StringDecoder(PARAMS, correction="bonferroni").fit(
            reports, ones, candidates, candidate_map
        )
        false += int(strict.detected_[5:].any())
        decoder = StringDecoder(PARAMS).fit(reports, ones, candidates, candidate_map)
        assert decoder.summary_["fit"] == strict.summary_["fit"] == fit
        false_share[run] = decoder.detected_[5:].sum() / max(decoder.detected_.sum(), 1)
        missing[run] = decoder.summary_["missing_proportion_unbiased"]  # the estimator
        missing_se[run] = decoder.summary_["missing_proportion_std_error"]
        errors[run] = decoder.proportions_[:5] - shares[:5]
    # mean of 100 runs within 4 of its standard errors (sd / sqrt(runs))
    assert abs(missing.mean() - 0.3) < 4 * missing.std(ddof=1) / np.sqrt(runs)
    assert np.all(np.abs(errors.mean(axis=0)) < 4 * errors.std(axis=0, ddof=1) / np.sqrt(runs))
    # Bonferroni: family-wise error at most 0.05, 3 binomial sds above runs * 0.05;
    # the default (Storey): false discovery rate at most 0.05, 3 sds of a [0, 1] mean above
    assert false <= runs * 0.05 + 3 * np.sqrt(runs * 0.05 * 0.95)
    assert false_share.mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs), false_share.mean()
    # the stated standard error of the missing share matches its spread (chi-square, 1e-4 tails)
    dof = runs - 1
    ratio = missing.var(ddof=1) / np.mean(missing_se**2)
    assert stats.chi2.ppf(1e-4, dof) / dof < ratio < stats.chi2.isf(1e-4, dof) / dof


#: a google/rappor-sized Bloom filter for the test below
WIDE = StringParams(k=128, h=2, m=64, p=0.5, q=0.75, f=0.5)


def _most_common_value_unlisted(
    decoys: int, fit: str, runs: int, seed: int
) -> dict[str, np.ndarray]:
    """300 values with Zipf(1.5) shares; the 100 most common but the first (40% of the
    reports) are listed with ``decoys`` decoys. Per correction and run: decoys reported,
    strings reported, how many of the six next most common values (shares 2.2% to 14%)
    were found, and whether the equations left out are exactly the unlisted value's bits."""
    shares = np.arange(1, 301) ** -1.5
    shares /= shares.sum()
    values = [f"value-{i}" for i in range(300)]
    candidates = values[1:101] + [f"decoy-{i}" for i in range(decoys)]
    true_map = build_map(WIDE, values)
    candidate_map = build_map(WIDE, candidates)
    unlisted_bits = np.zeros(true_map.shape[0], dtype=bool)
    unlisted_bits[true_map[:, 0].nonzero()[0]] = True
    rng = np.random.default_rng(seed)
    tallies = {name: np.zeros((runs, 4)) for name in ("storey", "bonferroni")}
    for run in range(runs):
        reports, ones = simulate_string_counts(WIDE, true_map, shares, 1_000_000, rng)
        for name, tally in tallies.items():
            decoder = StringDecoder(WIDE, correction=name).fit(
                reports, ones, candidates, candidate_map
            )
            assert decoder.summary_["fit"] == fit
            detected = decoder.detected_
            tally[run] = (
                detected[100:].sum(), detected.sum(), detected[:6].sum(),
                np.array_equal(decoder.excluded_, unlisted_bits),
            )
    return tallies


@pytest.fixture
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread: the fits invert matrices of a few hundred rows, too small to gain
    from threads, and on a busy machine threads that wait for each other made them take up
    to six times as long."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.mark.usefixtures("one_blas_thread")
@pytest.mark.parametrize(
    ("decoys", "fit", "runs", "seed"), [(300, "joint", 150, 41), (3000, "lasso", 60, 43)]
)
def test_a_common_value_missing_from_the_list_does_not_pass_for_decoys(
    decoys: int, fit: str, runs: int, seed: int
) -> None:
    """The most common value unlisted sets its own bits in every cohort far above the
    background. Left in the fit, those bits made decoys that share them significant
    (300 decoys: a quarter of the runs reported one under Bonferroni, Storey's false
    share was 0.15) and hid weaker listed strings; the decoder now leaves such equations
    out. Joint fit at 300 decoys, the Lasso path at 3,000."""
    tallies = _most_common_value_unlisted(decoys, fit, runs, seed)
    false = tallies["bonferroni"][:, 0]
    # Bonferroni: runs with a decoy ~ Binomial(runs, FWER <= 0.05), 3 binomial sds above
    assert np.count_nonzero(false) <= runs * 0.05 + 3 * np.sqrt(runs * 0.05 * 0.95)
    storey = tallies["storey"]
    proportion = storey[:, 0] / np.maximum(storey[:, 1], 1)
    # Storey: the false share, a [0, 1] variable with mean <= 0.05 (variance <= 0.05 * 0.95)
    assert proportion.mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs), proportion.mean()
    for tally in tallies.values():
        # the left-out equations are the unlisted value's bits (each reads about 25 standard
        # deviations high), and nothing else but at the stated 1% of fits, 3 binomial sds
        assert runs - tally[:, 3].sum() <= runs * 0.01 + 3 * np.sqrt(runs * 0.01 * 0.99)
        # the six next most common values: the rarest, 2.2%, is 7.4 standard errors (0.29%)
        # out, 3 above the z Bonferroni needs over 5,100 candidates (4.4; less over 400),
        # so it is missed with chance P(Z < -3) = 0.13% a run, the others less: misses ~
        # Binomial(6 runs, <= 0.0013), at most 3 binomial sds above that
        misses = 6 * runs - tally[:, 2].sum()
        assert misses <= 6 * runs * 0.0013 + 3 * np.sqrt(6 * runs * 0.0013), misses


def test_benjamini_hochberg_finds_more_weak_strings_than_bonferroni() -> None:
    """Twenty true strings near the detection limit among 300 decoys."""
    true = [f"weak-{i}" for i in range(20)]
    candidates = true + [f"decoy-{i}" for i in range(300)]
    candidate_map = build_map(PARAMS, candidates)
    shares = np.full(20, 0.04)
    shares[0] = 0.2
    shares /= shares.sum()
    rng = np.random.default_rng(14)
    found = {"bonferroni": [], "bh": []}
    for _ in range(10):
        reports, ones = simulate_string_counts(PARAMS, candidate_map[:, :20], shares, 70_000, rng)
        for correction, tally in found.items():
            decoder = StringDecoder(PARAMS, correction=correction).fit(
                reports, ones, candidates, candidate_map
            )
            tally.append(int(decoder.detected_[:20].sum()))
    bonferroni, bh = np.array(found["bonferroni"]), np.array(found["bh"])
    # BH's thresholds are never stricter than Bonferroni's: it finds at least as many each run,
    # and with 20 strings at z of about 3.5 to 4.5 clearly more on average
    assert np.all(bh >= bonferroni)
    assert bh.mean() > bonferroni.mean() + 2, (bh.mean(), bonferroni.mean())


def test_a_string_at_the_stated_detection_limit_is_found_80_percent_of_the_time() -> None:
    candidates = ["big", "target"] + [f"decoy-{i}" for i in range(98)]
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(15)
    reports, ones = simulate_string_counts(
        PARAMS, candidate_map[:, :2], np.array([0.5, 0.5]), REPORTS, rng
    )
    # the limit is stated for a lone discovery (Bonferroni's threshold, which the FDR
    # corrections reach when nothing else is found): test it under Bonferroni
    limit = StringDecoder(PARAMS, correction="bonferroni").fit(
        reports, ones, candidates, candidate_map
    ).summary_["min_detectable_proportion"]
    unlisted = [f"unlisted-{i}" for i in range(500)]
    true_map = build_map(PARAMS, ["big", "target", *unlisted])
    shares = np.concatenate([[0.4, limit], np.full(500, (0.6 - limit) / 500)])
    runs = 300
    found = 0
    for _ in range(runs):
        reports, ones = simulate_string_counts(PARAMS, true_map, shares, REPORTS, rng)
        found += StringDecoder(PARAMS, correction="bonferroni").fit(
            reports, ones, candidates, candidate_map
        ).detected_[1]
    # detections ~ Binomial(runs, 0.8): within 3 binomial sds sqrt(runs * 0.8 * 0.2)
    assert abs(found - 0.8 * runs) <= 3 * np.sqrt(runs * 0.8 * 0.2), found / runs


def test_bit_count_estimates_are_unbiased_with_the_stated_variance() -> None:
    """t_ij = (c_ij - p* N_j) / (q* - p*) against the true set-bit counts, over repeated draws."""
    from veil.server.analysis.strings import bit_estimates
    from veil.server.analysis.synthetic import true_bit_counts

    params = StringParams(k=8, h=2, m=2)
    true_map = build_map(params, ["a", "b"])
    p_star, q_star = params.effective_probs
    spread = q_star - p_star
    reports = np.array([5000, 3000])
    values = np.array([[3000, 2000], [1000, 2000]])
    truth = true_bit_counts(true_map, values, params.k)
    rng = np.random.default_rng(16)
    runs = 4000
    estimates = np.zeros((runs, 2, 8))
    variances = np.zeros_like(estimates)
    for run in range(runs):
        ones = rng.binomial(truth, q_star) + rng.binomial(reports[:, None] - truth, p_star)
        share, variance = bit_estimates(params, reports, ones)
        estimates[run] = share * reports[:, None]
        variances[run] = variance * reports[:, None] ** 2
    decoder = StringDecoder(params).fit(reports, ones, ["a", "b"], true_map)
    np.testing.assert_allclose(decoder.bit_counts_, estimates[-1])
    np.testing.assert_allclose(decoder.bit_count_variances_, variances[-1])
    # mean of the runs within 4 standard errors of the mean
    error = estimates.mean(axis=0) - truth
    assert np.all(np.abs(error) < 4 * estimates.std(axis=0, ddof=1) / np.sqrt(runs))
    # with the values fixed, the variance is the sum of two binomial variances (chi-square check)
    exact = (truth * q_star * (1 - q_star) + (reports[:, None] - truth) * p_star * (1 - p_star))
    exact = exact / spread**2
    dof = runs - 1
    ratio = estimates.var(axis=0, ddof=1) / exact
    assert np.all(ratio > stats.chi2.ppf(1e-4, dof) / dof)
    assert np.all(ratio < stats.chi2.isf(1e-4, dof) / dof)
    # the stated variance N rho (1 - rho) / (q* - p*)^2 is that of reports drawn from the
    # population: the binomial part plus the draw of the values, N pi (1 - pi) (law of total
    # variance). rho is estimated from the counts: its sd sqrt(rho (1 - rho) / N) < 0.01 moves
    # rho (1 - rho) by < 0.5%; 1% also covers the (c + 1/2) / (N + 1) smoothing
    share = truth / reports[:, None]
    population = exact + reports[:, None] * share * (1 - share)
    np.testing.assert_allclose(variances.mean(axis=0), population, rtol=0.01)


@pytest.mark.parametrize("reports", [2_000, REPORTS])
def test_a_list_that_misses_nothing_rarely_loses_an_equation(reports: int) -> None:
    """Equations are left out of the fit at a residual that noise alone reaches in 1% of
    the fits (:data:`~veil.server.analysis.strings.OUTLIER_RATE`), at small N too, where
    bit counts are far from normal."""
    candidates = TRUE + DECOYS
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(47)
    runs = 400
    losing = 0
    for _ in range(runs):
        counts = simulate_string_counts(PARAMS, candidate_map[:, :5], SHARES, reports, rng)
        decoder = StringDecoder(PARAMS).fit(*counts, candidates, candidate_map)
        losing += decoder.summary_["equations_excluded"] > 0
    # fits losing one ~ Binomial(runs, <= 0.01): 3 binomial sds above runs * 0.01
    assert losing <= runs * 0.01 + 3 * np.sqrt(runs * 0.01 * 0.99), losing
