"""The joint decoder's honesty: the independence test's null distribution and power, the
errors of the marginals and conditionals against their observed spread, the simplex
projection, and the outputs (tidy rows, conditional table, records, heatmap).

Counts are drawn with the cell oracle's exact statistic sampler
(:func:`~veil.simulations.oracle_encoding.simulate_oracle_counts`), seeded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import kstest

from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.files import write_outputs
from veil.server.analysis.joint import JointResult
from veil.server.analysis.joint_tests import project_to_simplex
from veil.shared.kinds import JointParams
from veil.simulations.association_experiment import joint_document, joint_params

ROWS = np.array([0.5, 0.3, 0.2])
CONDITIONALS = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.2, 0.7]])


def decode(params: JointParams, table: np.ndarray, n: int, rng: np.random.Generator,
           ) -> JointResult:
    result = decode_counts(joint_document(params, rng.multinomial(n, table.reshape(-1)), rng))
    assert isinstance(result, JointResult)
    return result


@pytest.mark.parametrize("epsilon", [1.0, 4.0])  # OLH at 1, GRR at 4 (auto over 16 cells)
def test_independence_p_values_are_uniform_under_independence(epsilon: float) -> None:
    """300 tables of two independent variables (fresh Dirichlet marginals each): the KS test
    of the p-values against the uniform law must not reject at 1%. A test that ignored the
    randomization's covariance (a plain chi-square on the estimated counts) rejects nearly
    always here."""
    params = joint_params(epsilon, (4, 4))
    rng = np.random.default_rng(11)
    p_values = []
    for _ in range(300):
        truth = np.outer(rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4)))
        p_values.append(decode(params, truth, 50_000, rng).summary["independence"]["p_value"])
    assert kstest(p_values, "uniform").pvalue >= 0.01


def test_the_test_has_power_against_dependence() -> None:
    """A 3 x 3 table whose conditionals differ (0.6 / 0.2 / 0.1 for the first value) at
    epsilon 1 and 20,000 reports: rejected at 5% in at least 45 of 50 runs."""
    params = joint_params(1.0, (3, 3))
    rng = np.random.default_rng(12)
    table = ROWS[:, None] * CONDITIONALS
    rejected = sum(decode(params, table, 20_000, rng).summary["independence"]["p_value"] < 0.05
                   for _ in range(50))
    assert rejected >= 45


def test_marginal_and_conditional_errors_match_their_spread() -> None:
    """400 collections at epsilon 2 (OLH over 9 cells, its default report_epsilon): the
    root-mean-square stated standard error of each marginal and conditional within 10% of the
    observed standard deviation, up to 3 Monte Carlo errors (``sqrt(1 / (2 (runs - 1)))``,
    the relative error of a sample standard deviation), and 95% intervals covering within
    3 binomial errors of 93-97%."""
    params = JointParams(of=("x", "y"), domains=(("a", "b", "c"), ("u", "v", "w")), epsilon=2.0)
    rng = np.random.default_rng(13)
    table = ROWS[:, None] * CONDITIONALS
    truth = np.concatenate([ROWS, table.sum(axis=0), CONDITIONALS.reshape(-1)])
    runs = 400
    estimates, errors = np.zeros((runs, truth.size)), np.zeros((runs, truth.size))
    for run in range(runs):
        result = decode(params, table, 100_000, rng)
        estimates[run] = [*(m["proportion"] for m in result.marginal_rows),
                          *(c["conditional"] for c in result.conditional_rows)]
        errors[run] = [*(m["prop_std_error"] for m in result.marginal_rows),
                       *(c["std_error"] for c in result.conditional_rows)]
    ratio = np.sqrt((errors**2).mean(axis=0)) / estimates.std(axis=0, ddof=1)
    allowance = 3 / math.sqrt(2 * (runs - 1))
    assert np.all(np.abs(ratio - 1) <= 0.10 + allowance), ratio
    coverage = (np.abs(estimates - truth) <= 1.959964 * errors).mean(axis=0)
    binomial = 3 * math.sqrt(0.95 * 0.05 / runs)
    assert np.all((coverage >= 0.93 - binomial) & (coverage <= 0.97 + binomial)), coverage


def test_the_consistent_table_is_the_simplex_projection_and_closer_to_the_truth() -> None:
    assert project_to_simplex(np.array([0.5, 0.6, -0.2])) == pytest.approx([0.45, 0.55, 0.0])
    params = joint_params(1.0, (10, 10))
    rng = np.random.default_rng(14)
    table = np.outer(np.arange(1, 11) ** -1.1, np.ones(10))
    table /= table.sum()
    gains = []
    for _ in range(10):
        result = decode(params, table, 100_000, rng)
        consistent = np.array(result.column("consistent"))
        unbiased = np.array(result.column("proportion"))
        assert consistent.min() >= 0 and consistent.sum() == pytest.approx(1.0)
        gains.append(np.abs(unbiased - table.reshape(-1)).sum()
                     - np.abs(consistent - table.reshape(-1)).sum())
    assert np.mean(gains) > 0


def test_a_thousand_by_ten_table_decodes_in_cells_time_and_tests_by_conjugate_gradients(
) -> None:
    params = JointParams(of=("page", "country"),
                         domains=(tuple(f"p{i}" for i in range(1000)),
                                  tuple(f"c{i}" for i in range(10))), epsilon=4.0)
    rng = np.random.default_rng(15)
    table = np.outer(np.arange(1, 1001) ** -1.1, np.ones(10))
    result = decode(params, table / table.sum(), 1_000_000, rng)
    test = result.summary["independence"]
    assert test["dof"] == 999 * 9 and "conjugate gradients" in test["method"]
    assert 0.0 < test["p_value"] <= 1.0 and len(result.rows) == 10_000


def test_outputs_tidy_rows_conditionals_records_and_heatmap(tmp_path) -> None:
    params = JointParams(of=("browser", "estimate"),
                         domains=(("chrome", "firefox", "safari"), "boolean"), epsilon=4.0)
    rng = np.random.default_rng(16)
    table = np.array([[0.27, 0.03], [0.14, 0.06], [0.25, 0.25]])
    result = decode(params, table, 20_000, rng)
    assert result.columns[:4] == ("metric", "kind", "browser", "var_estimate")
    frame = result.to_pandas()
    assert list(frame["browser"]) == ["chrome", "chrome", "firefox", "firefox", "safari",
                                      "safari"]
    records = result.to_records()
    assert records["var_estimate"][1] == "true" and records["proportion"].dtype == np.float64
    conditional = result.conditional_to_pandas()
    assert list(conditional["given"].unique()) == ["browser=chrome", "browser=firefox",
                                                   "browser=safari"]
    sums = conditional.groupby("given")["conditional"].sum()
    assert np.allclose(sums, 1.0)  # ratios of one condition's cells to their sum
    assert set(result.marginals_to_pandas()["variable"]) == {"browser", "estimate"}
    paths = write_outputs(result, tmp_path)
    assert {"conditional", "marginals", "heatmap"} <= set(paths)
    assert paths["heatmap"].stat().st_size > 10_000


def test_an_estimator_the_joint_decoders_lack_is_refused_by_name() -> None:
    """IBU is the category and string decoders'; a joint metric (whole table or assigned
    marginals) used to return its unbiased table under estimator="ibu" without a word."""
    from veil.shared.errors import ParameterError
    from veil.simulations.calibration_joint import (
        latent_population,
        marginals_document,
        marginals_params,
    )

    rng = np.random.default_rng(4)
    table = np.full((3, 2), 1 / 6)
    whole = joint_document(joint_params(2.0, table.shape), rng.multinomial(600, table.ravel()),
                           rng)
    assigned = marginals_document(marginals_params(2.0), latent_population(), 600, rng)
    for document in (whole, assigned):
        with pytest.raises(ParameterError, match="unbiased estimator only") as refused:
            decode_counts(document, estimator="ibu")
        assert refused.value.field == "estimator"


def test_side_tables_name_their_intervals_for_the_confidence(tmp_path) -> None:
    """At confidence 0.9 every interval column is low_90/high_90, in the results and in
    conditional.csv and marginals.csv alike (they kept the 95 names before)."""
    import csv

    rng = np.random.default_rng(2)
    table = np.array([[0.3, 0.2], [0.1, 0.4]])
    params = joint_params(4.0, table.shape)
    result = decode_counts(joint_document(params, rng.multinomial(5000, table.ravel()), rng),
                           confidence=0.9)
    assert isinstance(result, JointResult)
    assert "prop_low_90" in result.columns
    assert {"low_90", "high_90"} <= set(result.conditional_to_pandas().columns)
    assert {"prop_low_90", "prop_high_90"} <= set(result.marginals_to_pandas().columns)
    write_outputs(result, tmp_path)
    for name, expected in (("conditional.csv", "low_90"), ("marginals.csv", "prop_low_90")):
        with open(tmp_path / name, newline="") as handle:
            header = next(csv.reader(handle))
        assert expected in header and not any("95" in column for column in header), header
    # and summary.json's marginals, which kept prop_low_95 at any confidence
    summary = (tmp_path / "summary.json").read_text()
    assert '"prop_low_90"' in summary and "_95" not in summary


def test_a_value_named_like_an_interval_key_keeps_its_name_at_any_confidence() -> None:
    """The summary's interval keys were renamed wherever they stood, so a value labelled
    'low_95' came out as 'low_90' at confidence 0.9."""
    rng = np.random.default_rng(3)
    params = JointParams(of=("x", "y"), domains=(("low_95", "high_95"), ("a", "b")),
                         epsilon=4.0, report_epsilon=4.0)
    result = decode_counts(joint_document(params, rng.multinomial(5000, [0.3, 0.2, 0.1, 0.4]),
                                          rng), confidence=0.9)
    marginal = result.summary["marginals"]["x"]
    assert set(marginal) == {"low_95", "high_95"}  # the values, as declared
    assert {"prop_low_90", "prop_high_90"} <= set(marginal["low_95"])
    assert result.summary["variables"]["x"] == ["low_95", "high_95"]
