"""SIGKILL in the middle of a stream of uploads loses nothing the collector acknowledged."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tests.conftest import wait_until
from tests.server.conftest import children_pids
from veil.server.storage import open_storage


def kill_while_uploading(collector, wire, batch: Callable[[], list[dict]] | None = None,
                         ) -> tuple[list[dict], list[dict]]:
    """Upload from 3 threads until 1,500 reports are acknowledged, SIGKILL the collector,
    start it again; returns the acknowledged reports and every report stored. ``batch``
    makes each upload's reports (default: 50 homepage reports)."""
    acked: list[dict] = []
    in_flight: list[list[dict]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def upload() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                reports = batch() if batch else wire.reports("homepage",
                                                             ["crash.example", "x.example"] * 25)
                with lock:
                    in_flight.append(reports)
                try:
                    response = session.post(collector.url + "/v1/reports",
                                            json=wire.batch(reports), timeout=30)
                except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                    return  # killed before it answered (or in the middle of its answer)
                if response.status_code == 200 and response.json()["accepted"] == len(reports):
                    with lock:
                        acked.extend(reports)
                        in_flight.remove(reports)

    uploaders = [threading.Thread(target=upload) for _ in range(3)]
    for thread in uploaders:
        thread.start()
    deadline = time.monotonic() + 60
    while len(acked) < 1500 and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = children_pids(collector.process.pid)
    collector.kill()
    stop.set()
    for thread in uploaders:
        thread.join(30)
    assert len(acked) >= 1500
    # the killed server's workers (--workers N) end once they see their parent gone
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers),
               "the killed collector's workers to end")

    collector.start()
    with sqlite3.connect(collector.db_path) as conn:
        stored_ids = [row[0].hex() for row in conn.execute("SELECT id FROM reports")]
    distinct = set(stored_ids)
    assert len(stored_ids) == len(distinct), "a report was stored twice"
    assert {r["id"] for r in acked} <= distinct
    unacked_stored = [r for batch in in_flight for r in batch if r["id"] in distinct]
    # a batch committed just before the kill may be stored without its acknowledgement
    assert len(stored_ids) == len(acked) + len(unacked_stored)
    return acked, acked + unacked_stored


def _check_counts(collector, wire, stored: list[dict]) -> None:
    document = collector.counts("homepage")
    assert document["cohorts"] == wire.expected("homepage", stored)["cohorts"]
    collector.stop()
    with open_storage(collector.db_path) as storage:
        storage.rebuild_aggregates()
        assert storage.counts("homepage") == document


def test_acknowledged_reports_survive_sigkill(collector, wire):
    _, stored = kill_while_uploading(collector, wire)
    _check_counts(collector, wire, stored)


def test_sigkill_among_id_merges_keeps_every_id_once(collector_factory, wire):
    """With a merge of recent ids into the index every 64 reports, a kill lands among merges:
    afterwards every stored id is in exactly one of the id tables, and resent reports,
    merged or not, are duplicates."""
    collector = collector_factory(recent_ids_limit=64)
    acked, stored = kill_while_uploading(collector, wire)
    with sqlite3.connect(collector.db_path) as conn:
        indexed = [row[0].hex() for row in conn.execute("SELECT id FROM report_ids")]
        recent = [row[0].hex() for row in conn.execute("SELECT id FROM recent_ids")]
    # at most the limit less one, plus a group of 3 uploads of 50 killed before its merge
    assert len(recent) < 64 + 3 * 50, "merges should have indexed nearly every id"
    assert sorted(indexed + recent) == sorted(r["id"] for r in stored)
    resent = [*acked[:100], *acked[-100:]]
    response = requests.post(collector.url + "/v1/reports", json=wire.batch(resent), timeout=30)
    assert (response.json()["accepted"], response.json()["duplicates"]) == (0, 200)
    _check_counts(collector, wire, stored)
