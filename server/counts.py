"""The counts document, the collector's sufficient statistics: build, check, write.

A counts document is what ``GET /v1/metrics/<name>/counts`` returns and what
``open_storage(path).counts(metric)`` gives locally: the metric's parameters,
the total number of reports and one entry per cohort, and optionally ``days``: the
UTC days whose reports the counts hold (the decode's ``start`` and ``end`` are then
the first and last of them, not the range asked for). :func:`build_document` builds one
(storage from its aggregates, :func:`counts_document` from arrays), :func:`counts_arrays`
validates one and returns NumPy arrays.

google/rappor's interchange files for the same counts:

* ``params.csv``: header ``k,h,m,p,q,f`` (quoted or not), one row
  (:func:`read_params`, :func:`write_params`);
* ``counts.csv``: no header, ``m`` rows in cohort order; column 1 is the number
  of reports in the cohort, then the count of set bits for bit 0..k-1
  (:func:`read_counts`, :func:`write_counts`, :func:`write_counts_document`).

Readers accept files written by google/rappor unchanged (and with a UTF-8 byte order
mark, as Excel writes "CSV UTF-8"), name the file and the sizes when dimensions disagree,
and the line and column of a field that cannot be right: a quote never closed, a count
that is no whole number, negative, larger than a 64-bit count or than its row's reports.
Storage, the collector (``format=csv`` counts, ``veil export``), the analysis and the
simulations all use this one module; it needs NumPy only (the collector has no SciPy).
The candidates' ``map.csv`` belongs to the analysis
(:mod:`veil.server.analysis.candidate_map`).
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds import KINDS, MechanismParams, StringParams, params_from_dict
from veil.shared.registry import is_metric_key
from veil.shared.statistics import statistic_for

#: a UTC day as counts documents write it
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
#: the largest count of reports (a signed 64-bit integer, as the arrays hold counts)
MAX_COUNT = 2**63 - 1


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
    if value > MAX_COUNT:
        raise _fail(source, field, f"{value} is more than any count can be (at most {MAX_COUNT})")
    return value


def _params(document: Mapping[str, Any], source: str) -> MechanismParams:
    raw = document.get("params")
    if not isinstance(raw, Mapping):
        raise _fail(source, "params", "must be an object with the metric's kind and parameters")
    kind = raw.get("kind", document.get("kind"))
    if kind not in KINDS:
        raise _fail(source, "params.kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    # the metric's own keys (Metric.to_dict) around its parameters
    settings = {key: value for key, value in raw.items() if not is_metric_key(key, value)}
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
    added = sum(reports.tolist())  # Python integers: exact however large
    if added > MAX_COUNT:
        raise _fail(source, "cohorts",
                    f"the cohorts' reports add up to {added}, more than any count can be "
                    f"(at most {MAX_COUNT})")
    total = document.get("reports", added)
    if _count(total, source, "reports") != added:
        raise _fail(source, "reports", f"says {total} but the cohorts add up to {added}")
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


def build_document(
    *,
    metric: str,
    kind: str,
    params: Mapping[str, Any],
    start: str | None,
    end: str | None,
    reports: Sequence[int] | np.ndarray,
    entries: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The counts document of one metric: ``params`` as the registry writes them, the days
    ``start``..``end`` it covers (None when open), ``reports[j]`` per cohort and each
    cohort's statistic fields ``entries[j]`` (:meth:`Statistic.to_entry
    <veil.shared.statistics.Statistic.to_entry>`), cohorts in order."""
    per_cohort = [int(n) for n in reports]
    return {
        "metric": metric,
        "kind": kind,
        "params": dict(params),
        "start": start,
        "end": end,
        "reports": sum(per_cohort),
        "cohorts": [
            {"cohort": j, "reports": n, **entry}
            for j, (n, entry) in enumerate(zip(per_cohort, entries, strict=True))
        ],
    }


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
    return build_document(
        metric=metric, kind=params.kind, params=params.to_dict(), start=None, end=None,
        reports=reports, entries=[{field: row.tolist()} for row in ones],
    )


#: google/rappor's ``params.csv`` header
PARAMS_HEADER = ["k", "h", "m", "p", "q", "f"]
#: a file to read or write: a path, or a text file already open
PathOrFile = str | Path | IO[str]


#: a CSV record and the line it starts on (1-based, as an editor counts lines)
NumberedRow = tuple[int, list[str]]


def without_bom(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with a UTF-8 byte order mark (Excel's "CSV UTF-8") dropped from the first:
    for a text file opened as ``utf-8`` rather than ``utf-8-sig``."""
    lines = iter(lines)
    first = next(lines, None)
    if first is None:
        return
    yield first.removeprefix("\ufeff")
    yield from lines


def csv_records(lines: Iterable[str], name: str, what: str, word: str = "line",
                ) -> Iterator[NumberedRow]:
    """The CSV records of ``lines`` (a text file), each with the line it starts on.

    Strict: a quote that is never closed (which would swallow the rest of the file into
    one field) and text after a closing quote are refused (:class:`ParameterError` of
    field ``what``), naming the file ``name`` and the line (called ``word``: line or row)."""
    reader = csv.reader(lines, strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ParameterError(what, csv_problem(name, start, reader.line_num, exc,
                                                   word)) from None
        yield start, row
        start = reader.line_num + 1


def csv_problem(name: str | Path, start: int, line: int, exc: csv.Error,
                word: str = "line") -> str:
    """What a :class:`csv.Error` means, for a record that starts on line ``start`` and
    failed on line ``line`` (``word`` is how the file's lines are called: line or row)."""
    text = str(exc)
    if text == "unexpected end of data":
        return (f"{name} {word} {start}: a quote is never closed (the field it opens runs to "
                "the end of the file): close it or remove it")
    if text.startswith("field larger than field limit"):
        return (f"{name} {word} {start}: a field is longer than {csv.field_size_limit():,} "
                "characters; is a quote never closed?")
    if "expected after" in text:
        return (f"{name} {word} {line}: a closing quote must be followed by a comma or the "
                'end of the line (write a quote inside a quoted field as "")')
    return f"{name} {word} {line}: not valid CSV: {text}"


def csv_rows(source: PathOrFile, what: str) -> tuple[str, list[NumberedRow]]:
    """The CSV records of a file (path or open text file), each with the line it starts
    on, and a name for errors; :class:`ParameterError` of field ``what`` for a file that
    cannot be read or is not UTF-8. A UTF-8 byte order mark is not part of the first
    field."""
    if isinstance(source, str | Path):
        name = str(source)
        try:
            with open(source, newline="", encoding="utf-8-sig") as handle:
                return name, list(csv_records(handle, name, what))
        except OSError as exc:
            raise ParameterError(what, f"cannot read {what} file {name}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ParameterError(what, f"{name}: not UTF-8 text (byte {exc.start}); save it "
                                       "as UTF-8") from None
    name = str(getattr(source, "name", f"<{what}>"))
    return name, list(csv_records(without_bom(source), name, what))


def open_output(target: PathOrFile) -> tuple[IO[str], bool]:
    """``target`` open for writing text, and whether the caller opened it (and closes it)."""
    if isinstance(target, str | Path):
        return open(target, "w", newline="", encoding="utf-8"), True
    return target, False


def read_params(source: PathOrFile, hashing: str = "mmh3") -> StringParams:
    """Parse ``params.csv`` into :class:`StringParams` with the given ``hashing``
    (``params.csv`` does not say: google/rappor's own clients hash with ``md5-google``)."""
    name, rows = csv_rows(source, "params")
    rows = [(line, row) for line, row in rows if any(cell.strip() for cell in row)]
    if len(rows) != 2:
        raise ParameterError(
            "params", f"{name}: expected a header k,h,m,p,q,f and one row; got {len(rows)} line(s)"
        )
    header = [cell.strip() for cell in rows[0][1]]
    if header != PARAMS_HEADER:
        raise ParameterError("params", f"{name}: header must be k,h,m,p,q,f; got {','.join(header)}")
    line, values = rows[1][0], [cell.strip() for cell in rows[1][1]]
    if len(values) != 6:
        raise ParameterError(
            "params", f"{name} line {line}: the row has {len(values)} fields; expected 6")
    parsed: dict[str, Any] = {}
    for key, text in zip(PARAMS_HEADER, values, strict=True):
        try:
            parsed[key] = int(text) if key in "khm" else float(text)
        except ValueError:
            kind = "an integer" if key in "khm" else "a number"
            raise ParameterError(
                key, f"{name} line {line}: {key} must be {kind}; got {text!r}") from None
    try:
        return StringParams(**parsed, hashing=hashing)
    except ParameterError as exc:
        raise ParameterError(exc.field, f"{name}: {exc}") from None


def write_params(params: StringParams, target: PathOrFile) -> None:
    """Write ``params.csv`` (unquoted header, one row)."""
    handle, close = open_output(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PARAMS_HEADER)
        writer.writerow([params.k, params.h, params.m, params.p, params.q, params.f])
    finally:
        if close:
            handle.close()


def read_counts(
    source: PathOrFile, params: StringParams | None = None, params_name: str = "params"
) -> tuple[np.ndarray, np.ndarray]:
    """Parse ``counts.csv`` into ``(reports per cohort, ones per cohort and bit)``.

    Every field is a count: a whole number from 0 to :data:`MAX_COUNT`; no bit is set in
    more reports than its row has, and the reports of all rows add up to at most
    :data:`MAX_COUNT`. Errors name the line and the column (``reports`` or ``bit N``)."""
    name, numbered = csv_rows(source, "counts")
    numbered = [(line, row) for line, row in numbered if any(cell.strip() for cell in row)]
    if not numbered:
        raise ParameterError("counts", f"{name}: the file has no rows")
    first_line, first = numbered[0]
    for line, row in numbered:
        if len(row) != len(first):
            raise ParameterError(
                "counts", f"{name} line {line} has {len(row)} fields but line {first_line} has "
                          f"{len(first)}: every row lists its reports, then one count per bit")
    if params is not None:
        if len(numbered) != params.m:
            raise ParameterError(
                "counts",
                f"{name} has {len(numbered)} rows but {params_name} says m={params.m} cohorts",
            )
        if len(first) != params.k + 1:
            raise ParameterError(
                "counts",
                f"{name} has {len(first)} columns but {params_name} says k={params.k} "
                f"(expected 1 + k = {params.k + 1}: reports, then one count per bit)",
            )
    table = _count_table(name, numbered)
    _check_counts(name, [line for line, _ in numbered], table)
    return table[:, 0].copy(), table[:, 1:].copy()


def _where(name: str, line: int, column: int) -> str:
    """A field of ``counts.csv``: its line, and its column (0-based ``column``) by number
    and by meaning."""
    meaning = "reports" if column == 0 else f"bit {column - 1}"
    return f"{name} line {line}, column {column + 1} ({meaning})"


def _count_table(name: str, numbered: list[NumberedRow]) -> np.ndarray:
    """The counts as a 64-bit array; a field that is no whole number, or one too large
    for the array, is refused by line and column."""
    try:
        return np.array([[int(cell) for cell in row] for _, row in numbered], dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    for line, row in numbered:
        for column, cell in enumerate(row):
            try:
                value = int(cell)
            except ValueError:
                shown = repr(cell.strip()) if cell.strip() else "an empty field"
                raise ParameterError(
                    "counts", f"{_where(name, line, column)}: {shown} is not a whole number; "
                              f"every field is a count of reports") from None
            if value < 0:
                raise ParameterError(
                    "counts", f"{_where(name, line, column)}: counts must not be negative; "
                              f"got {value}")
            if value > MAX_COUNT:
                raise ParameterError(
                    "counts", f"{_where(name, line, column)}: {value} is more than any count "
                              f"can be (at most {MAX_COUNT})")
    raise AssertionError("unreachable: every field was read")  # pragma: no cover


def _check_counts(name: str, lines: list[int], table: np.ndarray) -> None:
    """No count below 0, no bit set in more reports than its row has, and all reports
    adding up to at most :data:`MAX_COUNT`; the error names the first field that breaks a
    rule."""
    negative = np.argwhere(table < 0)
    if negative.size:
        row, column = negative[0]
        raise ParameterError(
            "counts", f"{_where(name, lines[row], column)}: counts must not be negative; "
                      f"got {table[row, column]}")
    over = np.argwhere(table[:, 1:] > table[:, :1])
    if over.size:
        row, bit = over[0]
        raise ParameterError(
            "counts", f"{_where(name, lines[row], bit + 1)}: {table[row, bit + 1]} reports set "
                      f"this bit but the row has only {table[row, 0]} reports (column 1)")
    total = 0
    for row, reports in enumerate(table[:, 0].tolist()):  # Python integers: exact
        total += reports
        if total > MAX_COUNT:
            raise ParameterError(
                "counts", f"{_where(name, lines[row], 0)}: the reports of lines "
                          f"{lines[0]}..{lines[row]} add up to {total}, more than any count "
                          f"can be (at most {MAX_COUNT})")


def write_counts(reports: np.ndarray, ones: np.ndarray, target: PathOrFile) -> None:
    """Write ``counts.csv`` (no header)."""
    handle, close = open_output(target)
    try:
        writer = csv.writer(handle, lineterminator="\n")
        for n, row in zip(np.asarray(reports), np.asarray(ones), strict=True):
            writer.writerow([int(n), *(int(v) for v in row)])
    finally:
        if close:
            handle.close()


def write_counts_document(document: dict[str, Any], target: PathOrFile) -> tuple[int, int]:
    """Write a RAPPOR metric's counts document as ``counts.csv``; return (reports, cohorts)."""
    arrays = counts_arrays(document)
    rappor_params(arrays.params)
    write_counts(arrays.reports, arrays.ones, target)
    return arrays.total_reports, len(arrays.reports)


def rappor_params(params: MechanismParams) -> StringParams:
    """The google/rappor parameters of a RAPPOR metric; :class:`ParameterError` otherwise."""
    rappor = params.as_rappor()
    if not isinstance(rappor, StringParams):
        raise ParameterError(
            "kind",
            "google/rappor files exist only for metrics reported with RAPPOR bits (Bloom "
            f"strings, rappor categories); this is a {params.mechanism_name} metric: read its "
            "JSON counts instead (GET /v1/metrics/NAME/counts, or veil decode --db)",
        )
    return rappor
