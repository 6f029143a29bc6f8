"""Booleans: Warner's randomized response, memoized per value."""

from __future__ import annotations

from typing import Any

from veil.client.encoders.base import Encoder
from veil.shared.bits import realize
from veil.shared.kinds import BooleanParams
from veil.shared.kinds.boolean import boolean_value


class BooleanEncoder(Encoder[BooleanParams]):
    """Truthful if ``u1 < alpha``, else "yes" if ``u2 < beta``; ``u1``, ``u2`` are the first
    two big-endian 32-bit words of the stream with purpose ``rr`` and context
    ``fingerprint || 0x00 || 0x01`` (true) or ``fingerprint || 0x00 || 0x00`` (false)."""

    params_type = BooleanParams
    name_keyed_in_layout_1 = True

    def memo_key(self, value: Any) -> bytes:
        return b"\x01" if boolean_value(value) else b"\x00"

    def derive(self, key: bytes) -> int:
        stream = self.permanent_stream(b"rr", key)
        truthful = stream.u32() < realize(self.params.alpha)
        yes = stream.u32() < realize(self.params.beta)
        return key[0] if truthful else int(yes)
