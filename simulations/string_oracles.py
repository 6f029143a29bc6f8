"""Vectorized (NumPy) encoders of the hashed string oracles, FLH and HCMS, with the SDK's law.

As the SDK (:mod:`veil.client.encoders.flh`, :mod:`veil.client.encoders.hcms`): each
installation's cohort is its hash function (uniform, as the SDK derives it from the
secret); the permanent response is drawn once per (installation, value) and the
instantaneous response for every report, with the realized probabilities
``numerator / 2**32`` drawn exactly. Randomness comes from a seeded
:class:`numpy.random.Generator`: reproducible, fast, and NOT for production.

:func:`report_counts` draws a population's whole statistic (the counts per cohort and
payload) for one report per installation, from arrays only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.server.analysis.string_oracles import candidate_buckets, candidate_keys
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.simulations.encoders import SimulatedReports, _client_cohorts, simulates
from veil.simulations.encoding import memo_rows
from veil.simulations.oracle_encoding import bernoulli, parity


def value_buckets(params: StringOracleParams, values: Sequence[str], cohorts: np.ndarray,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each report's bucket ``h_j(x)`` under its cohort's function, and each report's index
    among the distinct values."""
    distinct, index = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    index = index.reshape(-1)
    table = candidate_buckets(params, candidate_keys([str(v) for v in distinct]))
    return table[index, np.asarray(cohorts, dtype=np.int64)].astype(np.int64), index


def flh_payloads(params: FlhParams, own: np.ndarray, rng: np.random.Generator,
                 memo: tuple[np.ndarray, np.ndarray | None] | None = None) -> np.ndarray:
    """FLH payloads of reports whose value's bucket is ``own``: GRR over ``g`` once per
    (installation, value) (``memo``: :func:`~veil.simulations.encoding.memo_rows`; every
    report its own installation without), then the bucket kept w.p. ``lambda``, else uniform."""
    g = params.buckets
    first, shared = memo if memo is not None else (np.arange(own.size), None)
    kept = own[first]
    other = (kept + 1 + rng.integers(0, g - 1, size=kept.size)) % g
    permanent = np.where(bernoulli(params.prr_numerator, kept.size, rng), kept, other)
    permanent = permanent if shared is None else permanent[shared]
    fresh = rng.integers(0, g, size=permanent.size)
    out: np.ndarray = np.where(bernoulli(params.irr_numerator, permanent.size, rng), permanent,
                               fresh)
    return out


def hcms_payloads(params: HcmsParams, column: np.ndarray, rng: np.random.Generator,
                  memo: tuple[np.ndarray, np.ndarray | None] | None = None) -> np.ndarray:
    """HCMS payloads ``2 l + bit`` of reports whose value's column is ``column``: a uniform
    coefficient and the Hadamard sign's parity kept w.p. ``a``, once per (installation,
    value), then the bit kept w.p. ``lambda``, else a fair coin."""
    first, shared = memo if memo is not None else (np.arange(column.size), None)
    coefficient = rng.integers(0, params.columns, size=first.size)
    sign = parity(coefficient & column[first])
    bit = np.where(bernoulli(params.prr_numerator, first.size, rng), sign, 1 - sign)
    permanent = 2 * coefficient + bit
    permanent = permanent if shared is None else permanent[shared]
    coin = rng.integers(0, 2, size=permanent.size)
    out: np.ndarray = np.where(bernoulli(params.irr_numerator, permanent.size, rng), permanent,
                               (permanent & ~1) | coin)
    return out


def _payloads(params: StringOracleParams, own: np.ndarray, rng: np.random.Generator,
              memo: tuple[np.ndarray, np.ndarray | None] | None = None) -> np.ndarray:
    if isinstance(params, FlhParams):
        return flh_payloads(params, own, rng, memo)
    assert isinstance(params, HcmsParams)
    return hcms_payloads(params, own, rng, memo)


@simulates(FlhParams)
def simulate_flh(params: FlhParams, values: Sequence[str], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports:
    """FLH reports (buckets) of string ``values`` (:func:`flh_payloads`)."""
    cohorts = _client_cohorts(params, len(values), rng, clients)
    own, index = value_buckets(params, values, cohorts)
    out = flh_payloads(params, own, rng, memo_rows(clients, index))
    return SimulatedReports(cohorts, out.tolist())


@simulates(HcmsParams)
def simulate_hcms(params: HcmsParams, values: Sequence[str], rng: np.random.Generator,
                  clients: np.ndarray | None = None) -> SimulatedReports:
    """HCMS reports ``2 l + bit`` of string ``values`` (:func:`hcms_payloads`)."""
    cohorts = _client_cohorts(params, len(values), rng, clients)
    column, index = value_buckets(params, values, cohorts)
    out = hcms_payloads(params, column, rng, memo_rows(clients, index))
    return SimulatedReports(cohorts, out.tolist())


def report_counts(params: StringOracleParams, keys: np.ndarray, counts: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """The ``responses`` statistic (cohorts x payloads) of ``counts[i]`` installations of the
    value whose key is ``keys[i]``, one report each: the reports drawn as above, in
    memory only as arrays, and counted."""
    index = np.repeat(np.arange(keys.size), np.asarray(counts, dtype=np.int64))
    cohorts = rng.integers(0, params.hash_functions, size=index.size)
    table = candidate_buckets(params, keys)
    own = table[index, cohorts].astype(np.int64)
    payloads = _payloads(params, own, rng)
    flat = np.bincount(cohorts * params.responses + payloads,
                       minlength=params.hash_functions * params.responses)
    out: np.ndarray = flat.reshape(params.hash_functions, params.responses)
    return out


__all__ = ["flh_payloads", "hcms_payloads", "report_counts", "simulate_flh", "simulate_hcms",
           "value_buckets"]
