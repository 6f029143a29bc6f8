"""Reports per metric and UTC day: ``Storage.stats``, ``GET /v1/stats`` and ``veil stats``."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from collections import Counter

import pytest
import requests

from veil.server.cli import main
from veil.server.storage import StorageError, open_storage
from veil.shared.wire import validate_batch

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
#: reports sent per (metric, day)
SENT = {("homepage", DAYS[0]): 4, ("homepage", DAYS[2]): 6, ("dark_mode", DAYS[0]): 3,
        ("dark_mode", DAYS[1]): 2, ("load_time", DAYS[1]): 5}


@pytest.fixture
def db(tmp_path, wire):
    """A database holding :data:`SENT`."""
    path = tmp_path / "veil.db"
    values = {"homepage": "a.example", "dark_mode": True, "load_time": 2.5}
    with open_storage(path, wire.registry, create=True) as storage:
        for (metric, day), count in SENT.items():
            reports = wire.reports(metric, [values[metric]] * count)
            storage.insert(validate_batch(wire.batch(reports), wire.registry).reports, day)
    return path


def expected(metric=None, start=None, end=None, registry=()):
    """The stats document :data:`SENT` should give."""
    chosen = {key: n for key, n in SENT.items() if (metric in (None, key[0]))
              and (start is None or key[1] >= start) and (end is None or key[1] <= end)}
    names = [metric] if metric else sorted(registry)
    metrics = [{"metric": name,
                "reports": sum(n for (m, _), n in chosen.items() if m == name),
                "days": [{"day": day, "reports": n}
                         for (m, day), n in sorted(chosen.items()) if m == name]}
               for name in names]
    return {"start": start, "end": end, "reports": sum(chosen.values()), "metrics": metrics}


def test_stats_count_each_metrics_reports_per_day_and_list_silent_metrics(db, wire):
    with open_storage(db) as storage:
        assert storage.stats() == expected(registry=wire.registry)
        assert storage.stats(start=DAYS[1]) == expected(start=DAYS[1], registry=wire.registry)
        assert storage.stats("homepage", None, DAYS[1]) == expected("homepage", end=DAYS[1])
        silent = {entry["metric"]: entry for entry in storage.stats()["metrics"]}["browser"]
        assert silent == {"metric": "browser", "reports": 0, "days": []}
        with pytest.raises(StorageError, match="has no metric 'nope'; it has: battery, "):
            storage.stats("nope")
        with pytest.raises(StorageError, match="after end"):
            storage.stats(start=DAYS[2], end=DAYS[0])


def test_stats_come_from_the_aggregates_not_the_raw_reports(db, wire):
    with sqlite3.connect(db) as conn:  # raw reports gone (as after a retention job)
        conn.execute("DELETE FROM reports")
    conn.close()
    with open_storage(db) as storage:
        assert storage.total_reports() == 0
        assert storage.stats() == expected(registry=wire.registry)


def test_get_stats_needs_a_read_token_and_checks_its_query(client, wire):
    reports = wire.reports("dark_mode", [True, False, True])
    assert client.post("/v1/reports", json=wire.batch(reports)).status_code == 200
    answer = client.get("/v1/stats", query_string={"metric": "dark_mode"},
                        headers=client.headers())
    assert answer.status_code == 200
    document = answer.json
    assert document["reports"] == 3 and document["metrics"][0]["metric"] == "dark_mode"
    assert [day["reports"] for day in document["metrics"][0]["days"]] == [3]
    every = client.get("/v1/stats", headers=client.headers()).json
    assert {entry["metric"] for entry in every["metrics"]} == set(wire.registry)

    assert client.get("/v1/stats").status_code == 401
    for query, status, field in [({"metric": "nope"}, 404, "metric"),
                                 ({"start": "2026-13-01"}, 400, "start"),
                                 ({"start": "2026-11-02", "end": "2026-11-01"}, 400, "start"),
                                 ({"format": "csv"}, 400, "format")]:
        answer = client.get("/v1/stats", query_string=query, headers=client.headers())
        assert (answer.status_code, answer.json["error"]["field"]) == (status, field), query


def test_get_stats_is_refused_without_read_tokens(app_factory):
    client = app_factory(READ_TOKENS=[]).test_client()
    answer = client.get("/v1/stats")
    assert (answer.status_code, answer.json["error"]["code"]) == (403, "reads_disabled")


def test_the_openapi_document_describes_get_stats(client):
    document = client.get("/v1/openapi.json").json
    operation = document["paths"]["/v1/stats"]["get"]
    assert operation["security"] == [{"bearer": []}]
    assert {p["name"] for p in operation["parameters"]} == {"metric", "start", "end"}
    assert "Stats" in document["components"]["schemas"]


def test_veil_stats_prints_csv_json_and_a_table_with_totals(db, wire, capsys):
    assert main(["stats", "--db", str(db), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {(r["metric"], r["day"]): int(r["reports"]) for r in rows} == SENT

    assert main(["stats", "--db", str(db), "--format", "json", "--metric", "homepage",
                 "--start", DAYS[1]]) == 0
    assert json.loads(capsys.readouterr().out) == expected("homepage", start=DAYS[1])

    assert main(["stats", "--db", str(db)]) == 0
    table = capsys.readouterr().out.splitlines()
    cells = [line.split() for line in table[2:]]
    assert ["homepage", "total", "10"] in cells and ["dark_mode", DAYS[1], "2"] in cells
    assert ["browser", "-", "0"] in cells
    assert cells[-1] == ["all", "metrics", "total", str(sum(SENT.values()))]


def test_veil_stats_needs_exactly_one_source(db, capsys, monkeypatch):
    monkeypatch.delenv("VEIL_DB", raising=False)
    monkeypatch.delenv("VEIL_URL", raising=False)
    assert main(["stats"]) == 2
    assert "give exactly one source" in capsys.readouterr().err
    assert main(["stats", "--db", str(db), "--server", "http://127.0.0.1:9"]) == 2
    assert "both are set" in capsys.readouterr().err
    monkeypatch.setenv("VEIL_DB", str(db))
    assert main(["stats", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("metric,day,reports")
    assert main(["stats", "--db", str(db), "--start", "11/02/2026"]) == 2
    assert "YYYY-MM-DD" in capsys.readouterr().err


@pytest.mark.parametrize("day", ["0001-01-01", "0999-12-31"])
def test_a_day_before_the_year_1000_is_a_day(db, capsys, day):
    """strftime wrote 0999-12-31 back as 999-12-31, which the same check then refused."""
    assert main(["stats", "--db", str(db), "--start", day, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["start"] == day
    assert main(["stats", "--db", str(db), "--end", day, "--format", "json"]) == 0
    assert sum(m["reports"] for m in json.loads(capsys.readouterr().out)["metrics"]) == 0


def test_veil_stats_asks_a_running_collector(collector, wire, capsys):
    reports = wire.reports("homepage", ["a.example"] * 4) + wire.reports("battery", [50.0])
    answer = requests.post(collector.url + "/v1/reports", json=wire.batch(reports), timeout=10)
    assert answer.json()["accepted"] == 5
    assert main(["stats", "--server", collector.url, "--token", collector.token,
                 "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    with open_storage(collector.db_path) as storage:
        assert document == storage.stats()
    totals = Counter({entry["metric"]: entry["reports"] for entry in document["metrics"]})
    assert (totals["homepage"], totals["battery"], document["reports"]) == (4, 1, 5)

    assert main(["stats", "--server", collector.url, "--token", "wrong"]) == 1
    error = capsys.readouterr().err
    assert "401" in error and "read token" in error
    assert main(["stats", "--server", collector.url, "--token", collector.token,
                 "--metric", "nope"]) == 1
    assert "unknown metric 'nope'" in capsys.readouterr().err
