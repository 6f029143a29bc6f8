"""The FLH and HCMS decoders state honest errors under the population estimand.

Populations are drawn with the simulation encoders' law (:func:`report_counts`, one
report per installation, each installation's value a fresh draw from the population
and its cohort uniform), seeded. Over ``ROUNDS`` replications the z-scores ``(estimate -
share) / stated SE`` of every candidate, nulls included, are pooled. Tolerances, from
the variance of the statistics checked: the pooled z variance within ``4 sqrt(2 / n)``
of 1 (``n`` z-scores; the variance of a sample variance of normals is ``2 / n``) and
never beyond the issue's 10% on the SE; the 95% intervals' coverage within 4 binomial
standard errors ``sqrt(0.95 x 0.05 / n)`` of 0.95; the nulls' one-sided p-values
uniform by Kolmogorov-Smirnov at ``p >= 0.01``. With 43 candidates and one holding 40% of
the reports, collisions are large against the noise, so these also check that the
collision solve removes their bias.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis.string_oracles import StringOracleDecoder, candidate_keys
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.simulations.string_oracles import report_counts

ROUNDS = 60
REPORTS = 40_000
HEAVY = {"a.example": 0.4, "b.example": 0.2, "c.example": 0.1}
NULLS = [f"null{i}.example" for i in range(40)]
OTHERS = 0.3  # held by values outside the candidate list, spread over 200 of them

CASES = [FlhParams(epsilon=2.0, functions=1024), FlhParams(epsilon=4.0, report_epsilon=2.0,
                                                           functions=1024),
         HcmsParams(epsilon=2.0, rows=256, columns=32)]


def replications(params: StringOracleParams, seed: int) -> tuple[np.ndarray, np.ndarray,
                                                                  list[np.ndarray]]:
    """Per round, each candidate's z-score and coverage, and the nulls' p-values."""
    rng = np.random.default_rng(seed)
    names = [*HEAVY, *NULLS]
    outside = [f"other{i}.example" for i in range(200)]
    keys = candidate_keys(names + outside)
    shares = np.array([*HEAVY.values(), *[0.0] * len(NULLS), *[OTHERS / 200] * 200])
    truth = shares[: len(names)]
    zs, p_nulls = [], []
    for _ in range(ROUNDS):
        counts = rng.multinomial(REPORTS, shares)
        decoder = StringOracleDecoder(params).fit(report_counts(params, keys, counts, rng), names)
        zs.append((decoder.proportions_ - truth) / decoder.std_errors_)
        p_nulls.append(decoder.p_values_[len(HEAVY):])
    z = np.concatenate(zs)
    return z, np.abs(z) <= 1.959964, p_nulls


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p.oracle}-{p.epsilon:g}")
def test_stated_errors_match_the_spread_and_intervals_cover(params: StringOracleParams) -> None:
    z, covered, _ = replications(params, 1)
    n = z.size
    assert abs(z.var() - 1) <= min(4 * math.sqrt(2 / n), 0.21), z.var()
    assert abs(z.mean()) <= 4 / math.sqrt(n) * 1.5, z.mean()  # correlated across candidates
    assert abs(covered.mean() - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / n), covered.mean()


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p.oracle}-{p.epsilon:g}")
def test_null_candidates_p_values_are_uniform(params: StringOracleParams) -> None:
    _, _, p_nulls = replications(params, 2)
    pooled = np.concatenate(p_nulls)[:1000]
    assert stats.kstest(pooled, "uniform").pvalue >= 0.01


def test_the_collision_solve_removes_what_a_heavy_value_adds_to_the_others() -> None:
    params = FlhParams(epsilon=4.0, report_epsilon=4.0, functions=16)
    rng = np.random.default_rng(3)
    names = ["heavy.example", *NULLS]
    keys = candidate_keys(names)
    counts = np.array([1_000_000, *[0] * len(NULLS)])
    decoder = StringOracleDecoder(params).fit(report_counts(params, keys, counts, rng), names)
    before = decoder.uncorrected_[1:] / decoder.std_errors_[1:]
    after = decoder.proportions_[1:] / decoder.std_errors_[1:]
    # with 16 functions a null shares the heavy value's bucket in several: far off before
    assert np.abs(before).max() > 10
    # after, the nulls' z-scores are standard normal draws: none beyond 4.5 of 40
    assert np.abs(after).max() < 4.5


@pytest.mark.parametrize("params", [FlhParams(epsilon=2.0, functions=64),
                                    HcmsParams(epsilon=2.0, rows=64, columns=8)],
                         ids=["flh", "hcms"])
def test_the_exact_law_of_one_report_matches_the_encoders(params: StringOracleParams) -> None:
    """:func:`report_law` (the calibration grid's one-draw sampler) against 400,000 reports
    drawn with the simulation encoders' law: each cell's count within 4.5 of its binomial
    standard errors ``sqrt(N p (1 - p))`` of ``N p`` (Bonferroni over the cells, 5e-3 in
    all), and the law sums to 1."""
    from veil.simulations.string_oracles import report_law

    rng = np.random.default_rng(11)
    names = [f"{i}.example" for i in range(6)]
    shares = np.array([0.4, 0.25, 0.15, 0.1, 0.1, 0.0])
    reports = 400_000
    law = report_law(params, candidate_keys(names), shares)
    assert law.shape == (params.hash_functions, params.responses)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    drawn = report_counts(params, candidate_keys(names), rng.multinomial(reports, shares), rng)
    expected = reports * law
    z = (drawn - expected) / np.sqrt(expected * (1 - law))
    assert np.abs(z).max() < 4.5, np.abs(z).max()


def test_the_row_transform_is_the_walsh_hadamard_transform() -> None:
    """The decoder's butterflies over all rows give :func:`walsh_hadamard` row by row,
    exactly (integer counts in float64)."""
    from veil.server.analysis.stats import walsh_hadamard, walsh_hadamard_rows

    rng = np.random.default_rng(5)
    for width in (2, 16, 1024):
        table = rng.integers(-1000, 1000, size=(9, width)).astype(float)
        want = np.stack([walsh_hadamard(row, np.float64) for row in table])
        assert np.array_equal(walsh_hadamard_rows(table), want)


def test_a_small_list_solves_as_the_dense_collision_system() -> None:
    """The collision solve (scatter and gather through flat cell indices, conjugate
    gradients) agrees with ``numpy.linalg.solve`` of the dense system built from the
    candidates' buckets, to the solver's tolerance."""
    from veil.server.analysis.string_oracles import SOLVE_TOLERANCE, candidate_buckets

    params = FlhParams(epsilon=2.0, functions=512)
    rng = np.random.default_rng(3)
    names = [*HEAVY, *NULLS[:10]]
    shares = np.array([*HEAVY.values(), *[0.03] * 10])
    counts = report_counts(params, candidate_keys(names), rng.multinomial(50_000, shares), rng)
    fitted = StringOracleDecoder(params).fit(counts, names)
    buckets = candidate_buckets(params, candidate_keys(names)).astype(np.int64)
    weights = counts.sum(axis=1) / counts.sum()
    same = buckets[:, None, :] == buckets[None, :, :]
    width = params.buckets
    system = ((same * weights).sum(axis=2) - 1 / width) / (1 - 1 / width)
    want = np.linalg.solve(system, fitted.uncorrected_)
    assert np.abs(fitted.proportions_ - want).max() <= 10 * SOLVE_TOLERANCE * np.linalg.norm(want)


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p.oracle}-{p.epsilon:g}")
def test_all_candidates_ranks_every_candidate_by_its_evidence(params: StringOracleParams,
                                                              ) -> None:
    """``--all`` was ignored for FLH and HCMS: the table listed the detected strings only."""
    rng = np.random.default_rng(4)
    names = [*HEAVY, *NULLS]
    keys = candidate_keys(names)
    counts = rng.multinomial(REPORTS, np.array([*HEAVY.values(), *[0.3 / 40] * 40]))
    table = report_counts(params, keys, counts, rng)
    detected = StringOracleDecoder(params).fit(table, names)
    every = StringOracleDecoder(params, all_candidates=True).fit(table, names)
    rows = every.result_.rows
    assert sorted(row["value"] for row in rows) == sorted(names)
    assert [row["rank"] for row in rows] == list(range(1, len(names) + 1))
    z = [row["proportion"] / row["prop_std_error"] for row in rows]
    assert z == sorted(z, reverse=True)
    assert {row["value"] for row in rows if row["detected"]} == {
        row["value"] for row in detected.result_.rows}
    assert set(HEAVY) <= {row["value"] for row in rows[:3]}
