"""The collector and storage serve, export and maintain counts without the analysis.

The counts document and google/rappor's ``params.csv``/``counts.csv`` belong to
``veil.server.counts``, and the HTTP read helpers to ``veil.server.http``: a collector
(``veil serve``) and the database commands (``veil export``, ``stats``,
``rebuild-aggregates``, ``backup``) must work without ``veil.server.analysis`` (a
deployment may install the collector alone). Each process runs with Python's import log
(``-X importtime``, ``PYTHONPROFILEIMPORTTIME``), which names every module it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import requests

ANALYSIS = "veil.server.analysis"


def loaded(import_log: str) -> set[str]:
    """The modules an ``-X importtime`` log (a process's stderr) says were imported."""
    return {line.rsplit("|", 1)[1].strip() for line in import_log.splitlines()
            if line.startswith("import time:") and "|" in line}


def veil_logged(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``veil ARGS`` with the import log on; the result and the modules it loaded."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "veil.server.cli", *args],
                            capture_output=True, text=True, timeout=120)
    return result, loaded(result.stderr)


def test_a_collector_serves_counts_and_csv_without_loading_the_analysis(collector_factory, wire):
    collector = collector_factory(env={"PYTHONPROFILEIMPORTTIME": "1"})
    sent = wire.reports("homepage", ["a.example", "b.example"] * 10)
    answer = requests.post(collector.url + "/v1/reports", json=wire.batch(sent), timeout=30)
    assert answer.json()["accepted"] == 20
    document = collector.counts("homepage")
    assert document["cohorts"] == wire.expected("homepage", sent)["cohorts"]
    csv = requests.get(f"{collector.url}/v1/metrics/homepage/counts", params={"format": "csv"},
                       headers=collector.headers(), timeout=30)
    assert csv.status_code == 200
    rows = [list(map(int, line.split(","))) for line in csv.text.splitlines()]
    assert rows == [[entry["reports"], *entry["ones"]] for entry in document["cohorts"]]

    stats, modules = veil_logged("stats", "--server", collector.url, "--token", collector.token,
                                 "--metric", "homepage", "--format", "json")
    assert stats.returncode == 0, stats.stderr[-2000:]
    assert json.loads(stats.stdout)["metrics"][0]["reports"] == 20
    assert collector.stop() == 0
    served = loaded((Path(collector.workdir) / "serve.log").read_text())
    assert "veil.server.collector.routes" in served  # the log names what the collector loaded
    assert not {name for name in served if name.startswith(ANALYSIS)}
    assert not {name for name in modules if name.startswith(ANALYSIS)}


def test_the_database_commands_run_without_loading_the_analysis(app, client, wire, tmp_path):
    sent = wire.reports("homepage", ["a.example", "b.example"] * 10)
    assert client.post("/v1/reports", json=wire.batch(sent)).json["accepted"] == 20
    db = str(client.db_path)
    runs = {
        "export": ("export", "--db", db, "--metric", "homepage", "--out", str(tmp_path / "out")),
        "rebuild-aggregates": ("rebuild-aggregates", "--db", db),
        "backup": ("backup", "--db", db, "--out", str(tmp_path / "copy.db")),
    }
    for name, args in runs.items():
        result, modules = veil_logged(*args)
        assert result.returncode == 0, (name, result.stderr[-2000:])
        assert not {module for module in modules if module.startswith(ANALYSIS)}, name
        assert "veil.server.storage.base" in modules, name  # the log names what it loaded
    counts = (tmp_path / "out" / "counts.csv").read_text().splitlines()
    expected = wire.expected("homepage", sent)["cohorts"]
    assert [list(map(int, line.split(","))) for line in counts] == [
        [entry["reports"], *entry["ones"]] for entry in expected]
