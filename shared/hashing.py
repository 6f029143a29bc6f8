"""The Bloom-filter hashing specification.

A value is hashed as its UTF-8 bytes (no normalization). A string metric names
its hashing with the ``hashing`` parameter:

``"mmh3"`` (the default)
    For cohort ``c`` and hash function ``i`` (0-based) the bit index is::

        mmh3_x86_32(value_utf8, seed=(c << 16) | i) mod k     (hash taken unsigned)

``"md5-google"`` (google/rappor's client)
    One digest per cohort, ``MD5(be32(c) || value_utf8)``; hash function ``i`` sets
    bit ``digest[i] mod k`` (``i < h <= 16``, one digest byte each, so ``k <= 256``).

Either way every cohort has its own ``h`` hash functions. See ``docs/protocol.md``
for test vectors that a client in another language can check against.
"""

from __future__ import annotations

import functools
import hashlib

import mmh3

from veil.shared.errors import ParameterError, type_name

#: the values of a string metric's ``hashing`` parameter, the default first
HASHINGS = ("mmh3", "md5-google")
#: ``md5-google`` takes hash ``i`` from digest byte ``i``: at most 16 hashes ...
MD5_MAX_H = 16
#: ... and a byte reaches bits 0..255 only
MD5_MAX_K = 256


def value_bytes(value: str) -> bytes:
    """The bytes a string value is hashed as (UTF-8, strict)."""
    if not isinstance(value, str):
        raise ParameterError("value", f"must be a str; got {type_name(value)}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ParameterError(
            "value", "must be encodable as UTF-8 (it contains a lone surrogate)"
        ) from exc


def hash_seed(cohort: int, index: int) -> int:
    """The mmh3 seed for hash function ``index`` of ``cohort``."""
    return (cohort << 16) | index


def bloom_indices(data: bytes, cohort: int, k: int, h: int, hashing: str = "mmh3") -> list[int]:
    """The ``h`` bit indices (possibly repeated) that ``data`` sets in ``cohort``.

    ``hashing`` is one of :data:`HASHINGS`; the caller has checked ``k`` and ``h``
    against it (:class:`~veil.shared.kinds.StringParams` does).
    """
    if hashing == "md5-google":
        digest = hashlib.md5(cohort.to_bytes(4, "big") + data, usedforsecurity=False).digest()
        return [digest[i] % k for i in range(h)]
    if hashing != "mmh3":
        raise ParameterError("hashing", f"must be one of {', '.join(map(repr, HASHINGS))}; got {hashing!r}")
    base = cohort << 16
    return [mmh3.hash(data, base | i, signed=False) % k for i in range(h)]


def bloom_indices_all_cohorts(data: bytes, m: int, k: int, h: int, hashing: str = "mmh3") -> list[int]:
    """:func:`bloom_indices` of cohorts ``0 .. m-1`` in one flat list (cohort-major,
    ``m * h`` entries): what a candidate map needs for each candidate.

    For mmh3 one comprehension over the seeds: per-cohort calls cost four times as much
    at 100,000 candidates.
    """
    if hashing == "mmh3":
        return [mmh3.hash(data, seed, signed=False) % k for seed in _seeds(m, h)]
    return [index for cohort in range(m) for index in bloom_indices(data, cohort, k, h, hashing)]


@functools.cache
def _seeds(m: int, h: int) -> tuple[int, ...]:
    """The mmh3 seeds of cohorts ``0 .. m-1``, hash functions ``0 .. h-1``, cohort-major."""
    return tuple(hash_seed(cohort, i) for cohort in range(m) for i in range(h))


def bloom_bits(value: str, cohort: int, k: int, h: int, hashing: str = "mmh3") -> int:
    """The Bloom filter of ``value`` in ``cohort`` as an integer bit vector."""
    bits = 0
    for index in bloom_indices(value_bytes(value), cohort, k, h, hashing):
        bits |= 1 << index
    return bits
