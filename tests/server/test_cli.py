"""The operator commands: veil serve (workers, errors), export, rebuild-aggregates, backup.

Every command runs as a ``veil`` process. The maintenance commands read a database
filled through Flask's test client (``client``): the app is the collector without
its HTTP server, so the database is the one a collector writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from tests.conftest import wait_until
from veil.server.collector import EXTENSION
from veil.server.storage import open_storage


def veil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=120)


def upload(client, wire, metric: str, values: list) -> list[dict]:
    sent = wire.reports(metric, values)
    response = client.post("/v1/reports", json=wire.batch(sent))
    assert response.json["accepted"] == len(sent)
    return sent


def stop(app) -> None:
    """Close the app's storage, as a collector does when it stops."""
    app.extensions[EXTENSION].storage.close()


def test_export_writes_google_rappor_params_and_counts(app, client, wire, tmp_path):
    sent = upload(client, wire, "homepage", ["a.example", "b.example"] * 10)
    stop(app)
    out = tmp_path / "export"
    result = veil("export", "--db", str(client.db_path), "--metric", "homepage", "--out", str(out))
    assert result.returncode == 0, result.stderr
    params = client.registry["homepage"].params
    assert (out / "params.csv").read_text().splitlines() == [
        "k,h,m,p,q,f", f"{params.k},{params.h},{params.m},{params.p},{params.q},{params.f}"]
    rows = [list(map(int, line.split(","))) for line in (out / "counts.csv").read_text().splitlines()]
    expected = wire.expected("homepage", sent)["cohorts"]
    assert rows == [[entry["reports"], *entry["ones"]] for entry in expected]
    assert all(len(row) == params.k + 1 for row in rows) and len(rows) == params.m


def test_export_of_a_category_metric_and_refusals(app, client, wire, tmp_path):
    upload(client, wire, "browser", ["chrome"] * 3)
    upload(client, wire, "rare", ["x"] * 3)
    stop(app)
    db = str(client.db_path)
    out = tmp_path / "cat"
    assert veil("export", "--db", db, "--metric", "browser", "--out", str(out)).returncode == 0
    assert (out / "params.csv").read_text().splitlines()[1] == "4,1,1,0.5,0.75,0.5"
    refused = veil("export", "--db", db, "--metric", "rare", "--out", str(tmp_path / "r"))
    assert refused.returncode == 1 and "min_reports" in refused.stderr and "3" in refused.stderr
    forced = veil("export", "--db", db, "--metric", "rare", "--out", str(tmp_path / "r"), "--force")
    assert forced.returncode == 0, forced.stderr
    boolean = veil("export", "--db", db, "--metric", "dark_mode", "--out", str(tmp_path / "b"))
    assert boolean.returncode == 2 and "exist only for metrics reported with RAPPOR bits" in boolean.stderr
    missing = veil("export", "--db", str(tmp_path / "none.db"), "--metric", "x", "--out", "o")
    assert missing.returncode == 2 and "no Veil database" in missing.stderr


def test_rebuild_aggregates_and_backup_commands(client, wire, tmp_path):
    upload(client, wire, "homepage", ["a", "b", "c"] * 5)
    before = client.counts("homepage")
    # beside the running app: another process holds the database open
    rebuilt = veil("rebuild-aggregates", "--db", str(client.db_path))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "15 reports" in rebuilt.stdout
    assert client.counts("homepage") == before
    copy = tmp_path / "backup.db"
    assert veil("backup", "--db", str(client.db_path), "--out", str(copy)).returncode == 0
    with open_storage(copy) as storage:
        assert storage.counts("homepage") == before


def test_serve_with_two_worker_processes(collector_factory, wire, children_of):
    collector = collector_factory(workers=2)
    sent = []
    with requests.Session() as session:
        for _ in range(10):
            batch = wire.reports("homepage", ["w.example"] * 20)
            assert session.post(collector.url + "/v1/reports", json=wire.batch(batch),
                                timeout=30).json()["accepted"] == 20
            sent += batch
    assert collector.counts("homepage")["cohorts"] == wire.expected("homepage", sent)["cohorts"]
    parent = collector.process.pid
    workers = children_of(parent)
    assert len(workers) == 2
    assert collector.stop() == 0

    def running() -> list[int]:
        alive = []
        for pid in workers:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            alive.append(pid)
        return alive

    wait_until(lambda: not running(), f"workers {workers} to end after SIGTERM", timeout=10)


def test_serve_refuses_bad_configuration(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[metrics.x]\nkind = "string"\nk = 0\n')
    result = veil("serve", "--config", str(config), "--db", str(tmp_path / "v.db"), "--port", "0")
    assert result.returncode == 2
    assert "metrics.x" in result.stderr and "Traceback" not in result.stderr
    result = veil("serve", "--config", str(tmp_path / "missing.toml"), "--db", "v.db")
    assert result.returncode == 2 and "cannot read registry file" in result.stderr
    # a metric bigger than a store may keep (2**24 counters): refused before it listens
    config.write_text('version = 1\n[metrics.big]\nkind = "string"\nk = 4096\nm = 8192\n')
    result = veil("serve", "--config", str(config), "--db", str(tmp_path / "v.db"), "--port", "0")
    assert result.returncode == 2 and "metrics.big" in result.stderr, result.stderr
    assert "16,777,216 a metric may keep" in result.stderr and "listening" not in result.stderr
    assert not (tmp_path / "v.db").exists()


def test_serve_refuses_sqlite_options_for_postgresql_and_limits_below_one(tmp_path):
    """Before it connects: a TypeError from the backend was all these gave."""
    config = Path(__file__).parents[2] / "examples" / "metrics.toml"
    for option, value, said in [("--fold-limit", "5", "--fold-limit applies to SQLite stores only"),
                                ("--recent-ids-limit", "5", "--recent-ids-limit applies to SQLite"),
                                ("--min-free-bytes", "0", "--min-free-bytes applies to SQLite")]:
        result = veil("serve", "--config", str(config), "--db", "postgresql://veil@127.0.0.1:1/veil",
                      option, value)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    result = veil("serve", "--config", str(config), "--db", str(tmp_path / "v.db"),
                  "--fold-limit", "0")
    assert result.returncode == 2 and "--fold-limit: must be at least 1; got 0" in result.stderr


def test_sigint_stops_serve_cleanly(collector):
    collector.process.send_signal(signal.SIGINT)
    assert collector.process.wait(15) == 0
    collector.process.stdout.close()
    collector.process = None


def test_serve_warns_about_a_short_token_in_its_log(collector_factory):
    """Nothing slows down wrong guesses of a token (over a thousand a second on one
    connection): a running collector given a short one says so where operators look."""
    collector = collector_factory(env={"VEIL_READ_TOKEN": "abc", "VEIL_UPLOAD_TOKEN": "up"})
    log = (collector.workdir / "serve.log").read_text()
    assert "holds a 3-character token, which can be guessed" in log, log
    assert "holds a 2-character token, which can be guessed" in log, log
    assert requests.get(collector.url + "/v1/stats", headers={"Authorization": "Bearer abc"},
                        timeout=30).status_code == 200  # a warning, not a refusal
