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
from veil.shared.statistics.base import CohortCounters, Field, PayloadType, State, Statistic


class ResponseCounts(Statistic):
    """Counts of each integer payload; a report is stored as its integer.

    Subclasses count another index of each report (:meth:`index`, :meth:`indices`,
    :meth:`index_array`) into their own field.
    """

    name: ClassVar[str] = "responses"
    fields = (Field("responses", "counts", "bit_counts"),)
    payload_type: ClassVar[PayloadType] = "int"

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> Any:
        return int(value)

    def index(self, stored: Any) -> int:
        """The counter one stored report adds to."""
        return int(stored)

    def indices(self, stored: Sequence[Any]) -> np.ndarray:
        """:meth:`index` of each stored report, as int64."""
        return np.asarray(stored, dtype=np.int64)

    def index_array(self, payloads: np.ndarray) -> np.ndarray:
        """:meth:`index` of each payload held as :meth:`accumulate_arrays` takes them."""
        return np.asarray(payloads, dtype=np.int64)

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        counts = np.zeros(self.length(params), dtype=np.uint64)
        counts[self.index(stored)] = 1
        return {self.fields[0].name: counts}

    def from_entry(self, params: MechanismParams, entry: Mapping[str, Any], reports: int,
                   where: str) -> State:
        """As for every counts vector, and the counts add up to the cohort's reports (each
        report adds to exactly one counter)."""
        state = super().from_entry(params, entry, reports, where)
        field = self.fields[0].name
        total = int(np.sum(state[field]))
        if total != reports:
            raise ParameterError(f"{where}.{field}",
                                 f"the counts add up to {total}, not the cohort's {reports} reports")
        return state

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        if not len(stored):
            return []
        return self._count(params, cohorts, self.indices(stored)).states(self.fields[0].name)

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        if not len(payloads):
            return []
        return self._count(params, cohorts, self.index_array(payloads)).states(self.fields[0].name)

    def accumulate_counters(self, params: MechanismParams, cohorts: np.ndarray,
                            payloads: np.ndarray) -> CohortCounters:
        return self._count(params, cohorts, self.index_array(payloads))

    def _count(self, params: MechanismParams, cohorts: np.ndarray, indices: np.ndarray,
               ) -> CohortCounters:
        """The counters of each cohort present from each report's index."""
        length = self.length(params)
        cohorts = np.asarray(cohorts, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= length):
            raise ValueError(f"a stored payload's index lies outside [0, {length})")
        keys, index = np.unique(cohorts, return_inverse=True)
        counts = np.bincount(index.reshape(-1) * length + indices,
                             minlength=len(keys) * length).reshape(len(keys), length)
        reports = np.bincount(index.reshape(-1), minlength=len(keys)).astype(np.int64)
        return CohortCounters(keys, reports, counts.astype(np.uint64))
