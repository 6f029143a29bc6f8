"""A joint metric end to end: real SDK clients report tuples to ``veil serve`` (SQLite and
PostgreSQL) over HTTP, and ``veil decode`` (a subprocess) and ``decode_metric`` read the
joint table back with honest errors; bad tuples and forged payloads are refused by name."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pytest
import requests

from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report

REGISTRY = Registry.from_toml("""
[metrics.browser]
kind = "category"
oracle = "grr"
categories = ["chrome", "firefox", "safari"]
epsilon = 2.0

[metrics.crashed]
kind = "boolean"

[metrics.crash_by_browser]
kind = "joint"
of = ["browser", "crashed"]
epsilon = 4.0
report_epsilon = 4.0
min_reports = 10
""")
#: the installations' tuples: crash rates 10% (chrome), 30% (firefox), 50% (safari)
POPULATION = {("chrome", False): 270, ("chrome", True): 30, ("firefox", False): 140,
              ("firefox", True): 60, ("safari", False): 50, ("safari", True): 50}


def report_from_real_clients(url: str, tmp_path) -> int:
    """One SDK client per installation reports its tuple and flushes; returns how many."""
    from veil.client import Client

    tuples = [value for value, count in POPULATION.items() for _ in range(count)]
    random.Random(5).shuffle(tuples)
    for i, (browser, crashed) in enumerate(tuples):
        with Client(url, tmp_path / f"state{i}", strict=True) as client:
            client.report("crash_by_browser", {"browser": browser, "crashed": crashed})
            result = client.flush()
            assert result.ok and result.rejected == 0, result
    return len(tuples)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_real_clients_to_veil_serve_to_veil_decode(backend, collector_factory, tmp_path,
                                                   request) -> None:
    db = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    collector = collector_factory(REGISTRY, db=db)
    total = report_from_real_clients(collector.url, tmp_path)
    document = collector.counts("crash_by_browser")
    assert document["reports"] == total and document["params"]["of"] == ["browser", "crashed"]

    out = tmp_path / "decoded"
    run = subprocess.run(
        [sys.executable, "-m", "veil.server.cli", "decode", "--server", collector.url,
         "--token", collector.token, "--metric", "crash_by_browser", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert {"results.csv", "summary.json", "conditional.csv", "marginals.csv",
            "heatmap.png"} <= {path.name for path in out.iterdir()}
    with open(out / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and {row["browser"] for row in rows} == {"chrome", "firefox", "safari"}
    for row in rows:
        truth = POPULATION[(row["browser"], row["crashed"] == "true")] / total
        # unbiased with the stated population standard error: within 4 of them
        assert abs(float(row["proportion"]) - truth) <= 4 * float(row["prop_std_error"]), row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["independence"]["dof"] == 2 and summary["privacy"]["epsilon_per_value"] <= 4.0
    # the crash rate depends on the browser (10% / 30% / 50%): the test sees it
    assert summary["independence"]["p_value"] < 1e-3
    with open(out / "conditional.csv", newline="") as handle:
        conditional = {(r["given"], r["value"]): r for r in csv.DictReader(handle)}
    for browser, rate in (("chrome", 0.1), ("firefox", 0.3), ("safari", 0.5)):
        row = conditional[(f"browser={browser}", "true")]
        assert abs(float(row["conditional"]) - rate) <= 4 * float(row["std_error"]), row

    from veil.server.analysis import decode_metric

    frame = decode_metric(metric="crash_by_browser", server=collector.url,
                          token=collector.token).to_pandas()
    assert list(frame["crashed"]) == ["false", "true"] * 3
    assert frame["consistent"].sum() == pytest.approx(1.0) and (frame["consistent"] >= 0).all()


def test_bad_tuples_and_forged_payloads_are_refused_by_name(collector_factory, tmp_path) -> None:
    from veil.client import Client
    from veil.shared.errors import ParameterError

    collector = collector_factory(REGISTRY)
    with Client(collector.url, tmp_path / "state", strict=True) as client:
        with pytest.raises(ParameterError, match="value browser is not one of its 3 values"):
            client.report("crash_by_browser", {"browser": "opera", "crashed": True})
        with pytest.raises(ParameterError, match="misses 'crashed'"):
            client.report("crash_by_browser", {"browser": "chrome"})
        assert client.flush().ok
    params = REGISTRY["crash_by_browser"].params
    forged = [make_report(f"{i:032x}", "crash_by_browser", None, payload, params.fingerprint)
              for i, payload in enumerate([params.cells, -1, "3", 1.0])]
    response = requests.post(collector.url + "/v1/reports", json=make_batch("cd" * 16, forged),
                             timeout=30)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith(
        "application/json")
    receipt = response.json()
    assert (receipt["accepted"], receipt["rejected"]) == (0, 4), receipt
    assert [(e["field"], e["code"]) for e in receipt["errors"]] == [
        ("reports[0].payload", "out_of_range"), ("reports[1].payload", "out_of_range"),
        ("reports[2].payload", "wrong_type"), ("reports[3].payload", "wrong_type")]
