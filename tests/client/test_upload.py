"""The SDK uploading to a real Veil collector over HTTP on 127.0.0.1.

``live_collector`` serves the collector app in-process (werkzeug); the
``collector_factory`` fixture runs ``veil serve`` as a process, used where
the collector must go down and come back, or needs options. Both come from
the suite's shared conftest.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import requests

from veil.client import Client, RegistryUnavailableError
from veil.client.state_dir import REGISTRY_CACHE_FILE
from veil.shared.bits import hex_to_bits
from veil.shared.registry import Registry

VALUES = {
    "homepage": ["example.com", "veil.dev", "example.com", "news.example"],
    "browser": ["firefox", "chrome", "safari", "other"],
    "dark_mode": [True, False, True],
    "load_time": [0.5, 3.25, 9.9],
    "battery": [10.0, 55.5, 99.0],
    "latency": [0.1, 0.9, 0.5],
}
TOTAL = sum(len(values) for values in VALUES.values())
FAST = {"max_retries": 2, "backoff_base": 0.01, "backoff_cap": 0.05, "timeout": 5.0}


def report_offline(url: str, state: Path, registry: Registry) -> None:
    """Queue every value of :data:`VALUES` with the collector unreachable at ``url``."""
    with Client(url, state, registry=registry, **FAST) as client:
        report_all(client)
        assert client.pending == TOTAL


def report_all(client: Client) -> None:
    for metric, values in VALUES.items():
        for value in values:
            client.report(metric, value)


def record_bodies(client: Client) -> list[bytes]:
    """Every upload body the client's session sends (a requests response hook)."""
    bodies: list[bytes] = []

    def hook(response: requests.Response, *args: object, **kwargs: object) -> None:
        if response.request.method != "POST":
            return
        body = response.request.body
        bodies.append(body if isinstance(body, bytes) else (body or "").encode())

    client.session.hooks["response"].append(hook)
    return bodies


def test_flush_delivers_every_kind_and_counts_match_the_payloads(live_collector, tmp_path):
    client = Client(live_collector.url, tmp_path / "state")
    bodies = record_bodies(client)
    report_all(client)
    assert client.pending == TOTAL
    result = client.flush()
    assert result.ok, result.error
    counts = (result.sent, result.accepted, result.duplicates, result.rejected)
    assert counts == (TOTAL, TOTAL, 0, 0)
    assert result.remaining == 0 and client.pending == 0
    sent = [report for body in bodies for report in json.loads(body)["reports"]]
    assert len(sent) == TOTAL and len({r["id"] for r in sent}) == TOTAL
    registry = live_collector.registry
    for metric in VALUES:
        document = live_collector.counts(metric)
        mine = [r for r in sent if r["metric"] == metric]
        assert document["reports"] == len(mine)
        params = registry[metric].params
        if params.kind in ("string", "category"):
            for entry in document["cohorts"]:
                payloads = [r["payload"] for r in mine if r.get("cohort", 0) == entry["cohort"]]
                ones = [sum((hex_to_bits(p, params.k) >> i) & 1 for p in payloads)
                        for i in range(params.k)]
                assert (entry["reports"], entry["ones"]) == (len(payloads), ones)
    client.close()


def test_pending_never_misses_the_values_that_move_to_the_outbox(collector, tmp_path):
    """Issue 25, item 10: the registry fetch took the values waiting for it out of memory
    before it queued them, so for a moment they were counted nowhere (1 fresh client in 200
    said ``pending == 0`` right after 20 reports, and this file's first test failed once).
    Fresh installations race their first fetch from ``veil serve``, their 20 reports spread
    over the few milliseconds it takes; nothing is uploaded before ``close()``, so after the
    n-th report ``pending`` must be exactly n."""
    wrong = []
    for index in range(40):
        client = Client(collector.url, tmp_path / f"state{index}", max_retries=0)
        for reported in range(1, 21):
            client.report("dark_mode", True)
            pending = client.pending
            if pending != reported:
                wrong.append((index, reported, pending))
            time.sleep(0.0005)
        client.close()
    assert wrong == []


def test_raw_values_never_reach_disk_or_network(live_collector, tmp_path):
    """Distinctive raw values appear nowhere: state files (WAL included), HTTP bodies, collector."""
    state = tmp_path / "state"
    client = Client(live_collector.url, state)
    bodies = record_bodies(client)
    canaries = ["canary-7f3a9c.example", "zebra-41d2e8-unique.test"]
    numbers = [7.123456789, 3.987654321]
    for _ in range(3):
        for value in canaries:
            client.report("homepage", value)
        for value in numbers:
            client.report("load_time", value)
    needles = [c.encode() for c in canaries] + [repr(n).encode() for n in numbers]

    def assert_clean(directory: Path) -> None:
        files = [p for p in directory.rglob("*") if p.is_file()]
        assert files
        for path in files:
            data = path.read_bytes()
            for needle in needles:
                assert needle not in data, f"{needle!r} found in {path.name}"

    assert (state / "veil.db-wal").exists()
    assert_clean(state)  # queued, WAL and SHM present
    assert client.flush().accepted == 12
    assert bodies
    for body in bodies:
        for needle in needles:
            assert needle not in body
    assert_clean(state)
    client.close()
    assert_clean(state)
    assert_clean(live_collector.db_path.parent)


def test_collector_down_keeps_reports_then_delivers_when_it_returns(collector_factory, tmp_path):
    collector = collector_factory()
    client = Client(collector.url, tmp_path / "state", **FAST)
    assert client.flush().ok and client.registry is not None  # fetched, then the collector stops
    collector.stop()
    report_all(client)
    failed = client.flush()
    assert not failed.ok and "failed" in failed.error
    assert (failed.sent, failed.remaining) == (0, TOTAL)
    assert client.pending == TOTAL
    collector.start()  # same port, same database
    delivered = client.flush()
    assert delivered.ok, delivered.error
    assert (delivered.accepted, delivered.remaining) == (TOTAL, 0)
    assert sum(collector.counts(m)["reports"] for m in VALUES) == TOTAL
    client.close()


def test_resending_is_idempotent(live_collector, tmp_path, offline_url):
    """The same queued reports uploaded twice (a lost acknowledgement) count once."""
    original = tmp_path / "state"
    report_offline(offline_url, original, live_collector.registry)
    shutil.copytree(original, tmp_path / "copy")
    with Client(live_collector.url, original) as client:
        assert client.flush().accepted == TOTAL
    with Client(live_collector.url, tmp_path / "copy") as again:
        result = again.flush()
    assert (result.accepted, result.duplicates, result.remaining) == (0, TOTAL, 0)
    assert live_collector.counts("homepage")["reports"] == len(VALUES["homepage"])


def test_interrupted_upload_is_queued_again_on_start(live_collector, tmp_path, offline_url):
    """Rows left in flight by a crash mid-upload return to ready and are delivered."""
    state = tmp_path / "state"
    report_offline(offline_url, state, live_collector.registry)
    database = sqlite3.connect(state / "veil.db")
    database.execute("UPDATE outbox SET state = 1")
    database.commit()
    database.close()
    client = Client(live_collector.url, state)
    assert client.pending == TOTAL
    assert client.flush().accepted == TOTAL
    client.close()


def test_rejected_reports_are_dropped_counted_and_logged(live_collector, tmp_path, caplog):
    """Reports encoded for other parameters than the collector's are refused: dropped, counted.

    Only f differs (the collector has f=0.5), so the payloads have the right shape: only
    the parameter fingerprint they carry tells that they cannot be decoded.
    """
    mismatched = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": 32, "h": 2, "m": 4, "f": 0.25},
        "dark_mode": {"kind": "boolean"},
    }})
    client = Client(live_collector.url, tmp_path / "state", registry=mismatched)
    for _ in range(3):
        client.report("homepage", "example.com")
    for _ in range(2):
        client.report("dark_mode", True)
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        result = client.flush()
    assert result.ok
    assert (result.sent, result.accepted, result.rejected, result.remaining) == (5, 2, 3, 0)
    assert client.dropped == 3
    assert "stale_params" in caplog.text
    client.close()
    with Client(live_collector.url, tmp_path / "state", registry=mismatched) as reopened:
        assert reopened.dropped == 3  # the counter is durable


def test_batches_split_by_count_and_on_collector_limits(collector_factory, tmp_path):
    collector = collector_factory(max_reports=10)
    client = Client(collector.url, tmp_path / "state", batch_size=40)
    bodies = record_bodies(client)
    for index in range(35):
        client.report("homepage", f"site{index % 4}.example")
    result = client.flush()
    assert result.ok, result.error
    assert (result.accepted, result.remaining) == (35, 0)
    sizes = [len(json.loads(body)["reports"]) for body in bodies]
    # halved while the collector says too_many, then kept at the size it accepts
    assert sizes == [35, 17, 8, 8, 8, 8, 3]
    assert result.batches == 5
    client.close()


def test_batches_respect_the_byte_limit(live_collector, tmp_path):
    client = Client(live_collector.url, tmp_path / "state", max_batch_bytes=1000)
    bodies = record_bodies(client)
    for _ in range(30):
        client.report("homepage", "example.com")
    assert client.flush().accepted == 30
    assert len(bodies) > 1
    assert all(len(body) <= 1000 + 200 for body in bodies)  # reports + the batch envelope
    client.close()


def test_upload_token(collector_factory, tmp_path):
    collector = collector_factory(upload_token="upload-secret")
    anonymous = Client(collector.url, tmp_path / "a")
    anonymous.report("dark_mode", True)
    result = anonymous.flush()
    assert not result.ok and "401" in result.error and result.remaining == 1
    anonymous.close(timeout=1)
    with Client(collector.url, tmp_path / "b", token="upload-secret") as client:
        client.report("dark_mode", True)
        assert client.flush().accepted == 1


def test_background_uploader_delivers_without_flush(live_collector, tmp_path):
    client = Client(live_collector.url, tmp_path / "state", background=True, flush_interval=0.1)
    report_all(client)
    deadline = time.monotonic() + 15
    while client.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.pending == 0
    assert sum(live_collector.counts(m)["reports"] for m in VALUES) == TOTAL
    client.close()


def test_close_makes_a_final_time_limited_flush(live_collector, tmp_path):
    client = Client(live_collector.url, tmp_path / "state", background=True, flush_interval=60)
    report_all(client)
    started = time.monotonic()
    result = client.close(timeout=5)
    assert time.monotonic() - started < 5
    assert result is not None and result.accepted == TOTAL


def test_close_is_quick_when_the_collector_is_down(tmp_path, test_registry, offline_url):
    client = Client(offline_url, tmp_path / "state", registry=test_registry,
                    background=True, flush_interval=60)
    client.report("dark_mode", True)
    started = time.monotonic()
    result = client.close(timeout=2)
    assert time.monotonic() - started < 2.5
    assert result is not None and result.remaining == 1


def test_registry_is_cached_for_offline_start(collector_factory, tmp_path):
    collector = collector_factory()
    state = tmp_path / "state"
    Client(collector.url, state).close(timeout=1)
    assert Registry.from_dict(json.loads((state / REGISTRY_CACHE_FILE).read_text())) == (
        collector.registry
    )
    collector.stop()
    offline = Client(collector.url, state, **FAST)
    assert offline.registry == collector.registry
    offline.report("homepage", "example.com")
    offline.close(timeout=1)
    with pytest.raises(RegistryUnavailableError, match="registry="):
        Client(collector.url, tmp_path / "fresh", strict=True, **FAST)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_uses_its_own_connection(live_collector, tmp_path):
    client = Client(live_collector.url, tmp_path / "state")
    client.report("dark_mode", True)
    pid = os.fork()
    if pid == 0:  # the child: report and upload through its own connection and session
        status = 1
        try:
            client.report("dark_mode", False)
            status = 0 if client.flush().ok else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.report("dark_mode", True)
    assert client.flush().ok
    assert live_collector.counts("dark_mode")["reports"] == 3
    client.close()


def test_a_stalled_collector_times_out_and_the_resend_counts_once(live_collector, tmp_path,
                                                                   caplog):
    """A collector slower than the client's timeout: the client retries, the collector later
    stores the first copy and acknowledges the resends as duplicates, and nothing counts twice.

    The stall is real: the test holds the collector's writer lock (``<db>.lock``, an
    exclusive ``flock``) for a second, so every upload waits inside the collector.
    """
    client = Client(live_collector.url, tmp_path / "state", timeout=0.3, max_retries=10,
                    backoff_base=0.05, backoff_cap=0.2)
    for index in range(10):
        client.report("homepage", f"site{index}.example")
    lock_path = live_collector.db_path.with_name(live_collector.db_path.name + ".lock")
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    release = threading.Timer(1.0, lambda: fcntl.flock(descriptor, fcntl.LOCK_UN))
    release.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="veil.client"):
            result = client.flush()
    finally:
        release.join()
        os.close(descriptor)
    # each retry is a DEBUG line: an outage must not fill the application's INFO log
    assert [r.levelno for r in caplog.records if "retrying" in r.getMessage()][:1] == [logging.DEBUG]
    assert "Timeout" in caplog.text
    assert result.ok, result.error
    assert result.accepted + result.duplicates == 10 and result.remaining == 0
    assert live_collector.counts("homepage")["reports"] == 10
    client.close()
