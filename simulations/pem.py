"""PEM, the prefix extension method: the baseline for Veil's string discovery.

Wang, Li and Jha, "Locally Differentially Private Heavy Hitter Identification"
(IEEE TDSC 2019). Users are split uniformly at random into ``g`` groups; a user of
group ``i`` reports a prefix of its value, ``eta`` bits longer for each further
group, through optimized local hashing (OLH, one epsilon-LDP report per user). The
server extends each of the current top-``k`` prefixes by every possible ``eta``-bit
suffix, estimates each candidate's share from that group's reports and keeps the
top ``k``; after the last group the top-``k`` full values are the output.

Byte-aligned variant (the segments and levels of :mod:`veil.shared.kinds.discovery`,
so that the two are compared side by side): a value is its UTF-8 bytes cut at
``max_length``, followed by ``0x00`` and padded with ``0x00`` to
``groups * segment`` bytes, ``groups = ceil(max_length / segment)`` (``eta =
8 * segment`` bits; 32 groups by default, as Veil's levels). PEM fingerprints whole
prefixes, so its padding need not differ from its end marker (Veil's must: its
reports pair a prefix's fingerprint with the next segment). Group ``i`` (0-based) reports the first
``(i + 1) * segment`` bytes of the padded value. Round ``i`` extends every kept
prefix (round 0: the empty prefix) by every ``segment``-byte suffix, ``2**eta`` per
kept prefix, and keeps the ``k`` of highest estimate. The output is the final
top-``k`` decoded up to the first ``0x00`` (UTF-8, ``errors="replace"``).

Fingerprints. OLH hashes a public fingerprint of the prefix (``bits = 24`` bits unless
``fingerprint_bits`` says otherwise) with the exactly universal linear family of GF(2)
that Veil's discovery uses, so the support counts of all ``2**bits`` fingerprints
come from one Walsh-Hadamard transform
(:func:`veil.server.analysis.discovery.support_counts`). A round examines
``2**eta * k`` candidates (two million by default), too many for one BLAKE2b call
each, so the fingerprint of a prefix ``parent + s`` (``s`` its last segment, read
as a big-endian integer) is::

    fp(parent + s) = mix64((H(parent) << eta | s) mod 2**64) >> (64 - bits)
    H(parent)      = BLAKE2b-64(parent, person=b"veil-pem"), big-endian

with ``mix64`` the splitmix64 finalizer: one BLAKE2b per kept parent, then numpy
over the segments. The simulated users compute the same function, once per distinct
parent of the group. It is a fixed public hash of the prefix bytes, so the reports
stay epsilon-LDP; its only cost is collisions: a candidate whose fingerprint equals
that of a frequent prefix gets that prefix's estimate (expected ``2**eta * k /
2**bits`` such twins per frequent prefix and round, 1/8 by default; a twin of a
full value in the last round is a false output string with a true string's share).

OLH report of a fingerprint ``x``: a uniformly random ``t x bits`` bit matrix ``A``
(rows as int64) and ``y = A x`` over GF(2) (bit ``r`` of ``y`` is the parity of
``row_r & x``), then generalized randomized response over ``g = 2**t`` buckets: ``y``
kept with ``p = e^eps / (e^eps + g - 1)``, else a uniformly random other bucket.
For ``x' != x`` the bucket of ``x'`` matches with probability exactly ``q = 1/g``, so
the share estimate ``(count(x) / n - q) / (p - q)`` is unbiased (for the share of
the fingerprint ``x``: the prefix and any twins), with variance
``(s p (1 - p) + (1 - s) q (1 - q)) / (n (p - q)**2)`` for a true share ``s``.
``t`` is :func:`veil.shared.kinds.discovery.best_bucket_bits`.

Simulation randomness comes from a seeded :class:`numpy.random.Generator` and is
NOT suitable for producing real reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from veil.server.analysis.discovery import support_counts
from veil.shared.errors import ParameterError
from veil.shared.kinds.discovery import best_bucket_bits
from veil.simulations.oracle_encoding import parity

#: the ``person`` of the BLAKE2b parent hash
FINGERPRINT_PERSON = b"veil-pem"
#: bits of the prefix fingerprint that OLH hashes (default)
FINGERPRINT_BITS = 24
#: most fingerprint bits (the transform of ``2**bits`` entries must fit in memory)
MAX_FINGERPRINT_BITS = 26
#: the byte that ends a value and pads it
END = 0x00

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclasses.dataclass
class PemResult:
    """What :func:`run_pem` found.

    ``strings``: the output, ``(value, estimated share)`` best first (at most ``k``:
    final prefixes that decode to the same value are listed once, at their best);
    ``rounds``: the prefixes kept in each round with their estimates, best first;
    ``seconds``: wall time of the whole simulation.
    """

    strings: list[tuple[str, float]]
    rounds: list[list[tuple[bytes, float]]]
    seconds: float


# --- fingerprints ----------------------------------------------------------------------


def parent_hash(parent: bytes) -> int:
    """``H(parent)``: ``BLAKE2b-64(parent, person=b"veil-pem")`` as a big-endian integer."""
    digest = hashlib.blake2b(parent, digest_size=8, person=FINGERPRINT_PERSON).digest()
    return int.from_bytes(digest, "big")


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of a uint64 array (arithmetic modulo ``2**64``)."""
    z = np.asarray(x, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def child_fingerprints(parent_hashes: np.ndarray, segments: np.ndarray, segment: int,
                       bits: int = FINGERPRINT_BITS) -> np.ndarray:
    """``fp(parent + s)`` as int64 from ``H(parent)`` (uint64) and ``s`` (broadcast together):
    the top ``bits`` bits of the mix."""
    shifted = np.asarray(parent_hashes, dtype=np.uint64) << np.uint64(8 * segment)
    mixed = mix64(shifted | np.asarray(segments, dtype=np.uint64))
    return (mixed >> np.uint64(64 - bits)).astype(np.int64)


def prefix_fingerprint(prefix: bytes, segment: int = 2, bits: int = FINGERPRINT_BITS) -> int:
    """``fp`` of one prefix of a positive multiple of ``segment`` bytes (reference form)."""
    if not prefix or len(prefix) % segment:
        raise ParameterError("prefix", f"must be a positive multiple of {segment} bytes; "
                                       f"got {len(prefix)}")
    parent, last = prefix[:-segment], int.from_bytes(prefix[-segment:], "big")
    hashes = np.array([parent_hash(parent)], dtype=np.uint64)
    return int(child_fingerprints(hashes, np.array([last]), segment, bits)[0])


def group_count(max_length: int, segment: int) -> int:
    """``ceil(max_length / segment)``: the segments of a cut value (one of ``max_length``
    bytes has no end marker, nor needs one), as Veil's discovery levels."""
    return -(-max_length // segment)


def padded_values(values: Sequence[str], max_length: int, segment: int) -> np.ndarray:
    """The values as a ``(len(values), groups * segment)`` uint8 array: UTF-8 bytes cut at
    ``max_length``, ended and padded with ``0x00``."""
    width = group_count(max_length, segment) * segment
    joined = b"".join(v.encode("utf-8")[:max_length].ljust(width, bytes([END])) for v in values)
    return np.frombuffer(joined, dtype=np.uint8).reshape(len(values), width)


def value_fingerprints(padded: np.ndarray, length: int, segment: int,
                       bits: int = FINGERPRINT_BITS) -> np.ndarray:
    """``fp`` of the first ``length`` bytes of each row of ``padded`` (int64): one BLAKE2b
    per distinct parent (the first ``length - segment`` bytes), the rest vectorized."""
    cut = length - segment
    if cut == 0:
        hashes = np.full(len(padded), parent_hash(b""), dtype=np.uint64)
    else:
        parents = np.ascontiguousarray(padded[:, :cut]).view(np.dtype((np.void, cut))).ravel()
        distinct, inverse = np.unique(parents, return_inverse=True)
        hashes = np.array([parent_hash(p.tobytes()) for p in distinct],
                          dtype=np.uint64)[inverse.ravel()]
    last = np.zeros(len(padded), dtype=np.uint64)
    for j in range(cut, length):
        last = (last << np.uint64(8)) | padded[:, j].astype(np.uint64)
    return child_fingerprints(hashes, last, segment, bits)


# --- OLH over the linear family ----------------------------------------------------------


def keep_probability(epsilon: float, bucket_bits: int) -> float:
    """``p = e^eps / (e^eps + g - 1)``: the chance a report keeps its own bucket."""
    g = 1 << bucket_bits
    return 1.0 / (1.0 + (g - 1) * math.exp(-epsilon))


def olh_reports(fingerprints: np.ndarray, epsilon: float, bucket_bits: int,
                rng: np.random.Generator, bits: int = FINGERPRINT_BITS,
                ) -> tuple[np.ndarray, np.ndarray]:
    """One OLH report per fingerprint of ``bits`` bits: ``(rows, buckets)``, the hash
    matrices as ``(t, n)`` int64 rows and the randomized buckets as ``(n,)`` int64."""
    x = np.asarray(fingerprints, dtype=np.int64)
    t, g, n = bucket_bits, 1 << bucket_bits, len(x)
    rows = rng.integers(0, 1 << bits, size=(t, n), dtype=np.int64)
    buckets = np.zeros(n, dtype=np.int64)
    for r in range(t):
        buckets |= parity(rows[r] & x) << r
    other = (buckets + rng.integers(1, g, size=n)) % g
    kept = rng.random(n) < keep_probability(epsilon, bucket_bits)
    return rows, np.where(kept, buckets, other)


def share_estimates(counts: np.ndarray, reports: int, epsilon: float, bucket_bits: int,
                    ) -> np.ndarray:
    """Unbiased shares ``(count / n - q) / (p - q)`` from support counts, ``q = 1/g``."""
    p, q = keep_probability(epsilon, bucket_bits), 1.0 / (1 << bucket_bits)
    if reports == 0:
        return np.zeros_like(np.asarray(counts, dtype=np.float64))
    return (np.asarray(counts, dtype=np.float64) / reports - q) / (p - q)


# --- the simulation ----------------------------------------------------------------------


def _check(values: Sequence[str], weights: np.ndarray, reports: int, epsilon: float, k: int,
           segment: int, max_length: int, fingerprint_bits: int) -> np.ndarray:
    """Refuse invalid parameters (naming the field); the weights normalized to sum to 1."""
    def integer(name: str, value: object, low: int, high: int | None = None) -> None:
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low \
                or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ParameterError(name, f"'{name}' must be an integer {bound}; got {value!r}")

    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) \
            or not math.isfinite(epsilon) or epsilon <= 0:
        raise ParameterError("epsilon", f"'epsilon' must be a finite number above 0; "
                                        f"got {epsilon!r}")
    integer("k", k, 1)
    integer("segment", segment, 1, 2)
    integer("max_length", max_length, 1)
    integer("fingerprint_bits", fingerprint_bits, 8, MAX_FINGERPRINT_BITS)
    groups = group_count(max_length, segment)
    integer("reports", reports, groups)
    if not len(values):
        raise ParameterError("values", "'values' must hold at least one value")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(values),):
        raise ParameterError("weights", f"'weights' must have shape ({len(values)},); "
                                        f"got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ParameterError("weights", "'weights' must be finite, >= 0 and not all 0")
    normalized: np.ndarray = w / w.sum()
    return normalized


def _top(estimates: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` highest estimates, highest first."""
    flat = estimates.ravel()
    pick = np.argpartition(-flat, k - 1)[:k] if flat.size > k else np.arange(flat.size)
    return pick[np.argsort(-flat[pick], kind="stable")]


def run_pem(values: Sequence[str], weights: np.ndarray, reports: int, epsilon: float,
            rng: np.random.Generator, *, k: int = 32, segment: int = 2, max_length: int = 64,
            progress: Callable[[int, int], None] | None = None,
            fingerprint_bits: int = FINGERPRINT_BITS) -> PemResult:
    """Simulate ``reports`` users drawing values from ``(values, weights)``, encoding them
    per PEM, and decode (see the module docstring).

    Group sizes are one multinomial draw; each group is simulated only when its round
    comes (its users' values drawn, each distinct value fingerprinted once, reports
    encoded, counted and discarded), so memory does not grow with ``reports``.
    ``progress(done, groups)`` is called after each round. ``fingerprint_bits``: bits of
    the prefix fingerprint (fewer make each round's transform cheaper, e.g. in tests,
    at the cost of more fingerprint twins).
    """
    probabilities = _check(values, weights, reports, epsilon, k, segment, max_length,
                           fingerprint_bits)
    started = time.perf_counter()
    groups = group_count(max_length, segment)
    t = best_bucket_bits(epsilon, epsilon)
    padded = padded_values(values, max_length, segment)
    sizes = rng.multinomial(reports, np.full(groups, 1.0 / groups))
    suffixes = np.arange(1 << (8 * segment), dtype=np.uint64)
    kept: list[tuple[bytes, float]] = [(b"", 1.0)]
    rounds: list[list[tuple[bytes, float]]] = []
    for index in range(groups):
        length = (index + 1) * segment
        n = int(sizes[index])
        # the group's users: how many hold each value, then one report each
        held = rng.multinomial(n, probabilities)
        distinct = np.flatnonzero(held)
        fingerprints = value_fingerprints(padded[distinct], length, segment, fingerprint_bits)
        rows, buckets = olh_reports(np.repeat(fingerprints, held[distinct]), epsilon, t, rng,
                                    fingerprint_bits)
        counts = support_counts(rows, buckets, fingerprint_bits)
        del rows, buckets
        # the server: every kept prefix times every segment, the top k kept
        hashes = np.array([parent_hash(prefix) for prefix, _ in kept], dtype=np.uint64)
        candidates = child_fingerprints(hashes[:, None], suffixes[None, :], segment,
                                        fingerprint_bits)
        estimates = share_estimates(counts[candidates], n, epsilon, t)
        del counts
        best = _top(estimates, k)
        width = suffixes.size
        kept = [(kept[i // width][0] + int(i % width).to_bytes(segment, "big"),
                 float(estimates.flat[i])) for i in best]
        rounds.append(kept)
        if progress is not None:
            progress(index + 1, groups)
    strings: dict[str, float] = {}
    for prefix, share in kept:
        strings.setdefault(prefix.split(bytes([END]), 1)[0].decode("utf-8", errors="replace"),
                           share)
    return PemResult(list(strings.items()), rounds, time.perf_counter() - started)
