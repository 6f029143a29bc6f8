"""Strings: Bloom filter in the installation's cohort, then PRR, then IRR."""

from __future__ import annotations

from typing import Any

from veil.client.encoders.base import Encoder
from veil.client.encoders.rappor import BitRappor
from veil.shared.bits import bits_to_hex
from veil.shared.hashing import bloom_indices, value_bytes
from veil.shared.kinds import StringParams


class StringEncoder(Encoder[StringParams]):
    """Bloom-filter RAPPOR. The PRR stream has purpose ``prr`` and context
    ``fingerprint || 0x00 || be32(cohort) || utf8(value)``."""

    params_type = StringParams
    name_keyed_in_layout_1 = True

    def __init__(self, params: StringParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.rappor = BitRappor(params.k, params.p, params.q, params.f)
        assert self.cohort is not None
        self._cohort_bytes = self.cohort.to_bytes(4, "big")

    def memo_key(self, value: Any) -> bytes:
        return value_bytes(value)

    def bloom(self, data: bytes) -> int:
        """The Bloom filter of the UTF-8 ``data`` in this installation's cohort, hashed
        as the parameters' ``hashing`` says."""
        bits = 0
        params = self.params
        for index in bloom_indices(data, self.cohort or 0, params.k, params.h, params.hashing):
            bits |= 1 << index
        return bits

    def derive(self, key: bytes) -> int:
        stream = self.permanent_stream(b"prr", self._cohort_bytes + key)
        return self.rappor.prr(self.bloom(key), stream)

    def finish(self, permanent: int) -> str:
        return bits_to_hex(self.rappor.irr(permanent, self.fresh), self.params.k)
