"""Vectorized (NumPy) encoders, statistically identical to the client SDK's.

Every kind gets the same mechanism as :mod:`veil.client.encoders`:

* the same Bloom hashing (:func:`veil.shared.hashing.bloom_indices`, through the
  candidate map's :func:`veil.server.analysis.candidate_map.bloom_index_array`:
  each distinct value is hashed once per cohort and then looked up by index);
* the same realized probabilities ``N / 2**32`` (:func:`veil.shared.bits.realize`),
  drawn exactly: a Bernoulli(``N / 2**32``) word is built bit-sliced from
  uniform 64-bit words, digit by digit, as :func:`veil.shared.bits.bernoulli_mask`
  does for the SDK, so 64 report bits cost ``32 - tz(N)`` random words;
* the permanent randomized response (PRR) once per (client, value) and the
  instantaneous one (IRR) once per report; memoized responses (booleans,
  numbers) once per (client, value).

Reports are bit matrices packed into ``uint64`` words: bit ``i`` of a report
is bit ``i % 64`` of word ``i // 64``, so the little-endian bytes of a row are
exactly the wire payload.

The categories' fast path (:func:`aggregate_categories`) skips the report matrix
and draws the counts directly with the analysis' exact sampler
(:mod:`veil.server.analysis.synthetic`, where the strings' fast path is too:
:func:`~veil.server.analysis.synthetic.string_counts_from_values`).

Randomness comes from a seeded :class:`numpy.random.Generator`: reproducible,
fast, and NOT for production. Real reports come only from the client SDK,
whose noise is drawn from the operating system's CSPRNG.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from veil.server.analysis.candidate_map import bloom_index_array
from veil.server.analysis.synthetic import draw_bit_counts
from veil.shared.bits import PROB_BITS, PROB_ONE, realize
from veil.shared.errors import ParameterError
from veil.shared.kinds import BooleanParams, CategoryParams, NumberParams, StringParams

WORD_BITS = 64
#: rows encoded at once (bounds memory to a few hundred MB for k <= 1024)
CHUNK_ROWS = 1 << 18
#: BYTE_BITS[b, j] is bit j of the byte value b
BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(
    np.int64
)


def word_count(k: int) -> int:
    """``uint64`` words per ``k``-bit report."""
    return (k + WORD_BITS - 1) // WORD_BITS


def valid_mask(k: int) -> np.ndarray:
    """Per-word masks of the bits below ``k`` (pad bits stay zero)."""
    masks = np.full(word_count(k), np.iinfo(np.uint64).max, dtype=np.uint64)
    rest = k % WORD_BITS
    if rest:
        masks[-1] = np.uint64((1 << rest) - 1)
    return masks


def random_words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform 64-bit words."""
    return rng.integers(0, np.iinfo(np.uint64).max, size=shape, dtype=np.uint64, endpoint=True)


def bernoulli_words(numerator: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Words of independent Bernoulli(``numerator / 2**32``) bits, exactly.

    The binary digits of ``numerator`` are processed from the least
    significant set one upwards: ``m = r | m`` for a one, ``m = r & m`` for a
    zero, with ``r`` fresh uniform words (the SDK's bit-sliced construction).
    """
    if numerator <= 0:
        return np.zeros(shape, dtype=np.uint64)
    if numerator >= PROB_ONE:
        return np.full(shape, np.iinfo(np.uint64).max, dtype=np.uint64)
    trailing = (numerator & -numerator).bit_length() - 1
    mask = random_words(rng, shape)
    for position in range(trailing + 1, PROB_BITS):
        if (numerator >> position) & 1:
            mask |= random_words(rng, shape)
        else:
            mask &= random_words(rng, shape)
    return mask


def pack_indices(indices: np.ndarray, k: int) -> np.ndarray:
    """Pack rows of set-bit indices ``(..., h)`` into ``(..., words)`` uint64 bit vectors."""
    shape = indices.shape[:-1]
    out = np.zeros((*shape, word_count(k)), dtype=np.uint64)
    flat = out.reshape(-1, out.shape[-1])
    rows = np.arange(flat.shape[0])
    for j in range(indices.shape[-1]):
        column = indices[..., j].reshape(-1)
        bit = np.left_shift(np.uint64(1), (column % WORD_BITS).astype(np.uint64))
        flat[rows, column // WORD_BITS] |= bit  # (row, word) pairs are distinct per j
    return out


def unpack_bits(words: np.ndarray, k: int) -> np.ndarray:
    """``(n, k)`` uint8 0/1 matrix of packed reports."""
    raw = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1)
    return np.unpackbits(raw, axis=1, count=k, bitorder="little")


def payloads(words: np.ndarray, k: int) -> list[str]:
    """The wire payloads (lowercase hex) of packed reports."""
    width = (k + 7) // 8
    raw = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1)[:, :width]
    return [row.tobytes().hex() for row in raw]


@dataclasses.dataclass(frozen=True)
class RapporNoise:
    """RAPPOR's PRR and IRR on packed ``k``-bit vectors with realized ``p``, ``q``, ``f``."""

    k: int
    p: float
    q: float
    f: float

    def prr(self, bloom: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Permanent responses: each bit replaced w.p. ``f`` by a fair coin."""
        replace = bernoulli_words(realize(self.f), bloom.shape, rng)
        coin = random_words(rng, bloom.shape)
        prr: np.ndarray = ((bloom & ~replace) | (coin & replace)) & valid_mask(self.k)
        return prr

    def irr(self, prr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Instantaneous responses: 1 w.p. ``q`` where the PRR bit is 1, ``p`` where 0."""
        p_mask = bernoulli_words(realize(self.p), prr.shape, rng)
        q_mask = bernoulli_words(realize(self.q), prr.shape, rng)
        irr: np.ndarray = ((prr & q_mask) | (~prr & p_mask)) & valid_mask(self.k)
        return irr

    def encode(
        self, bloom: np.ndarray, memo: np.ndarray | None, rng: np.random.Generator
    ) -> np.ndarray:
        """Reports for true bit vectors ``bloom`` (one row per distinct (client, value)).

        ``memo[r]`` is the row of ``bloom`` behind report ``r``; ``None`` means
        one report per row.
        """
        out = np.empty((len(bloom) if memo is None else len(memo), bloom.shape[1]), np.uint64)
        prr = np.empty_like(bloom)
        for start in range(0, len(bloom), CHUNK_ROWS):
            prr[start : start + CHUNK_ROWS] = self.prr(bloom[start : start + CHUNK_ROWS], rng)
        for start in range(0, len(out), CHUNK_ROWS):
            rows = prr[start : start + CHUNK_ROWS] if memo is None else prr[memo[start : start + CHUNK_ROWS]]
            out[start : start + CHUNK_ROWS] = self.irr(rows, rng)
        return out


def memo_rows(clients: np.ndarray | None, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Distinct (client, key) pairs: ``(first report of each pair, pair of each report)``.

    With ``clients=None`` every report is its own client and nothing is shared.
    """
    if clients is None:
        return np.arange(len(keys)), None
    pairs = np.stack([np.asarray(clients, dtype=np.int64), np.asarray(keys, dtype=np.int64)])
    _, first, inverse = np.unique(pairs, axis=1, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@dataclasses.dataclass(frozen=True)
class BitReports:
    """Packed reports and their cohorts (string and category kinds)."""

    words: np.ndarray
    cohorts: np.ndarray
    k: int

    def __len__(self) -> int:
        return len(self.words)

    def bits(self) -> np.ndarray:
        """``(n, k)`` 0/1 matrix."""
        return unpack_bits(self.words, self.k)

    def payloads(self) -> list[str]:
        """Wire payloads (hex), as the SDK produces them."""
        return payloads(self.words, self.k)

    def counts(self, cohorts: int) -> tuple[np.ndarray, np.ndarray]:
        """``(reports per cohort, ones per cohort and bit)``: the collector's statistics."""
        reports = np.bincount(self.cohorts, minlength=cohorts)
        width = (self.k + 7) // 8
        raw = np.ascontiguousarray(self.words).view(np.uint8).reshape(len(self.words), -1)
        ones = np.zeros((cohorts, 8 * width), dtype=np.int64)
        base = self.cohorts.astype(np.int64) * 256
        for column in range(width):
            # histogram of byte values per cohort, then the bits each byte value sets
            hist = np.bincount(base + raw[:, column], minlength=cohorts * 256)
            ones[:, 8 * column : 8 * column + 8] = hist.reshape(cohorts, 256) @ BYTE_BITS
        return reports, ones[:, : self.k]


# ---------------------------------------------------------------- strings


def bloom_table(params: StringParams, values: Sequence[str]) -> np.ndarray:
    """``(n_values, m, words)`` packed Bloom filters of ``values`` in every cohort."""
    return pack_indices(bloom_index_array(params, values, progress=False), params.k)


def encode_strings(
    params: StringParams,
    table: np.ndarray,
    values: np.ndarray,
    cohorts: np.ndarray,
    rng: np.random.Generator,
    clients: np.ndarray | None = None,
) -> BitReports:
    """One report per entry of ``values`` (indices into ``table``'s values).

    ``cohorts[r]`` is the cohort of report ``r``'s client; ``clients[r]`` its
    client id (reports of one client and value share their PRR), or ``None``
    for one report per client. ``table`` comes from :func:`bloom_table`.
    """
    values = np.asarray(values, dtype=np.int64)
    cohorts = np.asarray(cohorts, dtype=np.int64)
    if values.shape != cohorts.shape:
        raise ParameterError("cohorts", "need one cohort per report")
    first, memo = memo_rows(clients, values)
    bloom = table[values[first], cohorts[first]]
    noise = RapporNoise(params.k, params.p, params.q, params.f)
    return BitReports(noise.encode(bloom, memo, rng), cohorts, params.k)


# ---------------------------------------------------------------- categories


def check_indices(values: np.ndarray, d: int) -> np.ndarray:
    """Category indices as a flat int64 array, each in ``[0, d)``."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    if values.size and not (values.min() >= 0 and values.max() < d):
        raise ParameterError("values", f"category indices must be in [0, {d})")
    return values


def encode_categories(
    params: CategoryParams,
    values: np.ndarray,
    rng: np.random.Generator,
    clients: np.ndarray | None = None,
) -> BitReports:
    """Basic RAPPOR reports of category indices ``values`` (one-hot, PRR, IRR)."""
    values = check_indices(values, params.k)
    first, memo = memo_rows(clients, values)
    onehot = pack_indices(values[first][:, None], params.k)
    noise = RapporNoise(params.k, params.p, params.q, params.f)
    return BitReports(noise.encode(onehot, memo, rng), np.zeros(len(values), np.int64), params.k)


def aggregate_categories(
    params: CategoryParams, hist: np.ndarray, rng: np.random.Generator
) -> tuple[int, np.ndarray]:
    """Fast path for one report per client: ``(reports, ones per bit)`` from category counts."""
    hist = np.asarray(hist, dtype=np.int64)
    total = int(hist.sum())
    ones = draw_bit_counts(params, hist[None, :], np.array([total]), rng)
    return total, ones[0]


# ---------------------------------------------------------------- booleans


def encode_booleans(
    params: BooleanParams,
    values: np.ndarray,
    rng: np.random.Generator,
    clients: np.ndarray | None = None,
) -> np.ndarray:
    """0/1 payloads: truthful if ``u1 < alpha``, else yes if ``u2 < beta`` (memoized)."""
    values = np.asarray(values, dtype=bool)
    first, memo = memo_rows(clients, values.astype(np.int64))
    n = len(first)
    truthful = rng.integers(0, PROB_ONE, size=n, dtype=np.uint64) < realize(params.alpha)
    yes = rng.integers(0, PROB_ONE, size=n, dtype=np.uint64) < realize(params.beta)
    answers = np.where(truthful, values[first], yes).astype(np.int64)
    return answers if memo is None else answers[memo]


# ---------------------------------------------------------------- numbers


def discrete_laplace(scale: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Integers with ``P(z) ~ exp(-|z| / scale)``: a difference of two geometric variables."""
    success = -math.expm1(-1.0 / scale)
    return rng.geometric(success, size) - rng.geometric(success, size)


def discrete_gaussian(sigma2: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Integers with ``P(z) ~ exp(-z**2 / (2 sigma2))``.

    Canonne, Kamath and Steinke's rejection sampler (as the SDK): a discrete
    Laplace proposal of scale ``t = isqrt(floor(sigma2)) + 1`` accepted with
    probability ``exp(-(|y| - sigma2/t)**2 / (2 sigma2))``.
    """
    t = math.isqrt(math.floor(sigma2)) + 1
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        y = discrete_laplace(t, todo.size, rng)
        accept = rng.random(todo.size) < np.exp(-((np.abs(y) - sigma2 / t) ** 2) / (2 * sigma2))
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out


def grid_points(params: NumberParams, values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Clip to ``[low, high]`` and alpha-point round to the grid with per-client ``thresholds``."""
    x = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(x)):
        raise ParameterError("values", "numbers must be finite")
    position = (np.clip(x, params.low, params.high) - params.low) / params.step
    below = np.minimum(np.floor(position), params.resolution).astype(np.int64)
    up = (position - below) * PROB_ONE > thresholds
    points: np.ndarray = np.minimum(below + up, params.resolution)
    return points


def encode_numbers(
    params: NumberParams,
    values: np.ndarray,
    rng: np.random.Generator,
    clients: np.ndarray | None = None,
) -> np.ndarray:
    """Payloads of the number mechanisms: floats (laplace, gaussian) or 0/1 (1bitmean).

    Each client draws one rounding threshold; the noise (or bit) is memoized
    per (client, grid point).
    """
    values = np.asarray(values, dtype=float)
    client_ids = np.arange(len(values)) if clients is None else np.asarray(clients, np.int64)
    _, client_index = np.unique(client_ids, return_inverse=True)
    thresholds = rng.integers(0, PROB_ONE, size=client_index.max(initial=-1) + 1, dtype=np.uint64)
    grid = grid_points(params, values, thresholds[client_index].astype(float))
    first, memo = memo_rows(None if clients is None else client_ids, grid)
    j = grid[first]
    out: np.ndarray
    if params.mechanism == "1bitmean":
        numerators = np.array(
            [params.one_bit_numerator(point) for point in range(params.resolution + 1)], np.uint64
        )
        out = (rng.integers(0, PROB_ONE, size=len(j), dtype=np.uint64) < numerators[j]).astype(
            np.int64
        )
    else:
        if params.mechanism == "laplace":
            noise = discrete_laplace(params.resolution / params.epsilon, len(j), rng)
        else:
            noise = discrete_gaussian((params.gaussian_sigma * (1 + 1e-12)) ** 2, len(j), rng)
        out = params.low + params.step * (j + noise)
    return out if memo is None else out[memo]
