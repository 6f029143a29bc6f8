"""Discovery channels of string metrics: local hashing of one prefix segment per level.

See :mod:`veil.shared.kinds.discovery` for the mechanism. The installation's level is
its cohort (``cohort_seed % levels``), so it reports the same level of every value.
"""

from __future__ import annotations

from typing import Any

from veil.client.encoders.base import Encoder
from veil.client.encoders.oracles import keep_or_fresh, keep_or_other
from veil.client.randomness import HmacStream
from veil.shared.hashing import value_bytes
from veil.shared.kinds import DiscoveryParams


class DiscoveryEncoder(Encoder[DiscoveryParams]):
    """Local hashing over GF(2) of the value's vector ``x`` at the installation's level;
    payload: the ``t`` rows of the hash matrix ``A`` (each ``row_bytes`` big-endian), then
    the bucket as one byte, in hex.

    ``x`` is :meth:`DiscoveryParams.vector` of the padded value (its UTF-8 bytes cut at
    ``max_length``, :meth:`DiscoveryParams.padded`) at the level, which depends only on the
    value's first ``level + 1`` segments: those bytes are the memo key, so values that share
    them share one permanent response and cost nothing more. Permanent response (memoized
    per key), from the :class:`~veil.client.randomness.HmacStream` with purpose ``prr`` and
    context ``fingerprint || 0x00 || key`` (the 16 hex digits of the parameters'
    fingerprint, ASCII, as for the category oracles): the ``t`` rows first, row ``i`` being
    ``randbelow(2**D)`` (the top ``D`` bits of ``ceil(D / 8)`` big-endian bytes, never
    rejected); bit ``i`` of the bucket ``h`` is the parity of ``popcount(row_i & x)``. Then a
    word ``u = u32()``: the bucket stays ``h`` if ``u < N_prr``, otherwise it is ``r + (r >= h)``
    for ``r = randbelow(g - 1)`` read next (uniform among the other ``g - 1`` buckets). The
    memoized response is the pair (rows, bucket). Instantaneous response (CSPRNG): a word
    ``u = u32()``; the bucket if ``u < N_irr``, otherwise ``randbelow(g)`` read next.
    """

    params_type = DiscoveryParams

    def __init__(self, params: DiscoveryParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        assert self.cohort is not None and params.bucket_bits is not None
        self.level = self.cohort
        self._prr, self._irr = params.numerators
        self._g = params.buckets
        self._rows = params.bucket_bits
        self._domain = 1 << params.domain_bits
        self._row_bytes = params.row_bytes

    def memo_key(self, value: Any) -> bytes:
        """The first ``level + 1`` segments of the padded value (all the report depends on);
        :class:`~veil.shared.errors.ParameterError` naming ``value`` if it is not a string."""
        params = self.params
        return params.padded(value_bytes(value))[: (self.level + 1) * params.segment]

    def prr_stream(self, key: bytes) -> HmacStream:
        """The permanent response's stream for the memo key ``key``."""
        return self.permanent_stream(b"prr", key)

    def derive(self, key: bytes) -> tuple[bytes, int]:
        params = self.params
        x = params.vector(key, self.level)
        stream = self.prr_stream(key)
        rows = [stream.randbelow(self._domain) for _ in range(self._rows)]
        hashed = sum(((row & x).bit_count() & 1) << i for i, row in enumerate(rows))
        bucket = keep_or_other(stream, hashed, self._g, self._prr)
        return b"".join(row.to_bytes(self._row_bytes, "big") for row in rows), bucket

    def finish(self, permanent: tuple[bytes, int]) -> str:
        rows, bucket = permanent
        return (rows + bytes((keep_or_fresh(self.fresh, bucket, self._g, self._irr),))).hex()


__all__ = ["DiscoveryEncoder"]
