"""Bounded numbers: alpha-point rounding to a grid, then memoized exact noise or one bit."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from veil.client.encoders.base import Encoder
from veil.client.encoders.sampling import discrete_gaussian, discrete_laplace
from veil.shared.bits import PROB_ONE
from veil.shared.kinds import NumberParams
from veil.shared.kinds.number import real_number


class NumberEncoder(Encoder[NumberParams]):
    """See :mod:`veil.shared.kinds.number` for the mechanisms.

    The rounding threshold is the first big-endian 32-bit word of the stream with
    purpose ``alpha`` and context ``fingerprint || 0x00``; the noise for grid point ``j``
    comes from the stream with purpose ``noise`` and context ``fingerprint || 0x00 ||
    be32(j)`` (:meth:`~Encoder.permanent_stream`).
    """

    params_type = NumberParams
    name_keyed_in_layout_1 = True

    def __init__(self, params: NumberParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._threshold = self.permanent_stream(b"alpha", b"").u32()
        if params.mechanism == "laplace":
            self._scale = Fraction(params.resolution) / Fraction(params.epsilon)
        elif params.mechanism == "gaussian":
            # never below the calibrated sigma: round the rational up
            self._sigma2 = Fraction(params.gaussian_sigma * (1 + 1e-12)) ** 2

    def grid_point(self, value: Any) -> int:
        """Clip ``value`` (any real number: :func:`~veil.shared.kinds.number.real_number`) to
        [low, high] and round it to a grid point in ``0..resolution``."""
        p = self.params
        x = real_number(value)  # beyond the float range: the largest float, clipped below
        position = (min(max(x, p.low), p.high) - p.low) / p.step
        below = min(math.floor(position), p.resolution)
        up = (position - below) * PROB_ONE > self._threshold
        return min(below + up, p.resolution)

    def memo_key(self, value: Any) -> bytes:
        return self.grid_point(value).to_bytes(4, "big")

    def derive(self, key: bytes) -> float | int:
        p = self.params
        j = int.from_bytes(key, "big")
        stream = self.permanent_stream(b"noise", key)
        if p.mechanism == "1bitmean":
            return int(stream.u32() < p.one_bit_numerator(j))
        if p.mechanism == "laplace":
            noise = discrete_laplace(stream, self._scale)
        else:
            noise = discrete_gaussian(stream, self._sigma2)
        return p.low + p.step * (j + noise)
