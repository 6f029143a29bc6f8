"""What every sufficient statistic offers: one report's statistic, merging, and its fields.

A metric's collector-side state, per (metric, day, cohort), is the number of
reports plus the fields of its kind's statistic. Every field adds up: merging
two partial statistics adds them field by field, so storage backends, counts
documents and simulations need no knowledge of a kind, only of the field types:

* ``counts``: a vector of non-negative counts whose length the parameters give
  (:meth:`Statistic.length`), kept as little-endian uint64 counters;
* ``count``: one non-negative integer;
* ``real``: one finite float.

``Field.column`` names the aggregate column that holds the field in every
storage backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds.base import COUNTS_LENGTHS, MechanismParams

FieldType = Literal["counts", "count", "real"]
#: what a backend stores per raw report: the payload's bytes, an integer, or a float
PayloadType = Literal["bytes", "int", "float"]
#: one cohort's statistic: field name -> counts vector, count or real
State = dict[str, Any]
#: one instance of every statistic, keyed by its name (what ``params.statistic`` says), in
#: the order defined
STATISTICS: FaceRegistry[Statistic] = FaceRegistry("statistic")


@dataclasses.dataclass(frozen=True)
class Field:
    """One additive field of a statistic: its key in counts documents, type and column."""

    name: str
    type: FieldType
    column: str


@dataclasses.dataclass(frozen=True)
class CohortCounters:
    """Reports counted by cohort, for a statistic whose one field is a counts vector: the
    ``cohorts`` present (sorted, int64), the ``reports`` of each (int64) and their
    ``counters`` (``(len(cohorts), length)`` uint64), row ``i`` that of ``cohorts[i]``."""

    cohorts: np.ndarray
    reports: np.ndarray
    counters: np.ndarray

    def states(self, field: str) -> list[tuple[int, int, State]]:
        """``(cohort, reports, state)`` per cohort, as :meth:`Statistic.accumulate` returns
        them (``field`` names the counts vector)."""
        return [(int(c), int(n), {field: row})
                for c, n, row in zip(self.cohorts, self.reports, self.counters, strict=True)]


class Statistic:
    """The sufficient statistic a kind of metric keeps; subclasses are stateless.

    ``name`` is the statistic's registry key (``params.statistic`` names it), ``fields``
    its additive fields, ``payload_type`` what a store keeps per raw report. A subclass
    that sets its own ``name`` registers an instance of itself in :data:`STATISTICS`.
    """

    name: ClassVar[str] = ""
    fields: ClassVar[tuple[Field, ...]] = ()
    payload_type: ClassVar[PayloadType] = "bytes"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            STATISTICS.add(cls.name, cls())

    @property
    def length_name(self) -> str:
        """What the parameters call the counts vector's length, for error messages (the
        parameter :data:`~veil.shared.kinds.base.COUNTS_LENGTHS` names)."""
        return COUNTS_LENGTHS.get(self.name, "length")

    def length(self, params: MechanismParams) -> int:
        """Length of the ``counts`` field (0 when there is none): the parameter
        :data:`~veil.shared.kinds.base.COUNTS_LENGTHS` names, read by
        :attr:`MechanismParams.counts_length` (a declared registry bounds the counters
        through :meth:`MechanismParams.check_counters`)."""
        return params.counts_length

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> Any:
        """What a store keeps for one validated report (wire ``payload``, parsed ``value``)."""
        raise NotImplementedError

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        """The statistic of one stored report (the slow reference :meth:`accumulate` matches)."""
        raise NotImplementedError

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        """``(cohort, reports, state)`` for each cohort present among stored payloads, sorted."""
        raise NotImplementedError

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        """:meth:`accumulate` of payloads held as one array, as an archive or
        :class:`~veil.server.storage.base.StoredReports` holds them: ``(n, width)`` uint8
        for ``bytes``, ``(n,)`` int64 for ``int``, ``(n,)`` float64 for ``float``.

        The same result as :meth:`accumulate`; this default converts the array to the
        stored payloads it calls that with, and statistics override it with array code.
        """
        return self.accumulate(params, cohorts, payload_list(self.payload_type, payloads))

    def accumulate_counters(self, params: MechanismParams, cohorts: np.ndarray,
                            payloads: np.ndarray) -> CohortCounters | None:
        """:meth:`accumulate_arrays` as arrays, for a statistic whose one field is a counts
        vector (``None`` for any other): a store adds them to its aggregates without a
        Python object per cohort."""
        return None

    def zero(self, params: MechanismParams) -> State:
        """The statistic of no reports."""
        out: State = {}
        for field in self.fields:
            if field.type == "counts":
                out[field.name] = np.zeros(self.length(params), dtype=np.uint64)
            else:
                out[field.name] = 0 if field.type == "count" else 0.0
        return out

    def merge(self, left: State, right: State) -> State:
        """The statistic of two disjoint sets of reports."""
        return {field.name: left[field.name] + right[field.name] for field in self.fields}

    def to_entry(self, state: State) -> dict[str, Any]:
        """The state as JSON-ready fields of a counts document's cohort entry."""
        out: dict[str, Any] = {}
        for field in self.fields:
            value = state[field.name]
            if field.type == "counts":
                out[field.name] = np.asarray(value).tolist()
            elif field.type == "count":
                out[field.name] = int(value)
            else:
                out[field.name] = float(value)
        return out

    def from_entry(self, params: MechanismParams, entry: Mapping[str, Any], reports: int,
                   where: str) -> State:
        """Check a cohort entry's fields (``where`` names it in errors) and return its state."""
        state: State = {}
        for field in self.fields:
            name = f"{where}.{field.name}"
            value = entry.get(field.name)
            if field.type == "counts":
                length = self.length(params)
                if not isinstance(value, list) or len(value) != length:
                    size = len(value) if isinstance(value, list) else "no"
                    raise ParameterError(
                        name, f"must list {self.length_name}={length} counts; got {size}")
                counts = [_count(v, f"{name}[{i}]") for i, v in enumerate(value)]
                if max(counts, default=0) > reports:
                    raise ParameterError(name, f"a count exceeds the cohort's {reports} reports")
                state[field.name] = np.array(counts, dtype=np.int64)
            elif field.type == "count":
                count = _count(value, name)
                if count > reports:
                    raise ParameterError(name, f"{count} exceeds the cohort's {reports} reports")
                state[field.name] = count
            else:
                if isinstance(value, bool) or not isinstance(value, int | float) \
                        or not np.isfinite(value):
                    raise ParameterError(name, f"must be a finite number; got {value!r}")
                state[field.name] = float(value)
        self.check(state, where)
        return state

    def check(self, state: State, where: str) -> None:
        """Further consistency checks of one entry's state (none by default)."""


def payload_list(payload_type: PayloadType, payloads: np.ndarray) -> list[Any]:
    """An array of payloads (as :meth:`Statistic.accumulate_arrays` takes them) as the
    list of stored payloads a backend keeps: ``bytes``, ``int`` or ``float`` objects."""
    if payload_type == "bytes":
        rows = np.ascontiguousarray(payloads, dtype=np.uint8)
        return [row.tobytes() for row in rows]
    values: list[Any] = np.asarray(
        payloads, dtype=np.int64 if payload_type == "int" else np.float64).tolist()
    return values


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParameterError(name, f"must be a non-negative integer; got {value!r}")
    return value
