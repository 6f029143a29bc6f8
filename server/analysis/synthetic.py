"""Counts drawn directly from the RAPPOR model, for power analysis, tests, benchmarks and simulations.

Exact in distribution, without a report matrix. Given the Bloom filters of a
cohort's clients, report bits are independent across bits and reports, and a
bit reads 1 with probability ``q*`` when its Bloom bit is set and ``p*``
otherwise; so with ``A`` clients of cohort ``c`` whose Bloom bit ``i`` is set
among ``N_c``, the count of ones is exactly ``Binomial(A, q*) + Binomial(N_c - A, p*)``,
independently for every ``(c, i)``. With ``r`` reports per client of one value
the PRR is drawn once per client (``Binomial(A, 1 - f/2) + Binomial(N_c - A, f/2)``
PRR ones), then the ``r`` IRRs of every client: ``Binomial(r X, q) + Binomial(r (N_c - X), p)``.
Uses NumPy's generator (not a CSPRNG): these are simulations, never production reports.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from veil.shared.bits import realized
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams
from veil.shared.kinds.string import RapporBits


def simulate_string_counts(
    params: StringParams,
    true_map: sp.spmatrix,
    proportions: np.ndarray,
    reports: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``(reports per cohort, ones per cohort and bit)`` for ``reports`` simulated reports.

    ``true_map`` is the candidate map (``m*k`` x values) of the true values and
    ``proportions`` their probabilities (summing to 1); cohorts are uniform.
    """
    proportions = np.asarray(proportions, dtype=float)
    if true_map.shape != (params.m * params.k, proportions.size):
        raise ParameterError(
            "true_map",
            f"has shape {true_map.shape}; expected ({params.m * params.k}, {proportions.size})",
        )
    if np.any(proportions < 0) or not np.isclose(proportions.sum(), 1.0):
        raise ParameterError("proportions", "must be non-negative and sum to 1")
    per_cohort = rng.multinomial(reports, np.full(params.m, 1.0 / params.m))
    values = np.stack([rng.multinomial(n, proportions / proportions.sum()) for n in per_cohort])
    ones = draw_bit_counts(params, true_bit_counts(true_map, values, params.k), per_cohort, rng)
    return per_cohort.astype(np.int64), ones.astype(np.int64)


def string_counts_from_values(
    params: StringParams,
    true_map: sp.spmatrix,
    cohort_values: np.ndarray,
    rng: np.random.Generator,
    reports_per_client: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """``(reports per cohort, ones per cohort and bit)`` when ``cohort_values[c, v]`` clients
    of cohort ``c`` hold value ``v`` (column ``v`` of ``true_map``), each reporting it
    ``reports_per_client`` times."""
    m, n_values = cohort_values.shape
    if true_map.shape != (m * params.k, n_values):
        raise ParameterError(
            "cohort_values",
            f"has shape {cohort_values.shape}: need a row per cohort and a column per value "
            f"of the map (shape {true_map.shape}, k={params.k})",
        )
    values = cohort_values.astype(np.int64)
    clients = values.sum(axis=1)
    true_ones = true_bit_counts(true_map, values, params.k)
    ones = draw_bit_counts(params, true_ones, clients, rng, reports_per_client)
    return clients * reports_per_client, ones


def true_bit_counts(true_map: sp.spmatrix, values: np.ndarray, k: int) -> np.ndarray:
    """Reports with each Bloom bit set, shape ``(m, k)``, from value counts per cohort.

    ``values[c, s]`` is how many reports in cohort ``c`` carry value ``s``.
    """
    csr = sp.csr_matrix(true_map)
    m = values.shape[0]
    row_of_entry = np.repeat(np.arange(m * k), np.diff(csr.indptr))
    weights = values[row_of_entry // k, csr.indices] * csr.data
    counts = np.bincount(row_of_entry, weights=weights, minlength=m * k)
    return counts.round().astype(np.int64).reshape(m, k)


def draw_bit_counts(
    params: RapporBits,
    true_ones: np.ndarray,
    clients: np.ndarray,
    rng: np.random.Generator,
    reports_per_client: int = 1,
) -> np.ndarray:
    """Exact draw of the ones counts given ``true_ones[c, i]`` clients with bit ``i`` set.

    ``clients[c]`` clients in cohort ``c`` each send ``reports_per_client``
    reports of their value (see the module docstring for why this is exact).
    """
    totals = np.broadcast_to(np.asarray(clients)[:, None], true_ones.shape)
    if reports_per_client == 1:
        p_star, q_star = params.effective_probs
        ones: np.ndarray = rng.binomial(true_ones, q_star) + rng.binomial(totals - true_ones, p_star)
        return ones
    f = realized(params.f)
    prr_ones = rng.binomial(true_ones, 1 - f / 2) + rng.binomial(totals - true_ones, f / 2)
    r = reports_per_client
    p, q = realized(params.p), realized(params.q)
    ones = rng.binomial(r * prr_ones, q) + rng.binomial(r * (totals - prr_ones), p)
    return ones
