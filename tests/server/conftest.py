"""Fixtures for collector tests: the app in-process, and wire reports with predicted counts.

``app`` and ``client`` follow Flask's tutorial ``tests/conftest.py``: the
collector app from ``create_app({"TESTING": True, ...})`` with
:data:`TEST_REGISTRY`, a read token and a real SQLite file in ``tmp_path``, and
its ``app.test_client()``. Use them for API semantics (status codes, JSON error
bodies, validation, dedup, counts documents, tokens); keep ``collector`` (a
``veil serve`` process) for what only a real server shows: waitress, workers,
signals, crashes, restarts and the SDK over HTTP::

    def test_upload(client, wire):
        response = client.post("/v1/reports", json=wire.batch(wire.reports("dark_mode", [True])))
        assert response.json["accepted"] == 1
        assert client.counts("dark_mode")["reports"] == 1

``app_factory(**settings)`` builds an app with other settings
(``app_factory(UPLOAD_TOKEN="u", MAX_REPORTS_PER_BATCH=3)``): the one of
``tests/conftest.py``, with :class:`ApiClient` as its test client.
``children_of(pid)`` lists a process's children (a ``veil serve``'s workers).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from veil.client.encoders import make_encoder
from veil.server.storage import open_storage
from veil.server.storage.sqlite import schema
from veil.shared.registry import Registry
from veil.shared.statistics import statistic_for
from veil.shared.wire import make_batch, make_report, validate_batch


class Wire:
    """Builds batches of genuinely encoded reports and the counts they must produce."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def reports(self, metric: str, values: Iterable[Any], *, cohort_seed: int | None = None,
                ) -> list[dict[str, Any]]:
        """One wire report per value, each from a fresh installation secret (and cohort)."""
        out = []
        for index, value in enumerate(values):
            seed = index if cohort_seed is None else cohort_seed
            encoder = make_encoder(self.registry[metric], os.urandom(32), seed)
            out.append(make_report(os.urandom(16).hex(), metric, encoder.cohort,
                                   encoder.encode(value), self.registry[metric].params.fingerprint))
        return out

    @staticmethod
    def batch(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """A batch with a fresh random batch id."""
        return make_batch(os.urandom(16).hex(), reports)

    def validated(self, reports: Iterable[Mapping[str, Any]]) -> list[Any]:
        """``reports`` as the collector stores them: a batch through wire validation."""
        return validate_batch(self.batch(reports), self.registry).reports

    @staticmethod
    def approx(document: Mapping[str, Any]) -> dict[str, Any]:
        """A counts document whose float sums compare up to the order of their additions
        (1e-12 relative)."""
        return {**document, "cohorts": [
            {key: pytest.approx(value, rel=1e-12) if key.startswith("sum") else value
             for key, value in cohort.items()} for cohort in document["cohorts"]]}

    def expected(self, metric: str, reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``reports`` and ``cohorts`` of the counts document, folded report by report
        with the statistic's one-report reference (:meth:`Statistic.of_report`)."""
        params = self.registry[metric].params
        statistic = statistic_for(params)
        states = [statistic.zero(params) for _ in range(params.cohorts)]
        sizes = [0] * params.cohorts
        for report in reports:
            if report["metric"] != metric:
                continue
            cohort = report.get("cohort", 0)
            value = params.parse_payload(report["payload"])
            stored = statistic.stored_payload(params, report["payload"], value)
            states[cohort] = statistic.merge(states[cohort], statistic.of_report(params, stored))
            sizes[cohort] += 1
        cohorts = [{"cohort": c, "reports": sizes[c], **statistic.to_entry(states[c])}
                   for c in range(params.cohorts)]
        return {"reports": sum(sizes), "cohorts": cohorts}


class ApiClient(FlaskClient):
    """Flask's test client, with the collector's read token and database at hand."""

    @property
    def token(self) -> str:
        """The read token of the app."""
        return self.application.config["READ_TOKENS"][0]

    @property
    def db_path(self) -> Path:
        """The app's SQLite file."""
        return Path(self.application.config["DATABASE"])

    @property
    def registry(self) -> Registry:
        """The registry the app serves."""
        return self.application.config["REGISTRY"]

    def headers(self) -> dict[str, str]:
        """The Authorization header carrying the read token."""
        return {"Authorization": f"Bearer {self.token}"}

    def counts(self, metric: str, **query: str) -> dict[str, Any]:
        """GET the counts document of ``metric`` (asserts a 200 answer)."""
        response = self.get(f"/v1/metrics/{metric}/counts", query_string=query,
                            headers=self.headers())
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.json


@pytest.fixture
def app_factory(app_factory: Callable[..., Flask]) -> Callable[..., Flask]:
    """``tests/conftest.py``'s ``app_factory``, whose apps' test clients are :class:`ApiClient`."""

    def make(**settings: Any) -> Flask:
        app = app_factory(**settings)
        app.test_client_class = ApiClient
        return app

    return make


@pytest.fixture
def app(app_factory: Callable[..., Flask]) -> Flask:
    """The collector app with :data:`TEST_REGISTRY`, a read token and open uploads."""
    return app_factory()


@pytest.fixture
def client(app: Flask) -> ApiClient:
    """The app's test client (:class:`ApiClient`)."""
    client: ApiClient = app.test_client()
    return client


def children_pids(parent: int) -> list[int]:
    """Process ids whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry))
    return found


@pytest.fixture
def children_of() -> Callable[[int], list[int]]:
    """``children_of(pid)``: the process ids whose parent is ``pid``, e.g. serve's workers."""
    return children_pids


@pytest.fixture
def wire(test_registry: Registry) -> Wire:
    """Report builder for the test registry."""
    return Wire(test_registry)


def before_the_fold_mark(path: Path) -> None:
    """Turn a closed SQLite store back into the layout of schema version 5, which had no
    fold mark and counted every report into ``aggregates`` as it was stored, its reports
    keyed by an unnamed rowid: the aggregates are recounted, the mark removed and the
    tables renamed and copied back."""
    with open_storage(path) as storage:
        storage.rebuild_aggregates()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'folded_rowid'")
        conn.execute("ALTER TABLE folded_aggregates RENAME TO aggregates")
        conn.execute(schema._REPORTS_V3.replace("TABLE reports", "TABLE reports_v5"))
        conn.execute("INSERT INTO reports_v5 SELECT id, metric, day, cohort, payload FROM reports "
                     "ORDER BY seq")
        conn.execute("DROP TABLE reports")
        conn.execute("ALTER TABLE reports_v5 RENAME TO reports")
        conn.execute("PRAGMA user_version = 5")
    conn.close()
