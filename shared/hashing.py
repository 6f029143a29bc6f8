"""The Bloom-filter hashing specification.

A value is hashed as its UTF-8 bytes (no normalization). For cohort ``c`` and
hash function ``i`` (0-based) the bit index is::

    mmh3_x86_32(value_utf8, seed=(c << 16) | i) mod k     (hash taken unsigned)

so every cohort has its own ``h`` hash functions. See ``docs/protocol.md`` for
test vectors that a client in another language can check against.
"""

from __future__ import annotations

import mmh3

from veil.shared.errors import ParameterError


def value_bytes(value: str) -> bytes:
    """The bytes a string value is hashed as (UTF-8, strict)."""
    if not isinstance(value, str):
        raise ParameterError("value", f"must be a str; got {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ParameterError(
            "value", "must be encodable as UTF-8 (it contains a lone surrogate)"
        ) from exc


def hash_seed(cohort: int, index: int) -> int:
    """The mmh3 seed for hash function ``index`` of ``cohort``."""
    return (cohort << 16) | index


def bloom_indices(data: bytes, cohort: int, k: int, h: int) -> list[int]:
    """The ``h`` bit indices (possibly repeated) that ``data`` sets in ``cohort``."""
    base = cohort << 16
    return [mmh3.hash(data, base | i, signed=False) % k for i in range(h)]


def bloom_bits(value: str, cohort: int, k: int, h: int) -> int:
    """The Bloom filter of ``value`` in ``cohort`` as an integer bit vector."""
    bits = 0
    for index in bloom_indices(value_bytes(value), cohort, k, h):
        bits |= 1 << index
    return bits
