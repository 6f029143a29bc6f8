"""Vectorized (NumPy) encoders of the hashed string oracles, FLH and HCMS, with the SDK's law.

As the SDK (:mod:`veil.client.encoders.flh`, :mod:`veil.client.encoders.hcms`): each
installation's cohort is its hash function (uniform, as the SDK derives it from the
secret); the permanent response is drawn once per (installation, value) and the
instantaneous response for every report, with the realized probabilities
``numerator / 2**32`` drawn exactly. Randomness comes from a seeded
:class:`numpy.random.Generator`: reproducible, fast, and NOT for production.

:func:`report_counts` draws a population's whole statistic (the counts per cohort and
payload) for one report per installation, from arrays only; :func:`report_law` gives the
exact law of one report of a value drawn from given shares, so that the statistic of ``N``
such installations is one ``Multinomial(N, law)`` draw (:func:`draw_statistic`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from veil.server.analysis.stats import walsh_hadamard_rows
from veil.server.analysis.string_oracles import candidate_buckets, candidate_keys
from veil.shared.faces import FaceRegistry
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.shared.kinds.base import implements
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


#: each string oracle's payload sampler (``params, own buckets, rng, memo -> payloads``)
PAYLOADS: FaceRegistry[Callable[..., np.ndarray]] = FaceRegistry("string oracle payloads")
#: each string oracle's law of one report's (cohort, payload) cell, from ``held[j, b]``
LAWS: FaceRegistry[Callable[[Any, np.ndarray], np.ndarray]] = FaceRegistry(
    "string oracle report law")


@implements(FlhParams, PAYLOADS)
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


@implements(HcmsParams, PAYLOADS)
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
    return PAYLOADS.lookup(params.mechanism_name)(params, own, rng, memo)


def _simulate(params: StringOracleParams, values: Sequence[str], rng: np.random.Generator,
              clients: np.ndarray | None = None) -> SimulatedReports:
    """Reports of string ``values``: each installation's cohort, then its oracle's payloads
    (:data:`PAYLOADS`) of the value's bucket under the cohort's function."""
    cohorts = _client_cohorts(params, len(values), rng, clients)
    own, index = value_buckets(params, values, cohorts)
    return SimulatedReports(cohorts, _payloads(params, own, rng, memo_rows(clients, index)).tolist())


@simulates(FlhParams)
def simulate_flh(params: FlhParams, values: Sequence[str], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports:
    """FLH reports (buckets) of string ``values`` (:func:`flh_payloads`)."""
    return _simulate(params, values, rng, clients)


@simulates(HcmsParams)
def simulate_hcms(params: HcmsParams, values: Sequence[str], rng: np.random.Generator,
                  clients: np.ndarray | None = None) -> SimulatedReports:
    """HCMS reports ``2 l + bit`` of string ``values`` (:func:`hcms_payloads`)."""
    return _simulate(params, values, rng, clients)


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


def report_law(params: StringOracleParams, keys: np.ndarray, shares: np.ndarray,
               ) -> np.ndarray:
    """The probability of each (cohort, payload) cell (cohorts x payloads, summing to 1) for
    one report of a value drawn with ``shares`` (summing to 1) over the values whose keys are
    ``keys``: the cohort uniform, then the SDK's two responses, composed. With ``held[j, b]``
    the share of values that function ``j`` sends to bucket ``b``: FLH's cell is ``(P0 +
    (P1 - P0) held[j, b]) / F``; HCMS's ``(2 l + bit)`` is ``((1 - P) + (2P - 1) (1 +- W[j,
    l]) / 2) / (F m)``, ``W`` the rows' Walsh-Hadamard transform of ``held`` (``+`` for bit 0,
    the share of values whose sign under coefficient ``l`` is +1)."""
    functions, width = params.hash_functions, params.buckets
    table = candidate_buckets(params, keys).astype(np.int64)
    held = np.zeros((functions, width))
    np.add.at(held, (np.broadcast_to(np.arange(functions), table.shape), table),
              np.broadcast_to(np.asarray(shares, dtype=float)[:, None], table.shape))
    return LAWS.lookup(params.mechanism_name)(params, held) / functions



@implements(FlhParams, LAWS)
def flh_law(params: FlhParams, held: np.ndarray) -> np.ndarray:
    """FLH's cell ``(j, b)`` given function ``j``: ``P0 + (P1 - P0) held[j, b]``."""
    p1, p0 = params.bucket_probs
    out: np.ndarray = p0 + (p1 - p0) * held
    return out


@implements(HcmsParams, LAWS)
def hcms_law(params: HcmsParams, held: np.ndarray) -> np.ndarray:
    """HCMS's cell ``(j, 2 l + bit)`` given row ``j``: ``((1 - P) + (2P - 1) (1 +- W[j, l])
    / 2) / m``, ``W`` the rows' Walsh-Hadamard transform of ``held``."""
    kept = params.bit_kept
    plus = (1 + walsh_hadamard_rows(held)) / 2
    law = np.empty((held.shape[0], 2 * held.shape[1]))
    law[:, 0::2] = (1 - kept) + (2 * kept - 1) * plus
    law[:, 1::2] = (1 - kept) + (2 * kept - 1) * (1 - plus)
    out: np.ndarray = law / held.shape[1]
    return out

def draw_statistic(law: np.ndarray, reports: int, rng: np.random.Generator) -> np.ndarray:
    """The ``responses`` statistic of ``reports`` installations whose values are drawn from
    the population of :func:`report_law` (one report each): ``Multinomial(reports, law)``,
    exact, since each report's (cohort, payload) is an independent draw from ``law``."""
    flat = np.clip(law.reshape(-1), 0.0, None)
    out: np.ndarray = rng.multinomial(reports, flat / flat.sum()).reshape(law.shape)
    return out


__all__ = ["draw_statistic", "flh_payloads", "hcms_payloads", "report_counts", "report_law",
           "simulate_flh", "simulate_hcms", "value_buckets"]
