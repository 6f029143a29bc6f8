"""``ones``: how many 0/1 reports were 1 (booleans, 1BitMean numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import Field, PayloadType, State, Statistic


class OneCounts(Statistic):
    """The count of reports equal to 1; a report is stored as the integer 0 or 1."""

    name: ClassVar[str] = "ones"
    fields = (Field("ones", "count", "ones"),)
    payload_type: ClassVar[PayloadType] = "int"

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> int:
        return int(value)

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        return {"ones": int(stored)}

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        if not len(stored):
            return []
        return [(0, len(stored), {"ones": int(sum(stored))})]

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        if not len(payloads):
            return []
        return [(0, len(payloads), {"ones": int(np.sum(payloads, dtype=np.int64))})]
