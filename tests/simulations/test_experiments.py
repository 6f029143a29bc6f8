"""Experiments, sensitivity sampler and frequency oracles against their closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from veil.server.cli import main
from veil.simulations.experiments import run_experiment
from veil.simulations.sensitivity import HEIGHTS, sample_sensitivity

Z = 4.5  # standard deviations


def test_closed_form_expected_sensitivity_of_heights() -> None:
    """E|X - X'| by numerical integration of the mixture density of X - X'."""

    def density(x: float) -> float:
        total = 0.0
        for wi, mi, si in zip(HEIGHTS.weights, HEIGHTS.means, HEIGHTS.sds, strict=True):
            for wj, mj, sj in zip(HEIGHTS.weights, HEIGHTS.means, HEIGHTS.sds, strict=True):
                total += wi * wj * stats.norm.pdf(x, mi - mj, math.hypot(si, sj))
        return total

    numeric, _ = integrate.quad(lambda x: abs(x) * density(x), -200, 200, points=[0], limit=200)
    assert math.isclose(HEIGHTS.expected_abs_difference(), numeric, rel_tol=1e-7)
    assert round(HEIGHTS.expected_abs_difference(), 2) == 11.99


@pytest.mark.parametrize("n", [1, 10])
def test_sensitivity_sampler_matches_closed_form(n: int) -> None:
    """For the mean of n records, |f(D) - f(D')| = |X - X'| / n: the sampled mean is within
    Z standard errors (sample sd / sqrt(samples)) of E|X - X'| / n."""
    sample = sample_sensitivity(HEIGHTS.sample, lambda d: d.mean(axis=1), n, 50000,
                                np.random.default_rng(n))
    expected = HEIGHTS.expected_abs_difference() / n
    assert abs(sample.mean - expected) <= Z * sample.standard_error
    # and the spread: the sd of |X - X'| / n
    assert math.isclose(sample.distances.std(), HEIGHTS.sd_abs_difference() / n, rel_tol=0.05)


def test_oracle_variances_match_wang_closed_forms() -> None:
    """The sample variance of R trials has relative sd sqrt(2 / (R - 1)) (normal estimates);
    averaging over values can only shrink it, so Z of those bounds the ratio's distance to 1."""
    results = run_experiment("variances", quick=True, seed=5)
    for row in results.rows:
        tolerance = Z * math.sqrt(2 / (row["trials"] - 1))
        assert abs(row["ratio_all_values"] - 1) <= tolerance, row
        if row["oracle"] != "OLH":  # OLH's closed form assumes g = e^eps + 1 exactly
            assert abs(row["ratio_zero_freq"] - 1) <= tolerance, row
        assert row["mean_bias_in_sd"] <= Z, row


def test_shipped_oracles_match_the_variance_their_decoders_state() -> None:
    """Per point, the mean over categories of R-round sample variances, over the mean stated
    variance: each sample variance has relative sd sqrt(2 / (R - 1)) (near-normal estimates)
    and averaging over categories can only shrink that, so Z of it bounds the distance to 1.
    Each category's mean estimate is within 5.5 of its standard errors sqrt(var / R) of the
    truth: the largest in absolute value of the 8,336 normal deviates (4 oracles x 2 epsilons
    x 2 + 16 + 1,024 categories) exceeds 5.5 with probability 3e-4."""
    results = run_experiment("oracles", quick=True, seed=5)
    assert {row["oracle"] for row in results.rows} == {"grr", "oue", "olh", "hadamard"}
    for row in results.rows:
        assert abs(row["ratio"] - 1) <= Z * math.sqrt(2 / (row["rounds"] - 1)), row
        # that bound ignores the averaging over categories (at d = 1,024 it allows 3.1); the
        # mean squared error per round, over rounds, has an empirical standard error that
        # counts it, and the correlations between categories too
        assert abs(row["mse_ratio"] - 1) <= Z * row["mse_ratio_se"], row
        assert row["max_bias_in_se"] <= 5.5, row
        if row["oracle"] in ("grr", "oue", "hadamard"):
            # one-shot GRR, OUE and Hadamard are exactly the literature's mechanisms
            assert math.isclose(row["variance_per_report"], row["wang_closed_form"],
                                rel_tol=1e-6), row


def test_rr_error_grows_like_sqrt_n_and_laplace_stays_flat() -> None:
    """The RMSE of T errors with kurtosis kappa has relative sd about sqrt((kappa - 1) / (4 T))
    around the theoretical sd: kappa = 3 for the (binomial, near-normal) randomized response
    errors, 6 for Laplace noise."""
    results = run_experiment("rr-vs-laplace", quick=True)
    trials = 200
    for row in results.rows:
        kurtosis = 6 if row["mechanism"].startswith("Laplace") else 3
        tolerance = Z * math.sqrt((kurtosis - 1) / (4 * trials))
        assert abs(row["rmse"] / row["theory_sd"] - 1) <= tolerance, row


def test_experiment_command_writes_a_results_directory(tmp_path) -> None:
    out = tmp_path / "composition"
    assert main(["experiment", "composition", "--out", str(out), "--quick"]) == 0
    assert (out / "metrics.csv").read_text().startswith("model,composition,bins")
    png = out / "composition.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and "<table>" in page


def test_laplace_mean_error_follows_the_noise_variance() -> None:
    results = run_experiment("laplace-mean", quick=True)
    trials = 30
    for row in results.rows:
        # the noise term sqrt(2) delta / (eps sqrt n) dominates; the RMSE over T trials
        # has relative sd about 1/sqrt(2T)
        assert abs(row["rmse_cm"] / row["theory_cm"] - 1) <= Z / math.sqrt(2 * trials), row


def test_simulate_command_prints_rates(capsys) -> None:
    assert main(["simulate", "--reports", "30000", "--values", "50", "--m", "8",
                 "--candidates", "0"]) == 0
    out = capsys.readouterr().out
    assert "fast path" in out and "report matrix" in out and "reports/s" in out


def test_bad_simulation_input_is_a_clean_error(capsys) -> None:
    assert main(["simulate", "--reports", "0"]) == 2
    assert "--reports" in capsys.readouterr().err


def test_regression_matrix_scores_every_case() -> None:
    """25 cases; the decoder controls the family-wise error at 0.05 per case (Bonferroni), so
    over the 20 cases with absent candidates the false positives are about Poisson(<= 1):
    more than 5 has probability below 1e-3. Loose privacy (epsilon_1 = 5) must find at least
    as many true values as typical (epsilon_1 = 1) for every distribution."""
    results = run_experiment("regression", quick=True)
    assert len(results.rows) == 25
    assert sum(row["false_pos"] for row in results.rows) <= 5
    for row in results.rows:
        assert 0 <= row["total_variation"] <= 1 and 0 <= row["allocated_mass"] <= 1.05
        assert row["fn_rate"] >= 0.1 or row["config"] == "sharp"  # v..9 values are never candidates
    by_case = {(r["distribution"], r["config"]): r for r in results.rows}
    for distribution in {r["distribution"] for r in results.rows}:
        assert by_case[distribution, "loose"]["detected"] >= by_case[distribution, "typical"]["detected"]


def test_detection_grows_with_the_number_of_reports() -> None:
    results = run_experiment("detection", quick=True)
    for distribution in ("zipf1.5", "exp"):
        rows = [r for r in results.rows if r["distribution"] == distribution]
        assert rows[-1]["detected"] >= rows[0]["detected"]
        assert rows[-1]["min_detectable_share"] < rows[0]["min_detectable_share"]
    assert sum(r["false_pos"] for r in results.rows) <= 2
