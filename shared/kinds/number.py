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
from veil.shared.validation import Interval, OneOf, check_fields, shown_number

#: the mechanisms a number metric may name in its ``mechanism`` field
NUMBER_MECHANISMS = ("laplace", "gaussian", "1bitmean")

#: the probability, at most, that an honest report's noise lies beyond the payload bound
NOISE_TAIL = 2.0**-64
#: largest payload magnitude a metric may produce: sums of squares of 2**63 reports stay finite
MAX_PAYLOAD = 1e100
#: how far off the grid, in grid steps, a payload may be (float rounding of other encoders)
GRID_TOLERANCE = 1e-6
#: the widest float spacing, in grid steps, at an honest payload: the float rounding of
#: ``low + step * n`` and of reading ``n`` back then stays within :data:`GRID_TOLERANCE`
GRID_PRECISION = 2.0**-20
#: the fewest float spacings a grid step spans, so that the grid's points stay distinct
#: after rounding (``low + step * j`` rounds twice, by at most one spacing each way)
MIN_STEP_SPACINGS = 4


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
        for name in ("low", "high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not abs(value) <= MAX_PAYLOAD:
                raise ParameterError(
                    name, f"The {name!r} parameter of {owner} must be a number in "
                          f"[-{MAX_PAYLOAD:g}, {MAX_PAYLOAD:g}] (payloads beyond overflow sums "
                          f"of squares). Got {shown_number(value)} instead.")
        check_fields(
            owner,
            dataclasses.asdict(self),
            {
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
            # a subnormal delta has no finite ln(1/delta) in floats
            if self.delta is None or not Interval(float, sys.float_info.min, 0.01).accepts(
                    self.delta):
                raise ParameterError(
                    "delta",
                    f"The 'delta' parameter of {owner} must be a number in (0, 0.01] for the "
                    f"gaussian mechanism (try 1e-6), no smaller than {sys.float_info.min:.4g} "
                    f"(the smallest normal float). Got {shown_number(self.delta)} instead.",
                )
        elif self.delta is not None:
            raise ParameterError(
                "delta",
                f"The 'delta' parameter of {owner} applies only to mechanism='gaussian'; "
                f"remove it for {self.mechanism!r}.",
            )
        self._check_grid(owner)
        if self.mechanism != "1bitmean":
            self._check_payloads(owner)

    def _check_grid(self, owner: str) -> None:
        """Refuse a grid whose step is no positive normal float, or whose points
        ``low + step * j`` would coincide once rounded to floats (:data:`MIN_STEP_SPACINGS`)."""
        step = self.step
        largest = max(abs(self.low), abs(self.high))
        where = (f"{owner}: the grid step (high - low) / resolution = ({self.high!r} - "
                 f"{self.low!r}) / {self.resolution} = {step!r}")
        if not step >= sys.float_info.min:
            raise ParameterError(
                "high", f"{where} is not a positive normal float (at least "
                        f"{sys.float_info.min:.4g}), so values cannot be placed on the grid; "
                        "widen the range [low, high] or lower resolution.")
        if step < MIN_STEP_SPACINGS * math.ulp(largest):
            raise ParameterError(
                "high", f"{where} is finer than floats near {largest:.6g} can tell apart "
                        f"(their spacing is {math.ulp(largest):.3g}; a step must span "
                        f"{MIN_STEP_SPACINGS}), so grid points would coincide; widen the range "
                        "[low, high], lower resolution, or report values shifted nearer 0.")

    def _check_payloads(self, owner: str) -> None:
        """Refuse laplace or gaussian parameters whose honest payloads could exceed
        :data:`MAX_PAYLOAD`, or could not be read back on the grid: at the largest of them the
        float spacing must stay within :data:`GRID_PRECISION` steps."""
        steps = self._noise_steps
        reach = max(map(abs, self.payload_range)) if math.isfinite(steps) else math.inf
        if not reach <= MAX_PAYLOAD:
            raise ParameterError(
                "epsilon",
                f"{owner}: with low={self.low!r}, high={self.high!r} and "
                f"epsilon={self.epsilon!r}, honest payloads reach {reach:.3g}, "
                f"beyond {MAX_PAYLOAD:g} where sums of squares overflow; narrow the range "
                "or raise epsilon.",
            )
        spacing = math.ulp(reach) / self.step
        if spacing <= GRID_PRECISION:
            return
        if math.ceil(steps) * self.step >= max(abs(self.low), abs(self.high)):
            raise ParameterError(
                "epsilon",
                f"{owner}: honest {self.mechanism} noise reaches {math.ceil(steps):,} grid "
                f"steps (it grows as resolution / epsilon), too many for a payload "
                f"low + step * n to be read back within {GRID_TOLERANCE:g} steps of its grid "
                f"point (floats there are {spacing:.3g} steps apart, at most "
                f"{GRID_PRECISION:.3g}); raise epsilon or lower resolution.")
        raise ParameterError(
            "high",
            f"{owner}: the grid step (high - low) / resolution = {self.step:.6g} is too fine "
            f"for payloads near {reach:.6g} to be read back within {GRID_TOLERANCE:g} steps of "
            f"their grid point (floats there are {spacing:.3g} steps apart, at most "
            f"{GRID_PRECISION:.3g}); widen the range [low, high], lower resolution, or report "
            "values shifted nearer 0.")

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
        return math.ceil(self._noise_steps)

    @property
    def _noise_steps(self) -> float:
        """:attr:`noise_bound` before rounding up (infinite when epsilon is too small for
        floats: the parameters are then refused)."""
        bits = -math.log2(NOISE_TAIL) + 1
        if self.mechanism == "laplace":
            return self.laplace_scale * bits * math.log(2)
        if self.mechanism == "gaussian":
            # the encoder samples with sigma rounded up by 1e-12; 1e-9 covers it
            sigma = self.gaussian_sigma * (1 + 1e-9)
            return sigma * math.sqrt(2 * bits * math.log(2))
        return 0.0

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
