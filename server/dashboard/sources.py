"""Where the dashboard reads: a collector's store (``--db``, or the collector it is mounted
in) or a running collector over HTTP (``--server`` with a read token).

A :class:`DashboardSource` answers the few questions the pages ask (the registry, reports
per metric and day, a counts document, readiness, store size, refused reports) the same
way for both, so the pages never know which one they read.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from veil.server.http import SourceError, fetch_counts, get_json, network_reason
from veil.server.storage.sqlite.files import store_file_bytes
from veil.shared.registry import Registry

if TYPE_CHECKING:
    from veil.server.storage import Storage

#: Prometheus counters of refused reports and batches, by error code (the collector's
#: ``GET /metrics``); the store itself keeps no record of what it refused
REFUSAL_COUNTERS = ("veil_reports_rejected", "veil_batches_refused")


class TooFewReports(Exception):
    """The range holds fewer reports than the metric's ``min_reports``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclasses.dataclass
class DashboardSource:
    """A store (``db``: a path or URL, or an open ``storage``) or a collector (``server``
    and its read ``token``). ``exposition`` gives the collector's Prometheus text when the
    dashboard runs inside it."""

    db: str | None = None
    server: str | None = None
    token: str | None = None
    storage: Storage | None = None
    exposition: Callable[[], bytes] | None = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        """Where the data comes from, for pages (a URL or a store's location)."""
        if self.server is not None:
            return self.server
        return self._storage().location

    def db_url(self) -> str | None:
        """The store's path or URL for the analysis' own readers (None over HTTP)."""
        if self.server is not None:
            return None
        return self.db if self.db is not None else self._storage().location

    def _storage(self) -> Storage:
        """The store, opened at the first use and kept open."""
        with self._lock:
            if self.storage is None:
                from veil.server.storage import open_storage

                assert self.db is not None
                self.storage = open_storage(self.db)
            return self.storage

    def check(self) -> str | None:
        """Read the source once, as a dashboard starting up does: why it cannot be read now
        (the collector does not answer, the store is unavailable), or ``None``.
        :class:`~veil.server.storage.StorageError` if ``db`` names no Veil store at all (a
        missing, empty or foreign file), which waiting will not fix."""
        from veil.server.storage import StorageUnavailable

        try:
            self.registry()
        except (SourceError, StorageUnavailable) as exc:
            return str(exc)
        return None

    def registry(self) -> Registry:
        """The metrics the store holds, or those the collector serves."""
        if self.server is not None:
            return Registry.from_dict(get_json(self.server, "/v1/metrics", None, {}),
                                      lenient=True)
        return self._storage().registry

    def daily_reports(self, start: str | None, end: str | None) -> dict[str, dict[str, int]]:
        """Reports of each metric on each UTC day of ``start``..``end``: metric -> day -> n."""
        if self.server is not None:
            document = get_json(self.server, "/v1/stats", self.token,
                                {"start": start, "end": end})
            return {entry["metric"]: {day["day"]: int(day["reports"])
                                      for day in entry.get("days", [])}
                    for entry in document.get("metrics", [])}
        by_metric: dict[str, dict[str, int]] = {}
        for row in self._storage().daily_reports(None, start, end):
            by_metric.setdefault(row.metric, {})[row.day] = row.reports
        return by_metric

    def counts(self, metric: str, start: str | None, end: str | None) -> dict[str, Any]:
        """The counts document of ``metric`` over ``start``..``end``; :class:`TooFewReports`
        below its ``min_reports``."""
        if self.server is not None:
            from veil.server.http import TooFewReports as Refused

            try:
                return fetch_counts(self.server, self.token, metric, start, end)
            except Refused as exc:
                raise TooFewReports(str(exc)) from None
        from veil.server.storage import TooFewReportsError

        try:
            return self._storage().counts(metric, start, end)
        except TooFewReportsError as exc:
            raise TooFewReports(str(exc)) from None

    def readiness(self) -> tuple[bool, str]:
        """Whether the store can take writes, and why not."""
        if self.server is not None:
            import requests

            try:
                answer = requests.get(f"{self.server.rstrip('/')}/readyz", timeout=10)
            except requests.RequestException as exc:
                return False, f"cannot reach the collector: {network_reason(exc)}"
            return answer.status_code == 200, f"/readyz answered {answer.status_code}"
        from veil.server.storage import StorageError

        try:
            self._storage().ping()
        except StorageError as exc:
            return False, str(exc)
        return True, "the store takes writes"

    def store_bytes(self) -> int | None:
        """Bytes of the store's file and its write-ahead log (None when not a file)."""
        if self.server is not None:
            return None
        return store_file_bytes(self._storage().location)

    def refusals(self) -> list[dict[str, Any]] | None:
        """Refused reports and batches by counter and code since the collector started, from
        its Prometheus counters; None when the dashboard reads a store alone."""
        if self.exposition is not None:
            text = self.exposition().decode("utf-8")
        elif self.server is not None:
            import requests

            try:
                answer = requests.get(f"{self.server.rstrip('/')}/metrics", timeout=10,
                                      headers={"Authorization": f"Bearer {self.token}"})
            except requests.RequestException as exc:
                raise SourceError(f"cannot reach the collector: {network_reason(exc)}") from None
            if answer.status_code != 200:
                return None
            text = answer.text
        else:
            return None
        return parse_refusals(text)

    def close(self) -> None:
        """Close the store if this source opened it."""
        if self.db is not None and self.storage is not None:
            self.storage.close()
            self.storage = None


def parse_refusals(text: str) -> list[dict[str, Any]]:
    """Rows ``{counter, code, count}`` of the refusal counters in Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    rows = []
    for family in text_string_to_metric_families(text):
        if family.name not in REFUSAL_COUNTERS:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                rows.append({"counter": family.name, "code": sample.labels.get("code", ""),
                             "count": int(sample.value)})
    return sorted(rows, key=lambda row: (row["counter"], row["code"]))
