"""Bounded numbers: local Laplace, Gaussian, or 1BitMean mean estimation.

Every mechanism first clips the value to ``[low, high]`` and rounds it to a
grid of ``resolution`` equal steps with alpha-point rounding (a threshold drawn
once per installation and metric, so the rounding is unbiased over the
population yet stable for one device). Then, memoized per grid point:

* ``laplace``: adds discrete Laplace noise ``P(z) ~ exp(-epsilon |z| / resolution)``
  in grid units, sampled exactly with integer arithmetic (no floating-point
  Laplace, hence none of its attacks). Pure ``epsilon``-LDP.
* ``gaussian``: adds discrete Gaussian noise, sampled exactly, with sigma set by
  zero-concentrated DP so that the report is ``(epsilon, delta)``-LDP.
* ``1bitmean``: Ding, Kulkarni, Yekhanin (2017): one bit, 1 with probability
  ``(1 + t (e^epsilon - 1)) / (e^epsilon + 1)`` for the grid point ``t`` in [0, 1]
  (realized as ``N / 2**32`` with ``N`` kept off 0 and ``2**32``, so the realized
  epsilon is at most ln(2**32 - 1), about 22.18, whatever larger epsilon is asked).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from veil.shared.bits import PROB_ONE, realize
from veil.shared.errors import ParameterError, WireFormatError
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.boolean import parse_bit
from veil.shared.privacy import round_up, zcdp_gaussian_sigma
from veil.shared.validation import Interval, OneOf, check_fields

MECHANISMS = ("laplace", "gaussian", "1bitmean")


@dataclasses.dataclass(frozen=True)
class NumberParams(MechanismParams):
    """A number in ``[low, high]`` released with ``mechanism`` at ``epsilon`` (and ``delta``)."""

    kind: ClassVar[str] = "number"

    low: float = 0.0
    high: float = 1.0
    mechanism: str = "laplace"
    epsilon: float = 1.0
    delta: float | None = None
    resolution: int = 64

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_fields(
            owner,
            dataclasses.asdict(self),
            {
                "low": Interval(float, None, None),
                "high": Interval(float, None, None),
                "mechanism": OneOf(MECHANISMS),
                "epsilon": Interval(float, 0, 50, "right"),
                "resolution": Interval(int, 1, 1 << 20),
            },
        )
        if not self.low < self.high:
            raise ParameterError(
                "high",
                f"The 'high' parameter of {owner} must be greater than low={self.low!r}. "
                f"Got {self.high!r} instead.",
            )
        if self.mechanism == "gaussian":
            if self.delta is None or not Interval(float, 0, 0.01, "right").accepts(self.delta):
                raise ParameterError(
                    "delta",
                    f"The 'delta' parameter of {owner} must be a number in (0, 0.01] for the "
                    f"gaussian mechanism (try 1e-6). Got {self.delta!r} instead.",
                )
        elif self.delta is not None:
            raise ParameterError(
                "delta",
                f"The 'delta' parameter of {owner} applies only to mechanism='gaussian'; "
                f"remove it for {self.mechanism!r}.",
            )

    @property
    def step(self) -> float:
        """Width of one grid step."""
        return (self.high - self.low) / self.resolution

    @property
    def laplace_scale(self) -> float:
        """Scale ``b`` of the discrete Laplace noise, in grid steps."""
        return self.resolution / self.epsilon

    @property
    def gaussian_sigma(self) -> float:
        """Sigma of the discrete Gaussian noise, in grid steps."""
        assert self.delta is not None
        return zcdp_gaussian_sigma(self.resolution, self.epsilon, self.delta)

    def noise_variance(self) -> float:
        """Variance of the added noise in the value's own units (0 for 1bitmean)."""
        if self.mechanism == "laplace":
            r = math.exp(-1.0 / self.laplace_scale)
            return 2 * r / (1 - r) ** 2 * self.step**2
        if self.mechanism == "gaussian":
            return self.gaussian_sigma**2 * self.step**2
        return 0.0

    def one_bit_numerator(self, grid_point: int) -> int:
        """1BitMean: ``N`` such that grid point ``grid_point`` reports 1 w.p. ``N / 2**32``.

        ``N`` stays in ``[1, 2**32 - 1]``: above epsilon = ln(2**32 - 1), about 22.18, the
        exact probabilities round to 0 and 1, which would make a report certain (no
        privacy at all). Kept off both ends, the realized mechanism has a finite epsilon
        (:attr:`epsilon_1`, at most 22.18), and the end points move by under ``2**-32``.
        """
        e = math.exp(self.epsilon)
        probability = (1 + grid_point / self.resolution * (e - 1)) / (e + 1)
        return min(max(realize(probability), 1), PROB_ONE - 1)

    @property
    def epsilon_1(self) -> float:
        if self.mechanism != "1bitmean":
            return round_up(self.epsilon)
        low, high = self.one_bit_numerator(0), self.one_bit_numerator(self.resolution)
        return round_up(max(math.log(high / low), math.log((PROB_ONE - low) / (PROB_ONE - high))))

    @property
    def epsilon_inf(self) -> float:
        return self.epsilon_1

    def parse_payload(self, payload: Any, field: str = "payload") -> float | int:
        if self.mechanism == "1bitmean":
            return parse_bit(payload, field)
        if isinstance(payload, bool) or not isinstance(payload, int | float):
            raise WireFormatError(field, "must be a JSON number", "wrong_type")
        if isinstance(payload, int) and abs(payload) > 10**300:
            raise WireFormatError(field, "must be a finite number", "out_of_range")
        value = float(payload)
        if not math.isfinite(value) or abs(value) > 1e300:
            raise WireFormatError(field, "must be a finite number", "out_of_range")
        return value
