"""Where counts come from: a running collector over HTTP, its database file, or
google/rappor's files.

A :class:`CountsSource` names one metric's counts (a ``db`` or a ``server``, a range of
days) and reads them: :meth:`~CountsSource.counts` gives one counts document for the
range, :meth:`~CountsSource.daily` one per day, and both share one look-up of the days
with reports and one open database (the HTTP calls are :mod:`veil.server.http`'s).
:func:`read_rappor_files` reads google/rappor's ``params.csv``, ``counts.csv`` and
``map.csv`` together.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from veil.server.analysis.candidate_map import read_map
from veil.server.counts import PathOrFile, counts_document, read_counts, read_params
from veil.server.http import (
    TooFewReports,
    fetch_counts,
    fetch_days,
    fetch_reports,
    get_json,
)
from veil.server.settings import ENVIRONMENT, env_value
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams
from veil.shared.registry import Registry

if TYPE_CHECKING:
    import numpy as np
    import scipy.sparse as sp

    from veil.server.storage import Storage

#: the most days :meth:`CountsSource.daily` asks a collector for one by one
MAX_DAYS = 3660


def _open(path: str, metric: str) -> Storage:
    """The storage at ``path`` (a file path or a URL), which must hold ``metric``."""
    from veil.server.storage import open_storage

    storage = open_storage(path)
    try:
        storage.metric(metric)
    except BaseException:
        storage.close()
        raise
    return storage


def _covered(days: list[str], start: str | None, end: str | None) -> list[str]:
    """The ``days`` within ``start``..``end`` (either open)."""
    return [day for day in days if (not start or day >= start) and (not end or day <= end)]


@dataclasses.dataclass
class CountsSource:
    """The counts of ``metric`` over the UTC days ``start``..``end`` (inclusive; open when
    None) in a collector's database file (``db``) or from its HTTP API (``server``, with a
    read ``token``, by default ``$VEIL_READ_TOKEN``), checked when made. ``force`` (``db``
    only) reads below the metric's ``min_reports``.

    The database opens at the first read and stays open until :meth:`close` (or the end
    of a ``with`` block), and the days with reports are looked up once, so the whole range
    and its days (:meth:`counts`, then :meth:`daily`) cost one look-up of each.
    """

    metric: str
    db: str | Path | None = None
    server: str | None = None
    token: str | None = None
    start: str | None = None
    end: str | None = None
    force: bool = False
    _storage: Storage | None = dataclasses.field(default=None, init=False, repr=False,
                                                compare=False)

    def __post_init__(self) -> None:
        if (self.db is None) == (self.server is None):
            raise ParameterError("source", "give exactly one source: db (a collector's database "
                                           "file) or server (a collector's URL)")
        if self.force and self.server is not None:
            raise ParameterError("force", "force applies to a database file; a collector "
                                          "always honours its metrics' min_reports")
        if not self.metric:
            raise ParameterError("metric", "name the metric to decode (--metric NAME)")
        if self.server is not None and self.token is None:
            self.token = env_value(ENVIRONMENT["token"])

    @property
    def name(self) -> str:
        """Where the counts come from, for messages: the database or URL and the metric."""
        return f"{self.db if self.server is None else self.server} metric {self.metric}"

    def __enter__(self) -> CountsSource:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the database, if it was opened."""
        if self._storage is not None:
            self._storage.close()
            self._storage = None

    @functools.cached_property
    def registry(self) -> Registry:
        """The metric registry of the database, or the one the collector serves."""
        if self.server is not None:
            return Registry.from_dict(get_json(self.server, "/v1/metrics", None, {}),
                                      lenient=True)
        registry = self._database().registry
        assert registry is not None  # _open found the metric in it
        return registry

    def reports(self, metric: str, payload_size: int,
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(cohorts, payloads)`` chunks of the raw reports of ``metric`` (a metric whose
        analysis reads them, such as a discovery channel) over the range, refused below its
        ``min_reports`` as counts are (unless ``force``, for a database)."""
        if self.server is not None:
            yield from fetch_reports(self.server, self.token, metric, payload_size,
                                     self.start, self.end)
            return
        for chunk in self._database().raw_reports(metric, self.start, self.end,
                                                  min_reports=0 if self.force else None):
            yield chunk.cohorts, chunk.payloads

    def _database(self) -> Storage:
        """The database, opened at the first use."""
        if self._storage is None:
            self._storage = _open(str(self.db), self.metric)
        return self._storage

    @functools.cached_property
    def days(self) -> list[str] | None:
        """The days of the range on which the metric has reports, oldest first; None from a
        collector that does not list them (one without ``GET /v1/stats``)."""
        if self.server is not None:
            return fetch_days(self.server, self.token, self.metric, self.start, self.end)
        from veil.server.storage.base import day_range

        return _covered(self._database().days(self.metric), *day_range(self.start, self.end))

    def _counts(self, start: str | None, end: str | None) -> dict[str, Any]:
        """The counts document of ``start``..``end``, refused below ``min_reports``."""
        if self.server is not None:
            return fetch_counts(self.server, self.token, self.metric, start, end)
        return self._database().counts(self.metric, start, end,
                                       min_reports=0 if self.force else None)

    def counts(self) -> dict[str, Any]:
        """The counts document of the whole range, with the ``days`` it covers (those of the
        range that hold reports) where they are known.

        Like the collector, a database refuses fewer reports than the metric's
        ``min_reports`` unless ``force`` (the operator's explicit override).
        """
        document = self._counts(self.start, self.end)
        if "days" not in document and self.days is not None:
            document["days"] = self.days
        return document

    def daily(self) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, str]]:
        """One counts document per UTC day of the range that holds reports, oldest first,
        and the days left out because they hold fewer reports than the metric's
        ``min_reports`` (day -> why).

        A database lists its days, and so does a collector serving ``GET /v1/stats``; an
        older collector is asked for every calendar day from ``start`` to ``end`` (which
        must then be given).
        """
        from veil.server.storage import TooFewReportsError

        documents: list[tuple[str, dict[str, Any]]] = []
        skipped: dict[str, str] = {}
        for day in _calendar_days(self.start, self.end) if self.days is None else self.days:
            try:
                document = self._counts(day, day)
            except TooFewReportsError as exc:
                skipped[day] = f"{exc.reports} reports, fewer than min_reports {exc.min_reports}"
                continue
            except TooFewReports:
                skipped[day] = "fewer reports than the metric's min_reports (or none)"
                continue
            documents.append((day, {**document, "days": [day]}))
        return documents, skipped


def _calendar_days(start: str | None, end: str | None) -> list[str]:
    """Every day from ``start`` to ``end``, both given as YYYY-MM-DD."""
    if not (start and end):
        raise ParameterError(
            "start", "decoding a collector's counts day by day needs the days: give start and "
                     "end (--start and --end), as the collector's counts do not list them")
    from veil.server.storage.base import day_range

    first, last = (dt.date.fromisoformat(str(day)) for day in day_range(start, end))
    count = (last - first).days + 1
    if count > MAX_DAYS:
        raise ParameterError("end", f"give an end at most {MAX_DAYS} days after start; got "
                                    f"{start} to {end}")
    return [(first + dt.timedelta(days=offset)).isoformat() for offset in range(count)]


@dataclasses.dataclass(frozen=True)
class RapporFiles:
    """google/rappor inputs read together: parameters, counts document, and the map."""

    params: StringParams
    counts: dict[str, Any]
    reports: np.ndarray
    ones: np.ndarray
    candidates: list[str] | None
    candidate_map: sp.csc_matrix | None


def read_rappor_files(
    params: PathOrFile,
    counts: PathOrFile,
    map: PathOrFile | None = None,
    hashing: str = "mmh3",
) -> RapporFiles:
    """Read ``params.csv``, ``counts.csv`` and (optionally) ``map.csv`` and check they agree.

    ``hashing`` is the clients' (:func:`read_params`): it hashes candidates given
    later without a map, and it names the parameters in the counts document."""
    params_name = str(params) if isinstance(params, str | Path) else "params"
    parsed = read_params(params, hashing)
    reports, ones = read_counts(counts, parsed, params_name)
    candidates = candidate_map = None
    if map is not None:
        candidates, candidate_map = read_map(map, parsed, params_name)
    document = counts_document(parsed, reports, ones, metric="rappor")
    return RapporFiles(parsed, document, reports, ones, candidates, candidate_map)

