"""Counts drawn directly from the RAPPOR model, for power analysis, tests and benchmarks.

Exact in distribution for independent reports: cohorts are assigned
uniformly, values drawn from ``proportions`` within each cohort, and each
reported bit is 1 with probability ``q*`` where the value's Bloom bit is set
and ``p*`` where it is not. Uses NumPy's generator (not a CSPRNG): these are
simulations, never production reports.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams


def simulate_string_counts(
    params: StringParams,
    true_map: sp.spmatrix,
    proportions: np.ndarray,
    reports: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``(reports per cohort, ones per cohort and bit)`` for ``reports`` simulated reports.

    ``true_map`` is the candidate map (``m*k`` x values) of the true values and
    ``proportions`` their probabilities (summing to 1).
    """
    proportions = np.asarray(proportions, dtype=float)
    if true_map.shape != (params.m * params.k, proportions.size):
        raise ParameterError(
            "true_map",
            f"has shape {true_map.shape}; expected ({params.m * params.k}, {proportions.size})",
        )
    if np.any(proportions < 0) or not np.isclose(proportions.sum(), 1.0):
        raise ParameterError("proportions", "must be non-negative and sum to 1")
    p_star, q_star = params.effective_probs
    k, m = params.k, params.m
    per_cohort = rng.multinomial(reports, np.full(m, 1.0 / m))
    values = np.stack([rng.multinomial(n, proportions / proportions.sum()) for n in per_cohort])
    true_ones = true_bit_counts(true_map, values, k)
    zeros = per_cohort[:, None] - true_ones
    ones = rng.binomial(true_ones, q_star) + rng.binomial(zeros, p_star)
    return per_cohort.astype(np.int64), ones.astype(np.int64)


def true_bit_counts(true_map: sp.spmatrix, values: np.ndarray, k: int) -> np.ndarray:
    """Reports with each Bloom bit set, shape ``(m, k)``, from value counts per cohort.

    ``values[c, s]`` is how many reports in cohort ``c`` carry value ``s``.
    """
    csr = sp.csr_matrix(true_map)
    m = values.shape[0]
    row_of_entry = np.repeat(np.arange(m * k), np.diff(csr.indptr))
    weights = values[row_of_entry // k, csr.indices] * csr.data
    return np.bincount(row_of_entry, weights=weights, minlength=m * k).round().astype(np.int64).reshape(m, k)
