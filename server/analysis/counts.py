"""The counts document (the collector's sufficient statistics) as checked arrays.

A counts document is what ``GET /v1/metrics/<name>/counts`` returns and what
``open_storage(path).counts(metric)`` gives locally: the metric's parameters,
the total number of reports and one entry per cohort. :func:`counts_arrays`
validates one and returns NumPy arrays; :func:`counts_document` builds one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds import KINDS, MechanismParams, StringParams


@dataclasses.dataclass(frozen=True)
class CountsArrays:
    """One metric's counts: ``reports[j]`` per cohort and the per-kind statistics.

    ``ones`` is ``(cohorts, k)`` for strings and categories and ``(1,)`` for
    booleans and 1bitmean numbers; ``sums``/``sum_squares`` are set for
    laplace/gaussian numbers.
    """

    metric: str
    params: MechanismParams
    reports: np.ndarray
    ones: np.ndarray | None = None
    sums: np.ndarray | None = None
    sum_squares: np.ndarray | None = None
    start: str | None = None
    end: str | None = None
    source: str = "counts document"

    @property
    def total_reports(self) -> int:
        """Reports over all cohorts."""
        return int(self.reports.sum())


def _fail(source: str, field: str, message: str) -> ParameterError:
    return ParameterError(field, f"{source}: {field}: {message}")


def _count(value: Any, source: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(source, field, f"must be a non-negative integer; got {value!r}")
    return value


def _number(value: Any, source: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise _fail(source, field, f"must be a finite number; got {value!r}")
    return float(value)


def _params(document: Mapping[str, Any], source: str) -> MechanismParams:
    raw = document.get("params")
    if not isinstance(raw, Mapping):
        raise _fail(source, "params", "must be an object with the metric's kind and parameters")
    kind = raw.get("kind", document.get("kind"))
    if kind not in KINDS:
        raise _fail(source, "params.kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    settings = {key: value for key, value in raw.items() if key not in ("description", "min_reports")}
    try:
        return KINDS[kind].from_dict(settings)
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
    reports = np.zeros(params.cohorts, dtype=np.int64)
    ones = sums = sum_squares = None
    vector = params.kind in ("string", "category")
    moments = params.kind == "number" and getattr(params, "mechanism", "") != "1bitmean"
    if vector:
        ones = np.zeros((params.cohorts, params.k), dtype=np.int64)
    elif moments:
        sums = np.zeros(1)
        sum_squares = np.zeros(1)
    else:
        ones = np.zeros(1, dtype=np.int64)
    for j, entry in enumerate(cohorts):
        where = f"cohorts[{j}]"
        if not isinstance(entry, Mapping):
            raise _fail(source, where, "must be an object")
        if entry.get("cohort", j) != j:
            raise _fail(source, f"{where}.cohort", f"must be {j} (cohorts in order); got {entry.get('cohort')!r}")
        n = reports[j] = _count(entry.get("reports"), source, f"{where}.reports")
        if vector:
            row = entry.get("ones")
            if not isinstance(row, list) or len(row) != params.k:
                size = len(row) if isinstance(row, list) else "no"
                raise _fail(source, f"{where}.ones", f"must list k={params.k} counts; got {size}")
            values = [_count(v, source, f"{where}.ones[{i}]") for i, v in enumerate(row)]
            ones[j] = values
            if max(values, default=0) > n:
                raise _fail(source, f"{where}.ones", f"a bit count exceeds the cohort's {n} reports")
        elif moments:
            sums[0] = _number(entry.get("sum"), source, f"{where}.sum")
            sum_squares[0] = _number(entry.get("sum_squares"), source, f"{where}.sum_squares")
            if sum_squares[0] < 0:
                raise _fail(source, f"{where}.sum_squares", "must not be negative")
        else:
            ones[0] = _count(entry.get("ones"), source, f"{where}.ones")
            if ones[0] > n:
                raise _fail(source, f"{where}.ones", f"{ones[0]} exceeds the cohort's {n} reports")
    total = document.get("reports", int(reports.sum()))
    if _count(total, source, "reports") != int(reports.sum()):
        raise _fail(source, "reports", f"says {total} but the cohorts add up to {int(reports.sum())}")
    return CountsArrays(
        metric=str(document.get("metric", "")),
        params=params,
        reports=reports,
        ones=ones,
        sums=sums,
        sum_squares=sum_squares,
        start=document.get("start"),
        end=document.get("end"),
        source=source,
    )


def counts_document(
    params: StringParams | MechanismParams,
    reports: np.ndarray,
    ones: np.ndarray,
    metric: str = "rappor",
) -> dict[str, Any]:
    """A counts document for a string or category metric from arrays."""
    reports = np.asarray(reports, dtype=np.int64)
    ones = np.asarray(ones, dtype=np.int64).reshape(len(reports), -1)
    return {
        "metric": metric,
        "kind": params.kind,
        "params": params.to_dict(),
        "start": None,
        "end": None,
        "reports": int(reports.sum()),
        "cohorts": [
            {"cohort": j, "reports": int(reports[j]), "ones": [int(v) for v in ones[j]]}
            for j in range(len(reports))
        ],
    }
