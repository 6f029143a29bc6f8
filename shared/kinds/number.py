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

A ``laplace`` or ``gaussian`` payload is ``low + step * n`` for an integer ``n``: the
grid point plus the noise. The collector refuses any other payload, and any ``n``
outside ``[-noise_bound, resolution + noise_bound]``: honest noise exceeds
:attr:`NumberParams.noise_bound` with probability below ``2**-64`` (:data:`NOISE_TAIL`),
so an honest report is refused essentially never, while one forged report can move
a sum by at most ``(resolution + 2 noise_bound) step`` and never to infinity.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import math
import numbers
import sys
from typing import Any, ClassVar

from veil.shared.bits import PROB_ONE, realize
from veil.shared.errors import ParameterError, WireFormatError, type_name
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.boolean import parse_bit
from veil.shared.privacy import round_up, zcdp_gaussian_sigma
from veil.shared.validation import Interval, OneOf, check_fields

#: the mechanisms a number metric may name in its ``mechanism`` field
NUMBER_MECHANISMS = ("laplace", "gaussian", "1bitmean")

#: the probability, at most, that an honest report's noise lies beyond the payload bound
NOISE_TAIL = 2.0**-64
#: largest payload magnitude a metric may produce: sums of squares of 2**63 reports stay finite
MAX_PAYLOAD = 1e100
#: how far off the grid, in grid steps, a payload may be (float rounding of other encoders)
GRID_TOLERANCE = 1e-6


def real_number(value: Any) -> float:
    """``value``, a real number, as a float: any :class:`numbers.Real` but a bool (``int``,
    ``float``, ``Fraction``, NumPy's integers and floats) and a :class:`decimal.Decimal`. A
    finite value beyond the float range becomes the largest float of its sign (every user
    clips it). A :class:`ParameterError` (field ``value``) for anything else, naming its type,
    or for a value that is not finite (``nan``, ``inf`` or ``-inf``); never the value."""
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            shown = "nan" if value.is_nan() else "-inf" if value.is_signed() else "inf"
            raise ParameterError("value", f"must be a finite number; got {shown}")
        x = float(value)  # a finite Decimal beyond the float range gives an infinity
        return x if math.isfinite(x) else math.copysign(sys.float_info.max, x)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterError("value", f"must be a number; got {type_name(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int or a Fraction beyond the float range
        return -sys.float_info.max if value < 0 else sys.float_info.max
    if not math.isfinite(x):
        raise ParameterError("value", f"must be a finite number; got {x}")
    return x


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
                "mechanism": OneOf(NUMBER_MECHANISMS),
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
        if self.mechanism != "1bitmean":
            low, high = self.payload_range
            if not max(abs(low), abs(high)) <= MAX_PAYLOAD:
                raise ParameterError(
                    "epsilon",
                    f"{owner}: with low={self.low!r}, high={self.high!r} and "
                    f"epsilon={self.epsilon!r}, honest payloads reach {max(-low, high):.3g}, "
                    f"beyond {MAX_PAYLOAD:g} where sums of squares overflow; narrow the range "
                    "or raise epsilon.",
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

    @property
    def noise_bound(self) -> int:
        """Largest noise, in grid steps, a payload may carry (0 for 1bitmean).

        Discrete Laplace: ``P(|Z| > z) = 2 r^(z+1) / (1 + r)`` with ``r = exp(-1/b)``, below
        ``2**-64`` for ``z = 65 b ln 2``. Discrete Gaussian: sub-Gaussian with variance proxy
        ``sigma**2`` (Canonne, Kamath, Steinke 2020), so ``P(|Z| > z) <= 2 exp(-z**2 / (2
        sigma**2))``, below ``2**-64`` for ``z = sigma sqrt(130 ln 2)``.
        """
        bits = -math.log2(NOISE_TAIL) + 1
        if self.mechanism == "laplace":
            return math.ceil(self.laplace_scale * bits * math.log(2))
        if self.mechanism == "gaussian":
            # the encoder samples with sigma rounded up by 1e-12; 1e-9 covers it
            sigma = self.gaussian_sigma * (1 + 1e-9)
            return math.ceil(sigma * math.sqrt(2 * bits * math.log(2)))
        return 0

    @functools.cached_property
    def payload_range(self) -> tuple[float, float]:
        """Smallest and largest payload an honest laplace or gaussian report carries (computed
        once: :meth:`parse_payload` checks every report against it)."""
        return (self.low - self.noise_bound * self.step,
                self.low + (self.resolution + self.noise_bound) * self.step)

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
    def statistic(self) -> str:
        return "ones" if self.mechanism == "1bitmean" else "moments"

    @property
    def epsilon_1(self) -> float:
        if self.mechanism != "1bitmean":
            return round_up(self.epsilon)
        low, high = self.one_bit_numerator(0), self.one_bit_numerator(self.resolution)
        return round_up(max(math.log(high / low), math.log((PROB_ONE - low) / (PROB_ONE - high))))

    @property
    def epsilon_inf(self) -> float:
        return self.epsilon_1

    @property
    def possible_values(self) -> tuple[int | None, str]:
        return (self.resolution + 1, f"grid points from {self.low:g} to {self.high:g} (each "
                                     "value is rounded to one)")

    def parse_payload(self, payload: Any, field: str = "payload") -> float | int:
        if self.mechanism == "1bitmean":
            return parse_bit(payload, field)
        if isinstance(payload, bool) or not isinstance(payload, int | float):
            raise WireFormatError(field, "must be a JSON number", "wrong_type")
        low, high = self.payload_range
        if not low <= payload <= high:
            raise WireFormatError(
                field,
                f"must be in [{low:.6g}, {high:.6g}]: the range in which honest {self.mechanism} "
                "noise keeps a report (except with probability below 2**-64)",
                "out_of_range",
            )
        position = (float(payload) - self.low) / self.step
        n = round(position)
        if abs(position - n) > GRID_TOLERANCE:
            raise WireFormatError(
                field,
                f"must be low + step * n for an integer n (low={self.low!r}, "
                f"step={self.step!r}): {self.mechanism} reports lie on the metric's grid",
                "off_grid",
            )
        return self.low + self.step * n
