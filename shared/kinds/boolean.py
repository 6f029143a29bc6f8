"""Yes/no values: Warner's randomized response, memoized per value."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from veil.shared.bits import PROB_ONE, check_realized, realized
from veil.shared.errors import ParameterError, WireFormatError, type_name
from veil.shared.kinds.base import MechanismParams
from veil.shared.privacy import binary_rr_epsilon, format_epsilon
from veil.shared.validation import Interval, check_fields

#: the names NumPy gives its boolean scalar type (``numpy.bool_``, ``numpy.bool`` from 2.0)
NUMPY_BOOLEANS = ("bool_", "bool")


def as_boolean(value: Any) -> bool | None:
    """``value`` as a yes/no value if it is one: ``True``, ``False``, or NumPy's boolean
    scalar (recognised by its type's module and name, so that this imports no NumPy);
    ``None`` otherwise."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if getattr(kind, "__module__", None) == "numpy" and kind.__name__ in NUMPY_BOOLEANS:
        return bool(value)
    return None


def boolean_value(value: Any) -> bool:
    """:func:`as_boolean`, or a :class:`ParameterError` (field ``value``) naming the type of
    ``value`` (never the value) when it is no yes/no value."""
    answer = as_boolean(value)
    if answer is None:
        raise ParameterError("value", f"must be True or False; got {type_name(value)}")
    return answer


def parse_bit(payload: Any, field: str) -> int:
    """A payload that must be the JSON integer 0 or 1."""
    if isinstance(payload, bool) or payload not in (0, 1) or isinstance(payload, float):
        raise WireFormatError(field, "must be the integer 0 or 1", "wrong_type")
    return int(payload)


@dataclasses.dataclass(frozen=True)
class BooleanParams(MechanismParams):
    """Answer truthfully with probability ``alpha``, otherwise say yes with probability ``beta``.

    The answer is memoized per value, so repeating it reveals nothing more:
    ``epsilon_1 == epsilon_inf``. Defaults (alpha=0.5, beta=0.5) give epsilon = ln 3.
    """

    kind: ClassVar[str] = "boolean"

    alpha: float = 0.5
    beta: float = 0.5

    def __post_init__(self) -> None:
        check_fields(
            type(self).__name__,
            dataclasses.asdict(self),
            {"alpha": Interval(float, 0, 1, "left"), "beta": Interval(float, 0, 1, "neither")},
        )
        check_realized(type(self).__name__, "alpha", self.alpha, zero=True)
        check_realized(type(self).__name__, "beta", self.beta)

    @property
    def yes_probs(self) -> tuple[float, float]:
        """``(P(yes | false), P(yes | true))`` for the realized alpha and beta."""
        alpha, beta = realized(self.alpha), realized(self.beta)
        return (1 - alpha) * beta, alpha + (1 - alpha) * beta

    @property
    def statistic(self) -> str:
        return "ones"

    @property
    def epsilon_1(self) -> float:
        yes_given_no, yes_given_yes = self.yes_probs
        return binary_rr_epsilon(yes_given_yes, yes_given_no)

    @property
    def epsilon_inf(self) -> float:
        return self.epsilon_1

    @property
    def possible_values(self) -> tuple[int | None, str]:
        return 2, "answers (true and false)"

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        return parse_bit(payload, field)

    @classmethod
    def for_epsilon(cls, epsilon: float) -> BooleanParams:
        """Parameters (beta = 1/2) whose epsilon is at most ``epsilon``: ``alpha =
        tanh(epsilon / 2)`` on the encoders' grid of ``N / 2**32``, rounded down (towards
        more privacy), as the other pickers round; a target above what the grid holds gets
        its largest ``alpha`` (epsilon about 22.9)."""
        if not epsilon > 0:
            raise ParameterError("epsilon", f"must be > 0; got {epsilon!r}")
        numerator = min(math.floor(math.tanh(epsilon / 2) * PROB_ONE), PROB_ONE - 1)
        if numerator < 1:
            least = binary_rr_epsilon(0.5 + 0.5 / PROB_ONE, 0.5 - 0.5 / PROB_ONE)
            raise ParameterError("epsilon", f"must be at least {format_epsilon(least, 4)}, the "
                                            "least a probability of 32 bits realizes; got "
                                            f"{epsilon!r}")
        return cls(alpha=numerator / PROB_ONE, beta=0.5)
