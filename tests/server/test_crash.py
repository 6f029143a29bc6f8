"""SIGKILL in the middle of a stream of uploads loses nothing the collector acknowledged."""

from __future__ import annotations

import sqlite3
import threading
import time

import requests

from veil.server.storage import open_storage


def test_acknowledged_reports_survive_sigkill(collector, wire):
    acked: list[dict] = []
    in_flight: list[list[dict]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def upload() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                reports = wire.reports("homepage", ["crash.example", "x.example"] * 25)
                with lock:
                    in_flight.append(reports)
                try:
                    response = session.post(collector.url + "/v1/reports",
                                            json=wire.batch(reports), timeout=30)
                except requests.ConnectionError:
                    return
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
    collector.kill()
    stop.set()
    for thread in uploaders:
        thread.join(30)
    assert len(acked) >= 1500

    collector.start()
    with sqlite3.connect(collector.db_path) as conn:
        stored_ids = {row[0].hex() for row in conn.execute("SELECT id FROM reports")}
    assert {r["id"] for r in acked} <= stored_ids
    unacked_stored = [r for batch in in_flight for r in batch if r["id"] in stored_ids]
    # a batch committed just before the kill may be stored without its acknowledgement
    assert len(stored_ids) == len(acked) + len(unacked_stored)
    stored = acked + unacked_stored
    document = collector.counts("homepage")
    assert document["cohorts"] == wire.expected("homepage", stored)["cohorts"]
    collector.stop()
    with open_storage(collector.db_path) as storage:
        storage.rebuild_aggregates()
        assert storage.counts("homepage") == document
