"""Vectorized (NumPy) encoders of the category frequency oracles, with the SDK's law.

Each oracle (:mod:`veil.shared.kinds.oracles`) reports a category in two steps,
simulated here exactly as the parameter classes define them, with the realized
probabilities ``numerator / 2**32`` drawn exactly (a uniform 32-bit integer below
the numerator; bit vectors through :func:`~veil.simulations.encoding.bernoulli_words`):

1. the permanent response, once per (installation, value): with ``clients`` given,
   the reports of one installation and value share it; without, every report is
   its own installation;
2. the instantaneous response, fresh for every report.

Payloads are what the SDK sends: the integer response (GRR, OLH, Hadamard) or
``d`` bits as hex (OUE).

:func:`simulate_oracle_counts` draws a whole population's statistic (the
``responses`` counts vector, or OUE's set-bit counts) directly, for one report per
installation, without building the reports; its docstring says why each
sampler has exactly the law of the statistic of encoded reports.

Randomness comes from a seeded :class:`numpy.random.Generator`: reproducible,
fast, and NOT for production.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from veil.server.counts import counts_document
from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds import GrrParams, HadamardParams, OlhParams, OracleParams, OueParams
from veil.shared.kinds.base import implements
from veil.shared.kinds.oracles.olh import bucket_channel
from veil.simulations.encoding import (
    CHUNK_ROWS,
    bernoulli_words,
    check_indices,
    memo_rows,
    pack_indices,
    random_words,
    valid_mask,
)

#: draws made at once by the direct samplers (bounds their memory to some tens of MB)
CHUNK_DRAWS = 1 << 20

#: a direct sampler: ``(params, true_counts, rng) -> the statistic's counts vector``
Sampler = Callable[[Any, np.ndarray, np.random.Generator], np.ndarray]
#: the direct sampler of each oracle's statistic (:func:`simulate_oracle_counts`), keyed by
#: its parameter class's ``mechanism_name``
COUNT_SAMPLERS: FaceRegistry[Sampler] = FaceRegistry("direct sampler of the statistic")


def bernoulli(numerator: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent Bernoulli(``numerator / 2**32``) booleans, exactly."""
    draws: np.ndarray = rng.integers(0, PROB_ONE, size=size, dtype=np.uint64) < np.uint64(
        max(0, min(numerator, PROB_ONE)))
    return draws


def olh_hash(params: OlhParams, functions: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``h_a(x) = sum_i a_i x_i mod g`` element-wise (digit ``i`` the ``i``-th least significant)."""
    g = params.buckets
    a = np.asarray(functions, dtype=np.int64).copy()
    x = np.broadcast_to(np.asarray(indices, dtype=np.int64), a.shape).copy()
    total = np.zeros(a.shape, dtype=np.int64)
    for _ in range(params.digits):
        total += (a % g) * (x % g)
        a //= g
        x //= g
    out: np.ndarray = total % g
    return out


def parity(values: np.ndarray) -> np.ndarray:
    """``popcount(v) mod 2`` element-wise, for non-negative integers below ``2**32``."""
    v = np.asarray(values, dtype=np.int64).copy()
    for shift in (16, 8, 4, 2, 1):
        v ^= v >> shift
    out: np.ndarray = v & 1
    return out


def hadamard_draw(params: HadamardParams, indices: np.ndarray, inside: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """A uniform response inside (where ``inside``) or outside the set of each category.

    A uniform ``y`` in ``[0, K)`` on the wrong side is moved across by flipping the lowest
    set bit of ``x + 1`` (which flips the parity of ``popcount((x + 1) & y)``): a bijection
    between the set and its complement, so the result is uniform on the chosen side.
    """
    row = np.asarray(indices, dtype=np.int64) + 1
    y = rng.integers(0, params.size, size=row.shape, dtype=np.int64)
    wrong = (parity(row & y) == 0) != np.asarray(inside, dtype=bool)
    out: np.ndarray = np.where(wrong, y ^ (row & -row), y)
    return out


# ---------------------------------------------------------------- per-report encoders


def _permanent_then_instant(values: np.ndarray, clients: np.ndarray | None,
                            permanent: Any, instant: Any) -> np.ndarray:
    """``instant(permanent(values of each (client, value) pair)[pair of each report])``."""
    first, memo = memo_rows(clients, values)
    responses = permanent(values[first])
    out: np.ndarray = instant(responses if memo is None else responses[memo])
    return out


def encode_grr(params: GrrParams, values: np.ndarray, rng: np.random.Generator,
               clients: np.ndarray | None = None) -> np.ndarray:
    """GRR payloads (category indices) of category indices ``values``.

    Permanent: the category w.p. ``a``, else one of the other ``d - 1`` uniformly.
    Instantaneous: kept w.p. ``lambda``, else uniform over all ``d``.
    """
    values, d = check_indices(values, params.d), params.d

    def permanent(x: np.ndarray) -> np.ndarray:
        other = (x + 1 + rng.integers(0, d - 1, size=x.size)) % d
        out: np.ndarray = np.where(bernoulli(params.prr_numerator, x.size, rng), x, other)
        return out

    def instant(kept: np.ndarray) -> np.ndarray:
        fresh = rng.integers(0, d, size=kept.size)
        out: np.ndarray = np.where(bernoulli(params.irr_numerator, kept.size, rng), kept, fresh)
        return out

    return _permanent_then_instant(values, clients, permanent, instant)


def encode_olh(params: OlhParams, values: np.ndarray, rng: np.random.Generator,
               clients: np.ndarray | None = None) -> np.ndarray:
    """OLH payloads ``a * g + bucket`` of category indices ``values``.

    Permanent: a uniform function ``a`` and the bucket ``h_a(x)`` through GRR over ``g``
    (kept w.p. ``a``, else one of the other ``g - 1``). Instantaneous: the bucket kept
    w.p. ``lambda``, else a uniform bucket; the function is kept.
    """
    values, g = check_indices(values, params.d), params.buckets

    def permanent(x: np.ndarray) -> np.ndarray:
        functions = rng.integers(0, params.functions, size=x.size)
        bucket = olh_hash(params, functions, x)
        other = (bucket + 1 + rng.integers(0, g - 1, size=x.size)) % g
        bucket = np.where(bernoulli(params.prr_numerator, x.size, rng), bucket, other)
        out: np.ndarray = functions * g + bucket
        return out

    def instant(kept: np.ndarray) -> np.ndarray:
        fresh = rng.integers(0, g, size=kept.size)
        bucket = np.where(bernoulli(params.irr_numerator, kept.size, rng), kept % g, fresh)
        out: np.ndarray = (kept // g) * g + bucket
        return out

    return _permanent_then_instant(values, clients, permanent, instant)


def encode_hadamard(params: HadamardParams, values: np.ndarray, rng: np.random.Generator,
                    clients: np.ndarray | None = None) -> np.ndarray:
    """Hadamard payloads (responses in ``[0, K)``) of category indices ``values``.

    Permanent: uniform in the category's set w.p. ``a``, else uniform outside it.
    Instantaneous: kept w.p. ``lambda``, else uniform in ``[0, K)``.
    """
    values = check_indices(values, params.d)

    def permanent(x: np.ndarray) -> np.ndarray:
        return hadamard_draw(params, x, bernoulli(params.prr_numerator, x.size, rng), rng)

    def instant(kept: np.ndarray) -> np.ndarray:
        fresh = rng.integers(0, params.size, size=kept.size)
        out: np.ndarray = np.where(bernoulli(params.irr_numerator, kept.size, rng), kept, fresh)
        return out

    return _permanent_then_instant(values, clients, permanent, instant)


def encode_oue(params: OueParams, values: np.ndarray, rng: np.random.Generator,
               clients: np.ndarray | None = None) -> np.ndarray:
    """OUE reports of category indices ``values``, as packed ``(n, words)`` uint64 bit vectors.

    Permanent: the category's bit 1 w.p. 1/2, every other bit 1 w.p. ``c``, independently.
    Instantaneous: each bit reported 1 w.p. ``one`` where the permanent bit is 1 and ``zero``
    where 0 (``params.irr_thresholds``); the thresholds are symmetric (``one = 2**32 - zero``),
    so, as in the SDK, the report is the permanent response XOR one mask of independent
    Bernoulli(``zero / 2**32``) bits. Rows pack as :mod:`veil.simulations.encoding` does,
    so :func:`~veil.simulations.encoding.payloads` gives the wire hex.
    """
    values, d = check_indices(values, params.d), params.d
    mask = valid_mask(d)
    other = params.other_numerator(params.prr_numerator)
    zero, _ = params.irr_thresholds(params.irr_numerator)

    def permanent(x: np.ndarray) -> np.ndarray:
        out = np.empty((x.size, len(mask)), dtype=np.uint64)
        for start in range(0, x.size, CHUNK_ROWS):
            onehot = pack_indices(x[start : start + CHUNK_ROWS, None], d)
            coin = random_words(rng, onehot.shape)
            others = bernoulli_words(other, onehot.shape, rng)
            out[start : start + CHUNK_ROWS] = ((coin & onehot) | (others & ~onehot)) & mask
        return out

    def instant(kept: np.ndarray) -> np.ndarray:
        out = np.empty_like(kept)
        for start in range(0, len(kept), CHUNK_ROWS):
            bits = kept[start : start + CHUNK_ROWS]
            out[start : start + CHUNK_ROWS] = (bits ^ bernoulli_words(zero, bits.shape, rng)) & mask
        return out

    return _permanent_then_instant(values, clients, permanent, instant)


# ---------------------------------------------------------------- the statistic, directly


def _uniform_counts(total: int, cells: int, rng: np.random.Generator) -> np.ndarray:
    """Counts of ``total`` independent uniform draws over ``cells`` cells.

    ``Multinomial(total, 1/cells each)`` when there are more draws than cells (cost
    ``O(cells)``), else the draws themselves, chunked (cost ``O(total)``): the same law.
    """
    if total > cells:
        counts: np.ndarray = rng.multinomial(total, np.full(cells, 1.0 / cells)).astype(np.int64)
        return counts
    counts = np.zeros(cells, dtype=np.int64)
    for start in range(0, total, CHUNK_DRAWS):
        size = min(CHUNK_DRAWS, total - start)
        counts += np.bincount(rng.integers(0, cells, size=size), minlength=cells)
    return counts


def _repeat_in_chunks(values: np.ndarray, repeats: np.ndarray) -> Iterator[np.ndarray]:
    """``np.repeat(values, repeats)`` in consecutive pieces of about :data:`CHUNK_DRAWS`."""
    ends = np.cumsum(repeats)
    start, done = 0, 0
    while start < len(values):
        stop = max(int(np.searchsorted(ends, done + CHUNK_DRAWS, side="right")), start + 1)
        yield np.repeat(values[start:stop], repeats[start:stop])
        start, done = stop, int(ends[stop - 1])


@implements(GrrParams, COUNT_SAMPLERS)
def _grr_counts(params: GrrParams, true_counts: np.ndarray, rng: np.random.Generator,
                ) -> np.ndarray:
    p, q = params.support_probs
    informative = rng.binomial(true_counts, p - q)
    counts = _uniform_counts(int(true_counts.sum() - informative.sum()), params.d, rng)
    out: np.ndarray = counts + informative
    return out


@implements(OueParams, COUNT_SAMPLERS)
def _oue_counts(params: OueParams, true_counts: np.ndarray, rng: np.random.Generator,
                ) -> np.ndarray:
    p, q = params.support_probs
    total = int(true_counts.sum())
    ones: np.ndarray = rng.binomial(true_counts, p) + rng.binomial(total - true_counts, q)
    return ones.astype(np.int64)


@implements(OlhParams, COUNT_SAMPLERS)
def _olh_counts(params: OlhParams, true_counts: np.ndarray, rng: np.random.Generator,
                ) -> np.ndarray:
    g, functions, cells = params.buckets, params.functions, params.responses
    p_bucket, q_bucket = bucket_channel(g, params.prr_numerator, params.irr_numerator)
    informative = rng.binomial(true_counts, p_bucket - q_bucket)
    counts = _uniform_counts(int(true_counts.sum() - informative.sum()), cells, rng)
    every = np.arange(functions, dtype=np.int64)
    heavy = informative > functions  # a multinomial over the functions is cheaper
    for x in np.flatnonzero(heavy):
        per_function = _uniform_counts(int(informative[x]), functions, rng)
        counts[every * g + olh_hash(params, every, np.full(functions, x))] += per_function
    light = np.flatnonzero((informative > 0) & ~heavy)
    for chunk in _repeat_in_chunks(light, informative[light]):
        a = rng.integers(0, functions, size=chunk.size)
        counts += np.bincount(a * g + olh_hash(params, a, chunk), minlength=cells)
    return counts


@implements(HadamardParams, COUNT_SAMPLERS)
def _hadamard_counts(params: HadamardParams, true_counts: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
    size = params.size
    in_set, off_set = params.response_probs(params.prr_numerator, params.irr_numerator)
    informative = rng.binomial(true_counts, (in_set - off_set) / 2)
    counts = _uniform_counts(int(true_counts.sum() - informative.sum()), size, rng)
    responses = np.arange(size, dtype=np.int64)
    heavy = informative > size // 2  # a multinomial over the set is cheaper
    for x in np.flatnonzero(heavy):
        members = responses[parity((x + 1) & responses) == 0]
        counts[members] += _uniform_counts(int(informative[x]), len(members), rng)
    light = np.flatnonzero((informative > 0) & ~heavy)
    for chunk in _repeat_in_chunks(light, informative[light]):
        inside = np.ones(chunk.size, dtype=bool)
        counts += np.bincount(hadamard_draw(params, chunk, inside, rng), minlength=size)
    return counts


def simulate_oracle_counts(params: OracleParams, true_counts: np.ndarray,
                           rng: np.random.Generator) -> np.ndarray:
    """The statistic of one report per installation, ``true_counts[x]`` of them in category ``x``.

    Returns the ``responses`` counts vector (GRR, OLH, Hadamard) or OUE's set-bit counts
    (``ones``, length ``d``). Each sampler has exactly the law of the statistic of
    :func:`encode_grr` (etc.) reports with ``clients=None``, because reports of distinct
    installations are independent and, given its category, each report's payload is drawn
    from a fixed distribution:

    * GRR: a report of ``x`` names ``x`` w.p. ``p`` and each other category w.p. ``q``
      (``support_probs``, the composed channel; ``p + (d - 1) q = 1``). That is the
      mixture "w.p. ``p - q`` the category itself, else a uniform one of the ``d``"
      (``(1 - p + q) / d = q``): the ``Bin(n_x, p - q)`` reports of each category that
      name it for sure, plus ``Multinomial(N - sum, uniform)`` for the rest, have the law
      of the sum over categories of ``Multinomial(n_x, row x)``.
    * OUE: every bit of every report is an independent Bernoulli (the permanent and the
      instantaneous response both act bit by bit), bit ``x`` with probability ``p`` in
      the ``n_x`` reports of ``x`` and ``q`` in the others; so the counts are independent
      ``Bin(n_x, p) + Bin(N - n_x, q)``.
    * OLH: a report of ``x`` is the cell ``(a, b)`` with probability
      ``g^-r (q_b + (p_b - q_b) [b = h_a(x)])`` (``p_b``, ``q_b``: the bucket channel).
      That is the mixture "w.p. ``g q_b`` a uniform cell; w.p. ``p_b - q_b`` a uniform
      ``a`` with ``b = h_a(x)``" (``g q_b + p_b - q_b = 1``). Drawing each report's
      component (``Bin(n_x, p_b - q_b)`` informative reports per category), then the
      uniform cells of all the others together and a uniform function for each
      informative report, gives the same counts.
    * Hadamard: a report of ``x`` is ``y`` with probability ``(1 - lambda + 2 a lambda) / K``
      inside ``x``'s set and ``(1 - lambda + 2 (1 - a) lambda) / K`` outside
      (``params.response_probs`` gives both times ``K``): the mixture "w.p. ``lambda (2a - 1)``
      (half their gap) uniform in the set, else uniform in ``[0, K)``", sampled the same way.

    Uniform draws over ``m`` cells are a ``Multinomial`` over the cells when there are more
    than ``m`` of them and the individual draws (vectorized, in chunks of
    :data:`CHUNK_DRAWS`) otherwise: the same law either way, at a cost of
    ``O(min(draws, m))``; so 10^6 reports take well under a second whatever ``d`` (OLH and
    Hadamard at ``d = 65536`` the slowest, on the order of 0.1 s). With memoized
    installations (several reports each) use the per-report encoders instead.
    """
    true_counts = np.asarray(true_counts, dtype=np.int64).reshape(-1)
    if true_counts.size != params.d or (true_counts.size and true_counts.min() < 0):
        raise ParameterError("true_counts", f"need {params.d} non-negative counts, one per category")
    return COUNT_SAMPLERS.lookup(params.mechanism_name)(params, true_counts, rng)


def oracle_counts_document(params: OracleParams, counts: np.ndarray,
                           metric: str = "m") -> dict[str, Any]:
    """A counts document (one cohort) for :func:`simulate_oracle_counts` output.

    The total of reports is ``counts.sum()`` for the ``responses`` statistic; OUE's
    counts do not give it, so pass the total through :func:`oue_counts_document`.
    """
    if params.statistic != "responses":
        raise ParameterError("params", "OUE's set-bit counts do not give the number of reports; "
                                       "use oue_counts_document")
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    return counts_document(params, np.array([counts.sum()]), counts, metric, "responses")


def oue_counts_document(params: OueParams, reports: int, ones: np.ndarray,
                        metric: str = "m") -> dict[str, Any]:
    """A counts document (one cohort) of ``reports`` OUE reports with set-bit counts ``ones``."""
    return counts_document(params, np.array([reports]), ones, metric, "ones")
