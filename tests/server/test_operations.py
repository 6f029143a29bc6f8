"""Running the collector: tokens and the environment, logs, /metrics, worker restarts, and
clear errors for files the commands cannot write.

``veil serve`` runs as a real process on 127.0.0.1 wherever its behaviour is the point
(start-up refusals, its log, its workers); ``/metrics``' contents are checked in-process
with Flask's test client.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from waitress.adjustments import Adjustments

from veil.server.cli import build_parser
from veil.server.collector import EXTENSION, create_app
from veil.server.collector.cli import serve_config
from veil.server.collector.logs import configure_logging
from veil.server.collector.serving import MAX_RESTARTS, _Channel, _Server

#: a line of the text log: UTC time to the millisecond, level, logger[pid]: message
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) +"
                       r"[\w.]+\[\d+\]: .+")


def veil(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
         ) -> subprocess.CompletedProcess[str]:
    """Run ``veil ARGS`` with the environment without any ``VEIL_`` variable, plus ``env``."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**clean, **(env or {})})


def scrape(client, token: str) -> dict[str, float]:
    """``GET /metrics`` with ``token``: each sample as ``name{label=value}`` -> value."""
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Type"].startswith("text/plain")
    return samples(response.get_data(as_text=True))


def samples(text: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition, keyed ``name`` or ``name{k=v,...}``."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found


# tokens and the environment


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--read-token", ""], {}, "--read-token"),
    (["--read-token", "good", "--read-token", "  "], {}, "--read-token"),
    (["--upload-token", ""], {}, "--upload-token"),
    (["--metrics-token", ""], {}, "--metrics-token"),
    ([], {"VEIL_READ_TOKEN": "old,"}, "$VEIL_READ_TOKEN"),
])
def test_an_empty_token_is_refused_at_start_naming_the_option(tmp_path, test_registry, args, env,
                                                            named):
    """``--read-token "$VEIL_READ_TOKEN"`` with the variable unset used to start a collector
    nobody could read from; now it stops at once with status 2 and says what to do."""
    config = tmp_path / "metrics.toml"
    config.write_text(test_registry.to_toml())
    result = veil("serve", "--config", str(config), "--db", str(tmp_path / "veil.db"),
                  "--port", "0", *args, env=env, timeout=30)
    assert result.returncode == 2
    assert named in result.stderr and "empty token" in result.stderr
    assert "Traceback" not in result.stderr and "listening" not in result.stdout


def test_token_lists_from_the_environment_rotate_read_upload_and_metrics_tokens(
        tmp_path, test_registry, wire, monkeypatch):
    monkeypatch.setenv("VEIL_READ_TOKEN", "read-old, read-new")
    monkeypatch.setenv("VEIL_UPLOAD_TOKEN", "upload-old,upload-new")
    monkeypatch.setenv("VEIL_METRICS_TOKEN", "scrape")
    args = build_parser().parse_args(["serve", "--config", "unused.toml",
                                      "--db", str(tmp_path / "veil.db")])
    config = serve_config(args)
    assert config["READ_TOKENS"] == ["read-old", "read-new"]
    app = create_app({**config, "REGISTRY": test_registry})
    client = app.test_client()
    for token in ("upload-old", "upload-new"):
        batch = wire.batch(wire.reports("dark_mode", [True]))
        response = client.post("/v1/reports", json=batch,
                               headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200 and response.json["accepted"] == 1
    assert client.post("/v1/reports", json=wire.batch(wire.reports("dark_mode", [True])),
                       headers={"Authorization": "Bearer read-old"}).status_code == 401
    for token in ("read-old", "read-new"):
        response = client.get("/v1/metrics/dark_mode/counts",
                              headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200 and response.json["reports"] == 2
    # the metrics token scrapes /metrics and reads nothing else
    assert scrape(client, "scrape")["veil_reports_accepted_total"] == 2
    assert client.get("/v1/metrics/dark_mode/counts",
                      headers={"Authorization": "Bearer scrape"}).status_code == 401
    app.extensions[EXTENSION].storage.close()


def test_every_collector_command_takes_its_database_and_registry_from_the_environment(
        app, client, wire, tmp_path):
    client.post("/v1/reports", json=wire.batch(wire.reports("homepage", ["a.example"] * 5)))
    app.extensions[EXTENSION].storage.close()
    env = {"VEIL_DB": str(client.db_path)}
    rebuilt = veil("rebuild-aggregates", env=env)
    assert rebuilt.returncode == 0 and "5 reports" in rebuilt.stdout, rebuilt.stderr
    backup = veil("backup", "--out", str(tmp_path / "copy.db"), env=env)
    assert backup.returncode == 0 and (tmp_path / "copy.db").is_file(), backup.stderr
    exported = veil("export", "--metric", "homepage", "--out", str(tmp_path / "x"), env=env)
    assert exported.returncode == 0 and (tmp_path / "x" / "counts.csv").is_file(), exported.stderr
    config = tmp_path / "metrics.toml"
    config.write_text(client.registry.to_toml())
    listed = veil("metrics", env={"VEIL_CONFIG": str(config)})
    assert listed.returncode == 0 and "homepage" in listed.stdout, listed.stderr
    # with neither the option nor the variable, argparse names both
    missing = veil("backup", "--out", str(tmp_path / "other.db"))
    assert missing.returncode == 2 and "--db" in missing.stderr


def test_veil_metrics_states_the_delta_of_gaussian_numbers(tmp_path):
    """A Gaussian number metric is (epsilon, delta)-LDP: ``veil metrics`` says delta beside
    its epsilons and in the total, which is epsilon alone without one. Delta is rounded up,
    as the epsilons are: 1.2345641e-6 read 1.23456e-06, below what it is."""
    config = tmp_path / "metrics.toml"
    gaussian = ('[metrics.latency]\nkind = "number"\nlow = 0.0\nhigh = 10.0\n'
                'mechanism = "gaussian"\nepsilon = 1.0\ndelta = 1e-6\n')
    config.write_text('version = 1\n[metrics.dark_mode]\nkind = "boolean"\n' + gaussian)
    listed = veil("metrics", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert "one number (with delta 1.00e-6 per value)" in listed.stdout, listed.stdout
    assert "with delta 1.00e-6 from its Gaussian numbers" in listed.stdout, listed.stdout
    config.write_text(config.read_text().replace("delta = 1e-6", "delta = 1.2345641e-6")
                      + gaussian.replace("latency", "load"))
    listed = veil("metrics", "--config", str(config))
    assert "(with delta 1.24e-6 per value)" in listed.stdout, listed.stdout
    assert "with delta 2.24e-6 from its Gaussian numbers" in listed.stdout, listed.stdout
    config.write_text('version = 1\n[metrics.dark_mode]\nkind = "boolean"\n')
    assert "delta" not in veil("metrics", "--config", str(config)).stdout


# files the commands write


def test_backup_into_a_missing_directory_names_it_and_says_to_create_it(app, client, tmp_path):
    app.extensions[EXTENSION].storage.close()
    target = tmp_path / "missing" / "dir" / "copy.db"
    result = veil("backup", "--db", str(client.db_path), "--out", str(target))
    assert result.returncode == 1, result.stderr
    assert f"the directory {target.parent} does not exist" in result.stderr
    assert f"mkdir -p {target.parent}" in result.stderr
    assert not (tmp_path / "missing").exists()
    (tmp_path / "plain").write_text("")
    result = veil("backup", "--db", str(client.db_path), "--out", str(tmp_path / "plain" / "c.db"))
    assert result.returncode == 1 and "is not a directory" in result.stderr


def test_export_where_it_cannot_write_is_a_clear_error(app, client, wire, tmp_path):
    client.post("/v1/reports", json=wire.batch(wire.reports("homepage", ["a.example"] * 5)))
    app.extensions[EXTENSION].storage.close()
    (tmp_path / "plain").write_text("")
    out = tmp_path / "plain" / "export"
    result = veil("export", "--db", str(client.db_path), "--metric", "homepage", "--out", str(out))
    assert result.returncode == 1
    assert f"--out {out}: cannot write" in result.stderr and "Traceback" not in result.stderr


# /metrics


def test_metrics_counts_batches_by_outcome_and_reports_the_storage_size(app_factory, wire):
    app = app_factory(METRICS_TOKENS=["scrape"])
    client = app.test_client()
    sent = wire.reports("homepage", ["a.example"] * 30)
    assert client.post("/v1/reports", json=wire.batch(sent)).json["accepted"] == 30
    assert client.post("/v1/reports", json=wire.batch(sent[:10])).json["duplicates"] == 10
    stray = wire.reports("dark_mode", [True, False])
    stray[1] = {**stray[1], "metric": "no_such_metric"}
    receipt = client.post("/v1/reports", json=wire.batch(stray)).json
    assert (receipt["accepted"], receipt["rejected"]) == (1, 1)
    rejected_code = receipt["errors"][0]["code"]
    assert client.post("/v1/reports", data=b"{not json",
                       content_type="application/json").status_code == 400
    assert client.post("/v1/reports", data=b"{}", content_type="text/plain").status_code == 415

    found = scrape(client, "scrape")
    assert found["veil_reports_accepted_total"] == 31
    assert found["veil_reports_duplicate_total"] == 10
    assert found[f"veil_reports_rejected_total{{code={rejected_code}}}"] == 1
    assert found["veil_batches_refused_total{code=bad_json}"] == 1
    assert found["veil_batches_refused_total{code=unsupported_media_type}"] == 1
    assert found["veil_batch_seconds_count"] == 3
    assert 0 < found["veil_batch_seconds_sum"] < 30
    db = client.db_path
    wal = Path(f"{db}-wal")
    on_disk = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert found["veil_storage_bytes"] == on_disk > 0
    # labels are the metric's own name and API error codes: nothing a client sent
    labels = {key.partition("{")[2] for key in found
              if "{" in key and not key.startswith(("veil_build_info{", "python_info{"))}
    assert all(label.startswith(("code=", "le=")) for label in labels), labels
    # a read token scrapes as well
    assert scrape(client, client.token)["veil_reports_accepted_total"] == 31


def test_metrics_count_batches_refused_by_http_errors_and_storage_failures(app_factory, wire):
    """Refusals the error handlers answer count under the code of their answer."""
    app = app_factory(METRICS_TOKENS=["scrape"], MAX_CONTENT_LENGTH=4096)
    client = app.test_client()
    too_large = client.post("/v1/reports", data=b"[" + b" " * 5000 + b"]",
                            content_type="application/json")
    assert too_large.status_code == 413 and too_large.json["error"]["code"] == "body_too_large"
    app.extensions[EXTENSION].storage.close()
    gone = client.post("/v1/reports", json=wire.batch(wire.reports("dark_mode", [True])))
    assert gone.status_code == 503 and gone.json["error"]["code"] == "unavailable"
    found = scrape(client, "scrape")
    assert found["veil_batches_refused_total{code=body_too_large}"] == 1
    assert found["veil_batches_refused_total{code=unavailable}"] == 1


def test_metrics_needs_a_token_and_says_how_to_configure_one(app_factory):
    client = app_factory(METRICS_TOKENS="scrape").test_client()
    missing = client.get("/metrics")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    closed = app_factory(READ_TOKENS=[]).test_client().get("/metrics")
    assert closed.status_code == 403
    assert closed.json["error"]["code"] == "metrics_disabled"
    assert "--metrics-token" in closed.json["error"]["message"]


# logs, over a real veil serve


def test_log_is_json_lines_with_a_start_up_summary_and_one_line_about_the_queue(
        collector_factory, wire):
    """waitress used to print a bare ``Task queue depth is N`` for every request that waited,
    and nothing else; now every line is a JSON object with time and level, the start-up
    summary says what runs how (counting tokens, never showing them), and the waits are one
    INFO line a minute (each one at DEBUG)."""
    collector = collector_factory(
        threads=1, upload_token="upload-secret",
        serve_args=["--log-format", "json", "--log-level", "debug",
                    "--metrics-token", "scrape-secret"])
    batches = [wire.batch(wire.reports("homepage", ["q.example"] * 300)) for _ in range(40)]
    headers = {"Authorization": "Bearer upload-secret"}

    def upload(chunk: list[dict]) -> None:
        for batch in chunk:
            response = requests.post(collector.url + "/v1/reports", json=batch, headers=headers,
                                     timeout=60)
            assert response.status_code == 200

    threads = [threading.Thread(target=upload, args=(batches[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert collector.stop() == 0
    text = (collector.workdir / "serve.log").read_text()
    entries = [json.loads(line) for line in text.splitlines()]
    for entry in entries:
        assert {"time", "level", "logger", "pid", "message"} <= set(entry)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])
    messages = [entry["message"] for entry in entries]
    summary = "\n".join(messages)
    assert str(collector.db_path) in summary and "7 metrics" in summary
    assert ("uploads need one of 1 upload token(s); 1 read token(s); 1 metrics token(s); "
            "/metrics takes a metrics or read token") in summary
    assert f"1 worker(s) of 1 threads, listening on {collector.url}" in summary
    for secret in ("upload-secret", "scrape-secret", collector.token):
        assert secret not in text
    queued = [entry for entry in entries if entry["logger"] == "waitress.queue"]
    assert any(entry["level"] == "DEBUG" and entry["message"].startswith("Task queue depth is")
               for entry in queued), "the uploads never had to wait: the test proves nothing"
    waiting = [entry for entry in queued if entry["level"] == "INFO"]
    assert len(waiting) == 1 and "raise --threads or --workers" in waiting[0]["message"]
    assert messages[-1] == "stopped"


def test_waitress_error_lines_about_a_connection_name_no_client_address(app, caplog):
    """waitress describes a connection by its peer's address when it logs an error on it;
    the collector's connections describe themselves without it."""
    listener = socket.create_server(("127.0.0.1", 0))
    adj = Adjustments(sockets=[listener])
    server = _Server(app, listener, adj, receive_timeout=5, body_limit=1024)
    peer = socket.create_connection(listener.getsockname())
    accepted, address = listener.accept()
    channel = _Channel(server, accepted, address, adj, map={})
    try:
        raise ValueError("a failure while serving")
    except ValueError:
        channel.handle_error()
    peer.close()
    server.close()
    logged = caplog.text
    assert "a failure while serving" in logged and "veil connection" in logged
    assert address[0] not in logged


@pytest.fixture
def restored_logging():
    """Put the root logger and waitress's queue logger back as they were after the test."""
    root, queue = logging.getLogger(), logging.getLogger("waitress.queue")
    saved = root.handlers[:], root.level, queue.filters[:]
    yield
    root.handlers[:], queue.filters[:] = saved[0], saved[2]
    root.setLevel(saved[1])


def test_at_info_a_burst_of_queue_warnings_is_one_line(restored_logging):
    stream = io.StringIO()
    configure_logging("text", "info", stream)
    queue = logging.getLogger("waitress.queue")
    for depth in [1, 2, 3, 9, 4] * 10:
        queue.warning("Task queue depth is %d", depth)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and TEXT_LINE.fullmatch(lines[0])
    assert " INFO " in lines[0] and "1 waited since the last report" in lines[0]
    configure_logging("text", "debug", stream)
    queue.warning("Task queue depth is %d", 5)
    queue.warning("Task queue depth is %d", 6)
    last = stream.getvalue().splitlines()[-1]
    assert " DEBUG " in last and last.endswith(f"waitress.queue[{os.getpid()}]: Task queue depth is 6")


def test_a_bad_log_setting_from_the_environment_is_refused(tmp_path, test_registry):
    config = tmp_path / "metrics.toml"
    config.write_text(test_registry.to_toml())
    result = veil("serve", "--config", str(config), "--db", str(tmp_path / "veil.db"),
                  "--port", "0", env={"VEIL_LOG_FORMAT": "xml"}, timeout=30)
    assert result.returncode == 2
    assert "--log-format (default $VEIL_LOG_FORMAT) must be one of text, json; got 'xml'" in (
        result.stderr)


# workers


def wait_for(condition, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_killed_worker_is_replaced_and_metrics_add_up_across_workers(
        collector_factory, wire, tmp_path, monkeypatch, children_of):
    """SIGKILL of one of two workers used to stop the whole server; now the supervisor
    logs it and starts another, uploads go on, and /metrics (prometheus_client's
    multiprocess mode, in a private directory removed at exit) still counts what the
    killed worker took."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    collector = collector_factory(workers=2, serve_args=["--metrics-token", "scrape"])
    (metrics_dir,) = private_tmp.glob("veil-metrics-*")
    assert metrics_dir.stat().st_mode & 0o077 == 0
    url = collector.url

    def upload(batches: int) -> None:
        for _ in range(batches):
            batch = wire.batch(wire.reports("dark_mode", [True] * 10))
            assert requests.post(url + "/v1/reports", json=batch, timeout=30).json()["accepted"] == 10

    def accepted() -> float:
        response = requests.get(url + "/metrics", headers={"Authorization": "Bearer scrape"},
                                timeout=30)
        assert response.status_code == 200
        return samples(response.text)["veil_reports_accepted_total"]

    upload(6)
    first, second = children_of(collector.process.pid)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: len(set(children_of(collector.process.pid)) - {first}) == 2,
             what="a new worker")
    (replacement,) = set(children_of(collector.process.pid)) - {first, second}
    upload(4)
    assert [accepted() for _ in range(6)] == [100] * 6
    assert collector.counts("dark_mode")["reports"] == 100
    log = (collector.workdir / "serve.log").read_text()
    assert (f"worker {first} was killed by signal SIGKILL; started worker {replacement} in its "
            "place") in log
    assert all(TEXT_LINE.fullmatch(line) for line in log.splitlines()), log
    assert collector.stop() == 0
    assert not metrics_dir.exists()


def test_workers_that_keep_dying_stop_the_server(collector_factory, children_of):
    collector = collector_factory(workers=2)
    parent = collector.process.pid
    seen: set[int] = set()
    killed: set[int] = set()
    while len(killed) < MAX_RESTARTS and collector.process.poll() is None:
        seen.update(children_of(parent))
        alive = sorted(seen - killed)
        if alive:
            os.kill(alive[0], signal.SIGKILL)
            killed.add(alive[0])
        time.sleep(0.02)
    assert collector.process.wait(15) == 1
    collector.process.stdout.close()
    collector.process = None
    log = (collector.workdir / "serve.log").read_text()
    assert f"workers ended {MAX_RESTARTS} times within" in log and "stopping" in log
    assert not [pid for pid in seen if Path(f"/proc/{pid}").exists()]
