"""IBU for FLH and HCMS strings (:mod:`veil.server.analysis.string_oracle_ibu`).

The HCMS design applied through the Walsh-Hadamard transform, and the observed
information formed from the weighted Gram matrix, are checked against the dense design
written out cell by cell. Honesty as for the unbiased decoder (test_string_oracles.py):
over ``ROUNDS`` populations drawn with the simulation encoders' law, the z-scores of the
three heavy strings (detected in every round) under IBU's stated standard errors have a
variance within ``4 sqrt(2 / n)`` of 1 (the variance of a sample variance of normals is
``2 / n``), a mean within ``4 / sqrt(n)`` (times 1.5: correlated within a round) of 0, and
their 95% intervals cover within 4 binomial standard errors
``sqrt(0.95 x 0.05 / n)`` of 0.95.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.analysis.test_string_oracles import CASES, HEAVY, NULLS, OTHERS, REPORTS
from veil.server.analysis.string_oracle_ibu import (
    HcmsDesign,
    observed_information,
    oracle_channel,
)
from veil.server.analysis.string_oracles import (
    StringOracleDecoder,
    candidate_buckets,
    candidate_keys,
)
from veil.server.analysis.strings import StringDecoder
from veil.shared.errors import ParameterError
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams, StringParams
from veil.simulations.string_oracles import report_counts

ROUNDS = 150


def dense_hcms(buckets: np.ndarray, columns: int) -> np.ndarray:
    """HCMS's design cell by cell: row ``j * 2m + 2l + bit`` is 1 for a string whose sign
    under coefficient ``l`` in function ``j`` is ``bit``."""
    strings, functions = buckets.shape
    out = np.zeros((functions * 2 * columns, strings))
    for x in range(strings):
        for j in range(functions):
            for coefficient in range(columns):
                bit = bin(coefficient & int(buckets[x, j])).count("1") & 1
                out[j * 2 * columns + 2 * coefficient + bit, x] = 1.0
    return out


def test_the_hcms_design_is_the_dense_one() -> None:
    rng = np.random.default_rng(0)
    buckets = rng.integers(0, 8, size=(5, 6))
    design, dense = HcmsDesign(buckets, 8), dense_hcms(buckets, 8)
    values, weights = rng.random((5, 3)), rng.random(dense.shape[0])
    assert np.allclose(design @ values, dense @ values)
    assert np.allclose(design @ values[:, 0], dense @ values[:, 0])
    assert np.allclose(design.T @ weights, dense.T @ weights)
    assert np.allclose(design.weighted_gram(weights), dense.T @ (weights[:, None] * dense))


@pytest.mark.parametrize("params", [FlhParams(epsilon=2.0, functions=6),
                                    HcmsParams(epsilon=2.0, rows=6, columns=8)],
                         ids=lambda p: p.oracle)
def test_the_information_is_the_sum_over_cells(params: StringOracleParams) -> None:
    names = [f"s{i}" for i in range(5)]
    buckets = candidate_buckets(params, candidate_keys(names)).astype(np.int64)
    channel = oracle_channel(params, buckets, 1000.0)
    design = (dense_hcms(buckets, params.buckets) if isinstance(params, HcmsParams)
              else np.asarray(channel.design.todense()))
    background = np.broadcast_to(np.asarray(channel.background_rate, dtype=float),
                                 (design.shape[0],))
    laws = channel.low + channel.spread * np.column_stack([design, background])
    # every component's law sums to 1 over the cells (the oracle's, per report)
    assert np.allclose(laws.sum(axis=0), 1.0)
    rng = np.random.default_rng(1)
    shares = rng.dirichlet(np.ones(6))
    counts = rng.multinomial(1000, laws @ shares).astype(float)
    rates = laws @ shares
    expected = (laws * (counts / rates**2)[:, None]).T @ laws
    assert np.allclose(observed_information(channel, counts, shares), expected)


def replications(params: StringOracleParams, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The heavy strings' z-scores under IBU's stated errors, and whether each interval
    holds the population's share."""
    rng = np.random.default_rng(seed)
    names = [*HEAVY, *NULLS]
    keys = candidate_keys(names + [f"other{i}.example" for i in range(200)])
    shares = np.array([*HEAVY.values(), *[0.0] * len(NULLS), *[OTHERS / 200] * 200])
    zs, covered = [], []
    for _ in range(ROUNDS):
        counts = rng.multinomial(REPORTS, shares)
        decoder = StringOracleDecoder(params, estimator="ibu").fit(
            report_counts(params, keys, counts, rng), names)
        rows = {row["string"]: row for row in decoder.result_.rows}
        total = sum(row["proportion"] for row in rows.values())
        assert total + decoder.summary_["ibu_background_share"] == pytest.approx(1.0)
        for name, share in HEAVY.items():
            row = rows[name]
            assert row["proportion"] >= 0
            zs.append((row["proportion"] - share) / row["prop_std_error"])
            covered.append(row["prop_low_95"] <= share <= row["prop_high_95"])
    return np.array(zs), np.array(covered)


@pytest.mark.parametrize("params", CASES, ids=lambda p: f"{p.oracle}-{p.epsilon:g}")
def test_ibu_states_honest_errors_and_its_intervals_cover(params: StringOracleParams) -> None:
    z, covered = replications(params, 1)
    n = z.size
    assert abs(z.var() - 1) <= 4 * math.sqrt(2 / n), z.var()
    # IBU is biased; at these shares its bias is small against the stated error (the mean of
    # n z-scores of unit variance within 4 / sqrt(n), 1.5 times that as the three strings'
    # z-scores in one round are correlated through the shared reports)
    assert abs(z.mean()) <= 4 / math.sqrt(n) * 1.5, z.mean()
    assert abs(covered.mean() - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / n), covered.mean()


def test_an_unknown_estimator_is_refused_by_name() -> None:
    params = FlhParams(epsilon=2.0, functions=16)
    with pytest.raises(ParameterError) as refused:
        StringOracleDecoder(params, estimator="em").fit(np.ones((16, params.buckets)), ["a"])
    assert refused.value.field == "estimator"
    # the Bloom decoder too: "IBU" from Python ran the unbiased estimator
    with pytest.raises(ParameterError) as refused:
        StringDecoder(StringParams(k=8, h=1, m=2), estimator="IBU").fit(
            np.array([10, 10]), np.full((2, 8), 5), ["a"])
    assert refused.value.field == "estimator"


def test_nothing_detected_leaves_the_table_empty() -> None:
    params = FlhParams(epsilon=2.0, functions=16)
    decoder = StringOracleDecoder(params, estimator="ibu").fit(
        np.full((16, params.buckets), 5), ["a", "b"])
    assert decoder.result_.rows == [] and "ibu_steps" not in decoder.summary_
