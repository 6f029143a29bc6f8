"""Report ids make uploads idempotent: retries and concurrent resends count each report once.

Resends one after the other go through Flask's test client; concurrent uploads go
to ``veil serve`` (waitress, 8 threads) over HTTP.
"""

from __future__ import annotations

import random
import threading

import requests


def test_same_batch_twice_counts_once(client, wire):
    sent = wire.reports("homepage", ["a.example", "b.example", "c.example"] * 5)
    batch = wire.batch(sent)
    first = client.post("/v1/reports", json=batch).json
    second = client.post("/v1/reports", json=batch).json
    assert (first["accepted"], first["duplicates"]) == (15, 0)
    assert (second["accepted"], second["duplicates"]) == (0, 15)
    assert client.counts("homepage")["cohorts"] == wire.expected("homepage", sent)["cohorts"]


def test_repeats_within_a_batch_and_partial_overlap(client, wire):
    old = wire.reports("browser", ["chrome", "safari"])
    client.post("/v1/reports", json=wire.batch(old))
    new = wire.reports("browser", ["firefox", "other", "chrome"])
    batch = wire.batch([new[0], old[0], new[1], new[0], old[1], new[2], new[2]])
    receipt = client.post("/v1/reports", json=batch).json
    assert (receipt["accepted"], receipt["duplicates"], receipt["rejected"]) == (3, 4, 0)
    assert client.counts("browser")["cohorts"] == wire.expected("browser", old + new)["cohorts"]


def test_concurrent_overlapping_uploads_lose_and_double_nothing(collector_factory, wire):
    """8 threads send 40 batches drawn from one pool of reports, overlapping heavily."""
    collector = collector_factory(threads=8)
    pool = wire.reports("homepage", [f"site{i}.example" for i in range(600)])
    rng = random.Random(7)
    batches = [wire.batch(rng.sample(pool, 60)) for _ in range(40)]
    covered = {report["id"] for batch in batches for report in batch["reports"]}
    receipts: list[dict] = []
    lock = threading.Lock()

    def upload(mine: list[dict]) -> None:
        with requests.Session() as session:
            for batch in mine:
                response = session.post(collector.url + "/v1/reports", json=batch, timeout=60)
                assert response.status_code == 200, response.text
                with lock:
                    receipts.append(response.json())

    threads = [threading.Thread(target=upload, args=(batches[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(receipts) == 40
    assert sum(r["accepted"] for r in receipts) == len(covered)
    assert sum(r["accepted"] + r["duplicates"] for r in receipts) == 40 * 60
    stored = [report for report in pool if report["id"] in covered]
    assert collector.counts("homepage")["cohorts"] == wire.expected("homepage", stored)["cohorts"]
