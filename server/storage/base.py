"""The storage interface every backend implements, and the policies that sit above backends.

:class:`Storage` is the whole surface the collector, the command line and the
analysis use. A backend implements the abstract methods (durable insert with
replay rejection, per-cohort aggregates, rebuild, backup, health, schema
migrations); the policies that are the same for every backend live here once:
which registry changes are allowed (:func:`merge_registry`), day ranges
(:func:`parse_day`), the ``min_reports`` rule and shape of the counts document
(:meth:`Storage.counts`), and the reports-per-day document (:meth:`Storage.stats`).
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from veil.server.counts import build_document
from veil.server.storage.errors import (
    DayError,
    RegistryMismatchError,
    StorageError,
    TooFewReportsError,
    UnknownMetricError,
)
from veil.shared.errors import VeilError
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import COLUMNS, State, Statistic, statistic_for
from veil.shared.wire import Report

DAY_FORMAT = "%Y-%m-%d"
#: the first and the last day a range without a start or an end reaches
FIRST_DAY = "0001-01-01"
LAST_DAY = "9999-12-31"
#: real-valued aggregates (sums) match a recount to this relative precision, or this much per
#: report: a recount adds the same numbers in another order, which changes the last bits
REAL_TOLERANCE = 1e-6


def sums_agree(stored: Any, recounted: Any, reports: int) -> bool:
    """Whether a stored real-valued sum agrees with its recount over ``reports`` reports, up
    to the order of their additions (:data:`REAL_TOLERANCE`)."""
    if not isinstance(stored, float | int) or not isinstance(recounted, float | int):
        return False
    return math.isclose(stored, recounted, rel_tol=REAL_TOLERANCE,
                        abs_tol=REAL_TOLERANCE * max(reports, 1))


@dataclasses.dataclass(frozen=True)
class DailyCap:
    """At most ``limit`` reports a UTC day may be stored under ``key``, counted in the store
    (so across every process and collector writing to it).

    ``key`` names what is capped without revealing it (the collector passes a hash of an
    upload token); :meth:`Storage.insert` counts the reports it stores under ``key`` and the
    day it files them under, in the transaction that stores them.
    """

    key: bytes
    limit: int

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"a daily cap needs a positive integer limit; got {self.limit!r}")


class DailyCapReached(VeilError):
    """An insert would take its :class:`DailyCap` over the limit of its day: nothing of it was
    stored and nothing was counted. ``retry_after``: seconds until that UTC day ends."""

    def __init__(self, limit: int, day: str, stored: int, retry_after: float) -> None:
        self.limit = limit
        self.day = day
        self.stored = stored
        self.retry_after = retry_after
        super().__init__(f"the cap of {limit} reports on {day} (UTC) would be exceeded: "
                         f"{stored} are stored under it already")


def seconds_left_in_day(day: str, now: float) -> float:
    """Seconds from ``now`` (a POSIX time) until UTC ``day`` is over; at least 1."""
    end = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC) + dt.timedelta(days=1)
    return max(end.timestamp() - now, 1.0)


@dataclasses.dataclass(frozen=True)
class InsertResult:
    """How many reports of an insert were new and how many were already stored."""

    accepted: int
    duplicates: int


@dataclasses.dataclass(frozen=True)
class Migration:
    """One schema step: it upgrades a store from ``version`` to ``version + 1``, doing
    what ``description`` says."""

    version: int
    description: str

    def __str__(self) -> str:
        return f"schema {self.version} -> {self.version + 1}: {self.description}"

    @staticmethod
    def steps(migrations: Mapping[int, Callable[..., Any]], version: int,
              target: int) -> list[Migration]:
        """The steps of ``migrations`` (``from_version -> function``) from schema ``version``
        to ``target``, each described by the first line of its function's docstring."""
        return [Migration(v, (migrations[v].__doc__ or "").strip().splitlines()[0])
                for v in range(version, target)]


@dataclasses.dataclass(frozen=True)
class DayCount:
    """How many reports of ``metric`` the store filed under UTC ``day``."""

    metric: str
    day: str
    reports: int


@dataclasses.dataclass(frozen=True)
class StoredReports:
    """Raw reports of one metric filed under one UTC day, as arrays: what
    :meth:`Storage.iter_reports` yields, ``veil archive`` writes and ``veil aggregate``
    reads back.

    ``ids``: ``(n, 16)`` uint8, the report ids. ``cohorts``: ``(n,)`` int64.
    ``payloads``: as the metric's statistic stores them (``payload_type``): ``(n, width)``
    uint8 for ``bytes``, ``(n,)`` int64 for ``int``, ``(n,)`` float64 for ``float``.
    """

    metric: str
    day: str
    ids: np.ndarray
    cohorts: np.ndarray
    payloads: np.ndarray

    def __len__(self) -> int:
        return len(self.cohorts)

    @classmethod
    def of(cls, metric: str, day: str, ids: Sequence[bytes], cohorts: Sequence[int],
           payloads: np.ndarray) -> StoredReports:
        """The reports of ``metric`` on ``day`` from columns as a backend reads them: the
        16-byte ``ids`` and the ``cohorts``, one per report, and the ``payloads`` as an array
        (:func:`payload_array`); ``ValueError`` if an id is not 16 bytes."""
        return cls(metric, day, np.frombuffer(b"".join(ids), dtype=np.uint8).reshape(-1, 16),
                   np.fromiter(cohorts, dtype=np.int64, count=len(cohorts)), payloads)


def payload_array(payload_type: str, stored: Sequence[Any]) -> np.ndarray:
    """Stored payloads (as a backend keeps them, one per report) as the array
    :class:`StoredReports` holds; ``ValueError`` for byte payloads of different lengths
    (a metric's all have one): read joined, a short and a long one would shift every row
    after them into a wrong one."""
    if payload_type == "bytes":
        lengths = set(map(len, stored))
        if len(lengths) > 1:
            counted = Counter(map(len, stored)).most_common()
            raise ValueError(f"a stored payload has {counted[-1][0]} bytes where the others "
                             f"have {counted[0][0]}")
        width = lengths.pop() if lengths else 0
        return np.frombuffer(b"".join(stored), dtype=np.uint8).reshape(len(stored), width)
    return np.asarray(stored, dtype=np.int64 if payload_type == "int" else np.float64)


def aggregate_columns(statistic: Statistic, state: State, counts: Callable[[np.ndarray], Any],
                      ) -> list[Any]:
    """One cohort's state as the aggregate columns :data:`COLUMNS`, in order (``None`` for the
    columns other statistics use): ``counts`` turns a counter vector into the backend's
    column value, counts are ``int``, sums ``float``."""
    columns: list[Any] = [None] * len(COLUMNS)
    for field in statistic.fields:
        value = state[field.name]
        if field.type == "counts":
            value = counts(np.asarray(value))
        elif field.type == "count":
            value = int(value)
        else:
            value = float(value)
        columns[COLUMNS.index(field.column)] = value
    return columns


#: counter vectors of aggregate rows: ``(rows, column index, length) -> (len(rows), length)``
CountersOf = Callable[[Sequence[Sequence[Any]], int, int], np.ndarray]


def sum_aggregate_rows(statistic: Statistic, metric: Metric, rows: Sequence[Sequence[Any]],
                       counters: CountersOf) -> tuple[np.ndarray, list[State]]:
    """Reports per cohort and per-cohort states added up over aggregate rows
    ``(cohort, reports, *COLUMNS)`` (days and shards); ``counters`` reads the counter
    columns as the backend stores them."""
    cohorts = metric.params.cohorts
    cohort_ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
    reports = np.zeros(cohorts, dtype=np.int64)
    np.add.at(reports, cohort_ids, [int(row[1]) for row in rows])
    states = [statistic.zero(metric.params) for _ in range(cohorts)]
    for field in statistic.fields:
        at = 2 + COLUMNS.index(field.column)
        if field.type == "counts":
            length = statistic.length(metric.params)
            total = np.zeros((cohorts, length), dtype=np.uint64)
            if rows:
                np.add.at(total, cohort_ids, counters(rows, at, length))
            for c in range(cohorts):
                states[c][field.name] = total[c]
        else:
            for row in rows:
                states[row[0]][field.name] += row[at]
    return reports, states


def registry_to_record(stored: Registry | None, given: Registry | None,
                       with_data: Callable[[], Collection[str]], where: str) -> Registry:
    """The registry a store at ``where`` uses once opened with ``given``: the ``stored`` one
    when none is given (:class:`StorageError` if it has none), else
    :func:`merge_registry`'s (``with_data`` lists the metrics with reports; asked only then)."""
    if given is None:
        if stored is None:
            raise StorageError(f"{where} holds no metric registry yet; start the collector with "
                               "--config to record one")
        return stored
    return merge_registry(stored, given, with_data(), where)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What :meth:`Storage.check` found.

    ``damage``: the store itself is damaged (an integrity check failed, a page or row cannot
    be read): restore it from a backup. ``mismatches``: aggregates that disagree with a
    recount of the raw reports, which are intact: ``rebuild_aggregates`` repairs them.
    ``reports``: the raw reports recounted (``None`` if the recount could not run).
    ``location``: where the store is, for messages (as :attr:`Storage.location`).
    ``integrity``: what examined the store itself, for messages (``None``: the backend
    leaves that to its database server). ``unverified``: (metric, day) pairs whose
    aggregates have no raw report to be recounted from (set by ``veil aggregate``, or
    their reports dropped), neither checked nor touched by a rebuild. ``missing_reports``:
    report ids stored beyond the raw reports (reports deleted or lost: a rebuild counts
    only those present). Only the SQLite store counts these two; PostgreSQL's check leaves
    them 0 (its days dropped by retention keep their aggregates unchecked).
    """

    location: str
    damage: tuple[str, ...] = ()
    mismatches: tuple[str, ...] = ()
    reports: int | None = None
    integrity: str | None = "the integrity check passed"
    unverified: int = 0
    missing_reports: int = 0

    @property
    def sound(self) -> bool:
        """Whether nothing is wrong."""
        return not (self.damage or self.mismatches)


def parse_day(value: dt.date | str | None, field: str) -> str | None:
    """A UTC day as ``YYYY-MM-DD`` (``None`` passes through); raise :class:`StorageError`."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return value.isoformat()  # strftime's %Y drops the zeros of years before 1000
    if isinstance(value, str):
        try:
            return dt.datetime.strptime(value, DAY_FORMAT).date().isoformat()
        except ValueError:
            pass
    raise DayError(field, f"{field} must be a day written YYYY-MM-DD; got {value!r}")


def day_range(start: dt.date | str | None, end: dt.date | str | None,
              ) -> tuple[str | None, str | None]:
    """``(start, end)`` as ``YYYY-MM-DD`` (either may be ``None``), checked to be in order."""
    start_text, end_text = parse_day(start, "start"), parse_day(end, "end")
    if start_text and end_text and start_text > end_text:
        raise DayError("start", f"start ({start_text}) is after end ({end_text})")
    return start_text, end_text


def today() -> str:
    """Today's UTC day, the day under which new reports are filed."""
    return dt.datetime.now(dt.UTC).date().isoformat()


def yesterday() -> str:
    """Yesterday's UTC day: the last day that is over."""
    return (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()


def merge_registry(stored: Registry | None, given: Registry, with_data: Collection[str],
                   where: str) -> Registry:
    """The registry to record when ``given`` replaces ``stored`` in a store at ``where``.

    A metric's parameters, once recorded, are permanent: a registry that changes
    them raises :class:`RegistryMismatchError`, whether or not reports are stored
    yet (``with_data`` only words the message). Otherwise a collector still running
    with the old registry, or a client holding it, would store reports that the
    new parameters misread. A change of parameters is a new metric (a new name,
    e.g. ``homepage.v2``). Metrics dropped from ``given`` stay recorded, so their
    counts can still be exported and decoded and their parameters stay reserved.
    """
    if stored is None:
        return given
    for name in sorted(set(stored) & set(given)):
        if stored[name].params != given[name].params:
            held = ("holds reports made with the old ones" if name in with_data
                    else "recorded the old ones, which running collectors and clients use")
            raise RegistryMismatchError(
                f"metric {name!r}: the registry changes its parameters "
                f"({stored[name].params.to_dict()} -> {given[name].params.to_dict()}) "
                f"but {where} {held}. Parameters are permanent: publish the change as a new "
                f"metric (e.g. {name + '.v2'!r}) and keep or remove the old one"
            )
    kept = [stored[name] for name in sorted(stored) if name not in given]
    return Registry([*given.values(), *kept], version=given.version)


class Storage(abc.ABC):
    """Reports and their per-(metric, day, cohort) statistics, stored durably.

    Thread-safe. ``insert`` returns only once the reports are durable; a report
    whose id is already stored is a duplicate, acknowledged and not counted again.
    Runtime failures raise :class:`StorageUnavailable`; :meth:`open` refuses a damaged
    store with a :class:`StorageError` that names the recovery.
    """

    #: the schema steps the open that made this object applied, oldest first
    migrated: tuple[Migration, ...] = ()

    #: the schema version this Veil writes in this backend's stores
    current_schema: int = 0

    @classmethod
    def describe(cls, url: str) -> str:
        """``url`` as messages may show it (a PostgreSQL URL loses its password)."""
        return url

    @classmethod
    @abc.abstractmethod
    def open(cls, url: str, registry: Registry | None = None, *, create: bool = False,
             migrate: bool = False, **options: Any) -> Storage:
        """Open the store named by ``url`` (see :func:`veil.server.storage.open_storage`)."""

    @classmethod
    @abc.abstractmethod
    def pending_migrations(cls, url: str) -> list[Migration]:
        """The steps that would bring the store at ``url`` to this Veil's schema, oldest
        first, without changing it (``veil migrate --dry-run``); ``[]`` when it is current.
        :class:`StorageError` for a missing, foreign or newer store."""

    @classmethod
    @abc.abstractmethod
    def check(cls, url: str) -> CheckResult:
        """Examine the store named by ``url`` whole, without changing it: its integrity, and
        the aggregates of every (metric, day) that has raw reports against a recount of
        them (``veil check``; :attr:`CheckResult.unverified` counts the others). Works on a
        store that :meth:`open` refuses as damaged; :class:`StorageError` if it cannot run."""

    _registry: Registry
    _metrics_cache: dict[str, tuple[Metric, Statistic]]

    @property
    def registry(self) -> Registry:
        """Every metric with stored reports or in the registry last attached."""
        return self._registry

    def _use_registry(self, registry: Registry) -> None:
        """Make ``registry`` the one this store reads and writes by (backends call it)."""
        self._registry = registry
        self._metrics_cache = {}

    def _metric(self, name: str) -> tuple[Metric, Statistic]:
        """The stored metric ``name`` and its statistic (cached until the registry changes)."""
        cached = self._metrics_cache.get(name)
        if cached is None:
            metric = self.metric(name)
            cached = self._metrics_cache[name] = (metric, statistic_for(metric.params))
        return cached

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the store is, for messages (a path or a URL without its password)."""

    @abc.abstractmethod
    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None, *,
               cap: DailyCap | None = None) -> InsertResult:
        """Store validated reports under ``day`` (default: today, UTC); durable on return.

        With a ``cap``, the reports this call stores (new ids only: duplicates cost nothing)
        are counted under ``cap.key`` and their day in the same transaction; a call that would
        take that count over ``cap.limit`` stores and counts nothing and raises
        :class:`DailyCapReached`."""

    @abc.abstractmethod
    def read_aggregates(self, metric: Metric, start: str | None, end: str | None,
                        ) -> tuple[np.ndarray, list[State]]:
        """Reports per cohort and each cohort's statistic over days ``start``..``end``."""

    @abc.abstractmethod
    def iter_reports(self, metric: str | None = None, start: str | None = None,
                     end: str | None = None, *, batch_size: int = 262_144,
                     ) -> Iterator[StoredReports]:
        """The raw reports over days ``start``..``end`` (either ``None``: open), for one metric
        or all, in chunks of at most ``batch_size`` reports of one (metric, day) each; every
        stored report exactly once. Each chunk is read consistently; a collector may keep
        writing meanwhile (archive only days that are over)."""

    @abc.abstractmethod
    def replace_aggregates(self, metric: str, day: str, reports: np.ndarray,
                           states: Sequence[State]) -> None:
        """Make ``reports[c]`` and ``states[c]`` the aggregates of ``metric`` on ``day`` for
        every cohort ``c`` (cohorts without reports get no row), in one transaction,
        replacing what was there: idempotent, so a rerun of ``veil aggregate`` is harmless."""

    @abc.abstractmethod
    def rebuild_aggregates(self) -> int:
        """Recompute the aggregates of every (metric, day) that has raw reports from them
        (those of days without any, set from an archive, are kept); return the number of
        reports."""

    @abc.abstractmethod
    def backup(self, target: str | Path) -> Path:
        """Write a consistent copy of the store to ``target`` (a new file); return its path."""

    @abc.abstractmethod
    def total_reports(self, metric: str | None = None) -> int:
        """Number of stored raw reports (for one metric or all)."""

    @abc.abstractmethod
    def daily_reports(self, metric: str | None, start: str | None, end: str | None,
                      ) -> list[DayCount]:
        """Reports per (metric, UTC day) over days ``start``..``end`` (either ``None``: open),
        for one metric or all, ordered by metric then day; days without reports left out.
        Read from the aggregates (on SQLite, with the reports past the fold mark), never by
        scanning every raw report."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Readiness: raise :class:`StorageUnavailable` unless writes can be expected to
        succeed (the store answers, a write transaction can begin, there is room for it) and
        no damage was met."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections (idempotent)."""

    def today(self) -> str:
        """Today's UTC day by the store's clock (this machine's; a PostgreSQL server's own),
        the day retention and the replay window count from."""
        return today()

    def drop_days_before(self, day: dt.date | str) -> list[str]:
        """Retention: drop the raw reports of every day before ``day``, keeping their
        aggregates, and refuse reports for those days; returns the days dropped. A day
        within the replay window is refused with :class:`StorageError`. Backends that keep
        every report (SQLite) raise :class:`StorageError`."""
        raise StorageError(
            f"{self.location} keeps every raw report: retention by day (veil retention) is for "
            "PostgreSQL stores, whose days are partitions; a SQLite file is trimmed by "
            "exporting what to keep into a new one")

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metric(self, name: str) -> Metric:
        """The stored metric called ``name``; :class:`UnknownMetricError` if there is none."""
        if name not in self.registry:
            raise UnknownMetricError(self.location, name, self.registry)
        return self.registry[name]

    def check_metric(self, metric: Metric) -> Statistic:
        """The statistic of ``metric``, whose parameters must be those stored."""
        stored = self.metric(metric.name)
        if stored.params != metric.params:
            raise RegistryMismatchError(
                f"metric {metric.name!r}: the parameters given ({metric.params.to_dict()}) differ "
                f"from those stored in {self.location} ({stored.params.to_dict()})"
            )
        return statistic_for(stored.params)

    def days(self, metric: str) -> list[str]:
        """The days on which ``metric`` received reports, oldest first."""
        return [row.day for row in self.daily_reports(metric, None, None)]

    def stats(self, metric: str | None = None, start: dt.date | str | None = None,
              end: dt.date | str | None = None) -> dict[str, Any]:
        """The reports-per-day document (``veil stats``, ``GET /v1/stats``).

        Every stored metric appears (or only ``metric``), with its reports in the
        range and one entry per UTC day that has some; a metric without reports
        has ``reports: 0`` and no days, so a metric that clients do not send stands out.
        """
        if metric is not None:
            self.metric(metric)
        start_text, end_text = day_range(start, end)
        by_metric: dict[str, list[DayCount]] = {
            name: [] for name in sorted(self.registry) if metric in (None, name)}
        for row in self.daily_reports(metric, start_text, end_text):
            by_metric.setdefault(row.metric, []).append(row)
        entries = [
            {"metric": name, "reports": sum(row.reports for row in rows),
             "days": [{"day": row.day, "reports": row.reports} for row in rows]}
            for name, rows in by_metric.items()
        ]
        return {"start": start_text, "end": end_text,
                "reports": sum(entry["reports"] for entry in entries), "metrics": entries}

    def raw_reports(self, metric: str, start: dt.date | str | None = None,
                    end: dt.date | str | None = None, *, min_reports: int | None = None,
                    ) -> Iterator[StoredReports]:
        """:meth:`iter_reports` of ``metric`` for an analysis that reads reports one by one
        (a discovery channel), under the rule :meth:`counts` applies: raises
        :class:`TooFewReportsError` unless the range holds at least ``min_reports`` raw
        reports (default: the metric's own; 0 overrides). Counts the raw reports still
        kept, not the aggregates: retention may have dropped some."""
        threshold = self.metric(metric).min_reports if min_reports is None else min_reports
        chunks = self.iter_reports(metric, *day_range(start, end))
        held: list[StoredReports] = []
        reports = 0
        while reports < threshold:
            chunk = next(chunks, None)
            if chunk is None:
                raise TooFewReportsError(metric, reports, threshold)
            held.append(chunk)
            reports += len(chunk)
        return itertools.chain(held, chunks)

    def counts(
        self,
        metric: Metric | str,
        start: dt.date | str | None = None,
        end: dt.date | str | None = None,
        *,
        min_reports: int | None = None,
    ) -> dict[str, Any]:
        """The counts document for ``metric`` over days ``start``..``end`` (inclusive, UTC).

        Every cohort appears, in order, zeros filled. Raises
        :class:`TooFewReportsError` when the range holds fewer than
        ``min_reports`` reports (default: the metric's own ``min_reports``;
        pass 0 to override).
        """
        if isinstance(metric, str):
            metric = self.metric(metric)
        statistic = self.check_metric(metric)
        start_text, end_text = day_range(start, end)
        reports, states = self.read_aggregates(metric, start_text, end_text)
        total = int(reports.sum())
        threshold = metric.min_reports if min_reports is None else min_reports
        if total < threshold:
            raise TooFewReportsError(metric.name, total, threshold)
        return build_document(
            metric=metric.name, kind=metric.kind, params=metric.to_dict(), start=start_text,
            end=end_text, reports=reports,
            entries=[statistic.to_entry(states[c]) for c in range(metric.params.cohorts)],
        )
