"""Strings through the Hadamard count-mean sketch (HCMS), memoized; see
:mod:`veil.shared.kinds.string_oracles`.

The installation's sketch row is its cohort's (``j``). Permanent response of a value
``x`` (stream: purpose ``prr``, context ``fingerprint || 0x00 || be32(j) || utf8(x)``):
the coefficient ``l = randbelow(m)`` first, then a word ``u = u32()``; the bit is
``parity(l & h_j(x))`` (1 where the Hadamard entry ``H[l, h_j(x)]`` is -1) if
``u < N_prr``, otherwise its complement. Instantaneous response (CSPRNG): a word
``u = u32()``; the bit if ``u < N_irr``, otherwise ``randbelow(2)`` read next. Payload:
``2 l + bit``, an integer in ``[0, 2m)``.
"""

from __future__ import annotations

from typing import Any

from veil.client.encoders.hashed_strings import HashedStringEncoder
from veil.client.encoders.oracles import keep_or_fresh, keep_or_other
from veil.shared.kinds import HcmsParams


class HcmsEncoder(HashedStringEncoder[HcmsParams]):
    """HCMS: one Hadamard coefficient of the value's column in the cohort's row, its sign
    flipped with probability ``1 - a`` (memoized), then the instantaneous response."""

    params_type = HcmsParams

    def __init__(self, params: HcmsParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._m = params.columns

    def derive(self, key: bytes) -> int:
        stream = self.prr_stream(key)
        coefficient = stream.randbelow(self._m)
        sign = (coefficient & self.hashed(key, self._m)).bit_count() & 1
        # randomized response over the two bits: the other one is the complement
        return 2 * coefficient + keep_or_other(stream, sign, 2, self._prr)

    def finish(self, permanent: int) -> int:
        return (permanent & ~1) | keep_or_fresh(self.fresh, permanent & 1, 2, self._irr)
