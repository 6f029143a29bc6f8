"""``moments``: the sum and sum of squares of numeric reports (Laplace, Gaussian numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import Field, PayloadType, State, Statistic


class Moments(Statistic):
    """Sum and sum of squares; a report is stored as its (grid-snapped) float value."""

    name: ClassVar[str] = "moments"
    fields = (Field("sum", "real", "sum"), Field("sum_squares", "real", "sum_squares"))
    payload_type: ClassVar[PayloadType] = "float"

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> float:
        return float(value)

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        value = float(stored)
        return {"sum": value, "sum_squares": value * value}

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        return self.accumulate_arrays(
            params, cohorts, np.fromiter(stored, dtype=np.float64, count=len(stored)))

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        if not len(payloads):
            return []
        values = np.asarray(payloads, dtype=np.float64)
        return [(0, len(values), {"sum": float(values.sum()),
                                  "sum_squares": float(np.dot(values, values))})]

    def check(self, state: State, where: str) -> None:
        if state["sum_squares"] < 0:
            raise ParameterError(f"{where}.sum_squares", "must not be negative")
