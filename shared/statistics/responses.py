"""``responses``: per cohort, how many reports carried each payload (frequency oracles).

The payload of a GRR, OLH or Hadamard report is one integer in ``[0, responses)``
(``params.responses``); the counts vector has one counter per possible payload.
The decoders turn it into support counts per category
(:mod:`veil.server.analysis.oracles`).

The vector lives in the ``bit_counts`` aggregate column, the counter column the
``bits`` statistic uses: a metric keeps one statistic, so the two never share a
row, and the stores need no column of their own for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import Field, PayloadType, State, Statistic


class ResponseCounts(Statistic):
    """Counts of each integer payload; a report is stored as its integer."""

    name: ClassVar[str] = "responses"
    fields = (Field("responses", "counts", "bit_counts"),)
    payload_type: ClassVar[PayloadType] = "int"
    length_name: ClassVar[str] = "responses"

    def length(self, params: MechanismParams) -> int:
        return int(params.responses)  # type: ignore[attr-defined]

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> int:
        return int(value)

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        counts = np.zeros(self.length(params), dtype=np.uint64)
        counts[int(stored)] = 1
        return {"responses": counts}

    def from_entry(self, params: MechanismParams, entry: Mapping[str, Any], reports: int,
                   where: str) -> State:
        """As for every counts vector, and the counts add up to the cohort's reports (each
        report carries exactly one payload)."""
        state = super().from_entry(params, entry, reports, where)
        total = int(np.sum(state["responses"]))
        if total != reports:
            raise ParameterError(f"{where}.responses",
                                 f"the counts add up to {total}, not the cohort's {reports} reports")
        return state

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        if not len(stored):
            return []
        return self.accumulate_arrays(params, cohorts, np.asarray(stored, dtype=np.int64))

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        if not len(payloads):
            return []
        length = self.length(params)
        cohorts = np.asarray(cohorts, dtype=np.int64)
        payloads = np.asarray(payloads, dtype=np.int64)
        if payloads.min() < 0 or payloads.max() >= length:
            raise ValueError(f"a stored payload lies outside [0, {length})")
        keys, index = np.unique(cohorts, return_inverse=True)
        counts = np.bincount(index.reshape(-1) * length + payloads,
                             minlength=len(keys) * length).reshape(len(keys), length)
        reports = np.bincount(index.reshape(-1), minlength=len(keys))
        return [(int(c), int(n), {"responses": row.astype(np.uint64)})
                for c, n, row in zip(keys, reports, counts, strict=True)]
