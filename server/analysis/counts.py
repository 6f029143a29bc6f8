"""The counts document (the collector's sufficient statistics) as checked arrays.

A counts document is what ``GET /v1/metrics/<name>/counts`` returns and what
``open_storage(path).counts(metric)`` gives locally: the metric's parameters,
the total number of reports and one entry per cohort, and optionally ``days``: the
UTC days whose reports the counts hold (the decode's ``start`` and ``end`` are then
the first and last of them, not the range asked for). :func:`counts_arrays`
validates one and returns NumPy arrays; :func:`counts_document` builds one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds import KINDS, MechanismParams, StringParams, params_from_dict
from veil.shared.registry import METRIC_KEYS
from veil.shared.statistics import statistic_for

#: a UTC day as counts documents write it
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclasses.dataclass(frozen=True)
class CountsArrays:
    """One metric's counts: ``reports[j]`` per cohort and its statistic's fields.

    ``start`` and ``end`` are the first and last day of ``days`` (the days with reports)
    when the document lists them, else the range it was asked for (``None`` if open).

    ``fields`` maps each field of the metric's statistic (:mod:`veil.shared.statistics`)
    to an array indexed by cohort: ``(cohorts, length)`` for a counts vector,
    ``(cohorts,)`` for a count or a real. :attr:`ones`, :attr:`sums` and
    :attr:`sum_squares` name the fields the decoders read.
    """

    metric: str
    params: MechanismParams
    reports: np.ndarray
    fields: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    start: str | None = None
    end: str | None = None
    source: str = "counts document"
    days: tuple[str, ...] | None = None
    description: str = ""

    @property
    def total_reports(self) -> int:
        """Reports over all cohorts."""
        return int(self.reports.sum())

    @property
    def ones(self) -> np.ndarray:
        """Set-bit counts ``(cohorts, k)`` (bits) or counts of 1 per cohort (ones)."""
        return self.fields["ones"]

    @property
    def sums(self) -> np.ndarray:
        """Sum of the reports per cohort (moments)."""
        return self.fields["sum"]

    @property
    def sum_squares(self) -> np.ndarray:
        """Sum of the squared reports per cohort (moments)."""
        return self.fields["sum_squares"]


def _fail(source: str, field: str, message: str) -> ParameterError:
    return ParameterError(field, f"{source}: {field}: {message}")


def _count(value: Any, source: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(source, field, f"must be a non-negative integer; got {value!r}")
    return value


def _params(document: Mapping[str, Any], source: str) -> MechanismParams:
    raw = document.get("params")
    if not isinstance(raw, Mapping):
        raise _fail(source, "params", "must be an object with the metric's kind and parameters")
    kind = raw.get("kind", document.get("kind"))
    if kind not in KINDS:
        raise _fail(source, "params.kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    # the metric's own keys (Metric.to_dict) around its parameters
    settings = {key: value for key, value in raw.items() if key not in METRIC_KEYS}
    try:
        return params_from_dict({**settings, "kind": kind})
    except ParameterError as exc:
        raise _fail(source, f"params.{exc.field}", exc.message) from None
    except TypeError as exc:
        raise _fail(source, "params", str(exc)) from None


def counts_arrays(document: Mapping[str, Any], source: str = "counts document") -> CountsArrays:
    """Validate a counts document and return its arrays.

    Errors name ``source`` (a file name or URL) and the offending field, and
    give the sizes when dimensions disagree.
    """
    if not isinstance(document, Mapping):
        raise _fail(source, "document", "must be a JSON object")
    params = _params(document, source)
    cohorts = document.get("cohorts")
    if not isinstance(cohorts, list):
        raise _fail(source, "cohorts", "must be a list with one entry per cohort")
    if len(cohorts) != params.cohorts:
        raise _fail(
            source, "cohorts",
            f"has {len(cohorts)} entries but the {params.kind} parameters have "
            f"{params.cohorts} cohort(s)",
        )
    statistic = statistic_for(params)
    reports = np.zeros(params.cohorts, dtype=np.int64)
    states = []
    for j, entry in enumerate(cohorts):
        where = f"cohorts[{j}]"
        if not isinstance(entry, Mapping):
            raise _fail(source, where, "must be an object")
        if entry.get("cohort", j) != j:
            raise _fail(source, f"{where}.cohort",
                        f"must be {j} (cohorts in order); got {entry.get('cohort')!r}")
        reports[j] = n = _count(entry.get("reports"), source, f"{where}.reports")
        try:
            states.append(statistic.from_entry(params, entry, n, where))
        except ParameterError as exc:
            raise _fail(source, exc.field, exc.message) from None
    fields = {
        field.name: np.array([state[field.name] for state in states],
                             dtype=np.float64 if field.type == "real" else np.int64)
        for field in statistic.fields
    }
    days = _days(document.get("days"), source)
    total = document.get("reports", int(reports.sum()))
    if _count(total, source, "reports") != int(reports.sum()):
        raise _fail(source, "reports", f"says {total} but the cohorts add up to {int(reports.sum())}")
    return CountsArrays(
        metric=str(document.get("metric", "")),
        params=params,
        reports=reports,
        fields=fields,
        start=days[0] if days else document.get("start"),
        end=days[-1] if days else document.get("end"),
        source=source,
        days=days,
        description=str(document["params"].get("description") or ""),
    )


def _days(value: Any, source: str) -> tuple[str, ...] | None:
    """The document's ``days`` (UTC days written YYYY-MM-DD), sorted; None if absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(day, str) and DAY.fullmatch(day) for day in value
    ):
        raise _fail(source, "days", f"must be a list of days written YYYY-MM-DD; got {value!r}")
    return tuple(sorted(value))


def counts_document(
    params: StringParams | MechanismParams,
    reports: np.ndarray,
    ones: np.ndarray,
    metric: str = "rappor",
    field: str = "ones",
) -> dict[str, Any]:
    """A counts document from arrays: ``reports`` per cohort and each cohort's counts vector
    ``ones`` (the field named ``field``: set-bit counts, or an oracle's ``responses``)."""
    reports = np.asarray(reports, dtype=np.int64).reshape(-1)
    ones = np.asarray(ones, dtype=np.int64).reshape(len(reports), -1)
    return {
        "metric": metric,
        "kind": params.kind,
        "params": params.to_dict(),
        "start": None,
        "end": None,
        "reports": int(reports.sum()),
        "cohorts": [
            {"cohort": j, "reports": int(reports[j]), field: ones[j].tolist()}
            for j in range(len(reports))
        ],
    }
