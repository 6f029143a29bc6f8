"""What the cohort-hashed string encoders (FLH, HCMS) share: each installation's cohort
picks the hash function ``h_j``; a value's memoized response reads the stream of purpose
``prr`` and context ``fingerprint || 0x00 || be32(j) || utf8(x)``."""

from __future__ import annotations

from typing import Any, TypeVar

from veil.client.encoders.base import Encoder
from veil.client.randomness import HmacStream
from veil.shared.hashing import value_bytes
from veil.shared.kinds.string_oracles import StringOracleParams, bucket, value_key

S = TypeVar("S", bound=StringOracleParams)


class HashedStringEncoder(Encoder[S]):
    """The memo key (the value's UTF-8 bytes), the cohort's hash and the realized
    numerators ``N_prr`` and ``N_irr``."""

    def __init__(self, params: S, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        assert self.cohort is not None
        self._cohort_bytes = self.cohort.to_bytes(4, "big")
        self._prr = params.prr_numerator
        self._irr = params.irr_numerator

    def memo_key(self, value: Any) -> bytes:
        return value_bytes(value)

    def prr_stream(self, key: bytes) -> HmacStream:
        """The permanent response's stream for the value whose UTF-8 bytes are ``key``."""
        return self.permanent_stream(b"prr", self._cohort_bytes + key)

    def hashed(self, key: bytes, size: int) -> int:
        """``h_j(x)`` in ``[0, size)`` under the cohort's hash function ``j``."""
        assert self.cohort is not None
        return bucket(self.cohort, value_key(key), size)
