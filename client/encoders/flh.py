"""Strings through fast local hashing (FLH), memoized; see :mod:`veil.shared.kinds.string_oracles`.

The installation's hash function is its cohort's (``j``). Permanent response of a value
``x`` (stream: purpose ``prr``, context ``fingerprint || 0x00 || be32(j) || utf8(x)``):
a word ``u = u32()``; the bucket ``h_j(x)`` if ``u < N_prr``, otherwise ``r + (r >= h)``
for ``r = randbelow(g - 1)`` read next (uniform among the other ``g - 1`` buckets).
Instantaneous response (CSPRNG): a word ``u = u32()``; the bucket if ``u < N_irr``,
otherwise ``randbelow(g)`` read next. Payload: the bucket, an integer in ``[0, g)``.
"""

from __future__ import annotations

from typing import Any

from veil.client.encoders.hashed_strings import HashedStringEncoder
from veil.client.encoders.oracles import keep_or_fresh, keep_or_other
from veil.shared.kinds import FlhParams


class FlhEncoder(HashedStringEncoder[FlhParams]):
    """FLH: the value's bucket under the cohort's hash function, through GRR over ``g``
    (memoized), then the instantaneous response (see the module docstring)."""

    params_type = FlhParams

    def __init__(self, params: FlhParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._g = params.buckets

    def derive(self, key: bytes) -> int:
        return keep_or_other(self.prr_stream(key), self.hashed(key, self._g), self._g,
                             self._prr)

    def finish(self, permanent: int) -> int:
        return keep_or_fresh(self.fresh, permanent, self._g, self._irr)
