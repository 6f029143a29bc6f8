"""Yes/no values: Warner's randomized response, memoized per value."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from veil.shared.bits import realized
from veil.shared.errors import ParameterError, WireFormatError
from veil.shared.kinds.base import MechanismParams
from veil.shared.privacy import binary_rr_epsilon
from veil.shared.validation import Interval, check_fields


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
        """Parameters (beta = 1/2) whose epsilon is ``epsilon``."""
        if not epsilon > 0:
            raise ParameterError("epsilon", f"must be > 0; got {epsilon!r}")
        return cls(alpha=math.tanh(epsilon / 2), beta=0.5)
