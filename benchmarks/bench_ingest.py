"""Collector benchmarks: HTTP ingestion into ``veil serve`` and reading counts.

1. Ingestion: a ``veil serve`` process on 127.0.0.1 with a string metric (k=128,
   h=2, m=64), or with ``--metric`` a string metric of another oracle (FLH, HCMS at
   epsilon 2) or a category metric over 1,024 categories by oracle; the reports of
   a batch come from ``--installations`` installations (a cohort each; by default
   every report from its own, as a relay forwards them), or one (as the SDK
   uploads); request bodies of ``--batch`` reports each are built and
   serialized before timing; ``--uploaders`` threads post them over keep-alive
   connections, optionally into a database already holding ``--prefill``
   reports. Prints sustained reports/s over the whole run and over its second
   half (the database by then holds most of the run), and per-batch latency
   percentiles.
2. Counts: a database holding ``--stored`` reports of one metric spread over 30
   days (filled directly through the storage layer), then the time to build the
   counts document, in-process and over HTTP.

Run it alone on the machine (it measures the machine)::

    python benchmarks/bench_ingest.py [--batches 1000] [--workers 2] [--threads 4] [--uploaders 8]
    python benchmarks/bench_ingest.py --metric category_olh --skip-counts   # d = 1024
    python benchmarks/bench_ingest.py --metric homepage_hcms --installations 200 --skip-counts
    python benchmarks/bench_ingest.py --db postgresql://postgres@127.0.0.1/veil_bench
        # PostgreSQL: an empty database, emptied again (its veil_ tables dropped) before each part
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from veil.server.http import fetch_counts
from veil.server.storage import open_storage
from veil.shared.registry import Registry
from veil.shared.wire import Report, make_batch, make_report
from veil.simulations.demo import READ_TOKEN, Collector

CATEGORIES = ", ".join(f'"c{i}"' for i in range(1024))
REGISTRY = Registry.from_toml("""
version = 1
[metrics.homepage]
kind = "string"
min_reports = 1
k = 128
h = 2
m = 64
""" + "".join(f"""
[metrics.homepage_{oracle}]
kind = "string"
oracle = "{oracle}"
epsilon = 2.0
min_reports = 1
""" for oracle in ("flh", "hcms")) + "".join(f"""
[metrics.category_{oracle}]
kind = "category"
oracle = "{oracle}"
epsilon = 2.0
min_reports = 1
categories = [{CATEGORIES}]
""" for oracle in ("grr", "oue", "olh", "hadamard")))
K_BYTES = 16


def random_int(below: int) -> int:
    """A uniformly random integer in ``[0, below)`` from the OS (the bench needs no seed)."""
    return int.from_bytes(os.urandom(8), "big") % below


def random_payload(params: Any) -> Any:
    """A uniformly random payload of the metric (what IRR output looks like)."""
    if params.statistic == "bits":
        return os.urandom((params.k if params.kind == "string" else params.d) // 8).hex()
    return random_int(params.responses)


def random_reports(metric: str, n: int, installations: int | None) -> list[dict]:
    """``n`` wire reports of ``metric`` with random payloads, from ``installations``
    installations of random cohorts in turn (``None``: a random cohort per report)."""
    params = REGISTRY[metric].params
    cohorts = getattr(params, "cohorts", 0)
    chosen = [random_int(cohorts) for _ in range(installations or 0)] if cohorts else []
    out = []
    for i in range(n):
        cohort = (chosen[i % len(chosen)] if chosen else random_int(cohorts)) if cohorts else None
        out.append(make_report(os.urandom(16).hex(), metric, cohort, random_payload(params),
                               params.fingerprint))
    return out


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def empty(db: str | None) -> None:
    """Drop Veil's tables from the PostgreSQL database ``db`` (``None``: nothing to do)."""
    if db is None:
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS veil_reports, veil_aggregates, veil_meta CASCADE")


def prefill(url: str | Path, stored: int, days: int = 30) -> float:
    """Store ``stored`` random reports over ``days`` days through the storage layer; seconds."""
    begin = time.perf_counter()
    with open_storage(url, REGISTRY, create=True) as storage:
        first = dt.date(2026, 10, 1)
        chunk = 20_000
        for offset in range(0, stored, chunk):
            day = first + dt.timedelta(days=(offset * days) // max(stored, 1))
            reports = [Report(os.urandom(16).hex(), "homepage", i % 64,
                              os.urandom(K_BYTES).hex(), None)
                       for i in range(min(chunk, stored - offset))]
            storage.insert(reports, day)
    return time.perf_counter() - begin


def bench_ingest(metric: str, batches: int, batch_size: int, threads: int, workers: int,
                 uploaders: int, stored_before: int, db: str | None,
                 installations: int | None) -> None:
    """Sustained ingestion of ``metric`` through HTTP; every batch must be fully accepted."""

    def body() -> bytes:
        batch = make_batch(os.urandom(16).hex(),
                           random_reports(metric, batch_size, installations))
        return json.dumps(batch).encode()

    bodies = [body() for _ in range(batches)]
    warmup = [body() for _ in range(uploaders * 2)]
    empty(db)
    with tempfile.TemporaryDirectory() as tmp:
        if stored_before:
            prefill(db or Path(tmp) / "veil.db", stored_before)
        collector = Collector(Path(tmp), REGISTRY, "--threads", str(threads),
                              "--workers", str(workers), db=db)
        url = collector.url
        try:
            latencies: list[float] = []
            finished: list[float] = []
            lock = threading.Lock()

            def upload(queue: list[bytes]) -> None:
                session = requests.Session()
                headers = {"Content-Type": "application/json"}
                while True:
                    with lock:
                        if not queue:
                            return
                        body = queue.pop()
                    begin = time.perf_counter()
                    response = session.post(url + "/v1/reports", data=body, headers=headers,
                                            timeout=60)
                    elapsed = time.perf_counter() - begin
                    receipt = response.json()
                    if response.status_code != 200 or receipt["accepted"] != batch_size:
                        raise SystemExit(f"upload failed: {response.status_code} {receipt}")
                    with lock:
                        latencies.append(elapsed)
                        finished.append(begin + elapsed)

            def run(queue: list[bytes]) -> float:
                workers = [threading.Thread(target=upload, args=(queue,)) for _ in range(uploaders)]
                begin = time.perf_counter()
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                return time.perf_counter() - begin

            run(list(warmup))
            latencies.clear()
            finished.clear()
            wall = run(list(bodies))
            stored = fetch_counts(url, READ_TOKEN, metric)
        finally:
            collector.stop()
    total = batches * batch_size
    before = stored_before if metric == "homepage" else 0  # prefill() stores homepage reports
    assert stored["reports"] == before + total + len(warmup) * batch_size, stored["reports"]
    lat = sorted(latencies)
    print(f"ingest: {total:,} reports of {metric} "
          f"({REGISTRY[metric].params.mechanism_name}) in {batches} batches of {batch_size} "
          f"from {installations or batch_size} installation(s) each into "
          f"{'PostgreSQL' if db else 'SQLite'} already holding {stored_before:,}, server workers={workers} x "
          f"threads={threads}, uploader threads={uploaders}")
    print(f"  sustained: {total / wall:,.0f} reports/s ({batches / wall:.1f} batches/s, "
          f"wall {wall:.2f} s)")
    done = sorted(finished)
    half = len(done) // 2
    if half:
        second = (len(done) - half) * batch_size / (done[-1] - done[half - 1])
        print(f"  second half of the run: {second:,.0f} reports/s")
    print(f"  batch latency ms: p50 {1000 * percentile(lat, 0.5):.1f}  "
          f"p90 {1000 * percentile(lat, 0.9):.1f}  p99 {1000 * percentile(lat, 0.99):.1f}  "
          f"max {1000 * lat[-1]:.1f}")


def bench_counts(stored: int, repeats: int, db: str | None) -> None:
    """Counts for a metric with ``stored`` reports over 30 days, in-process and over HTTP."""
    empty(db)
    with tempfile.TemporaryDirectory() as tmp:
        path = db or Path(tmp) / "veil.db"
        fill = prefill(path, stored)
        with open_storage(path) as storage:
            metric = storage.registry["homepage"]
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                document = storage.counts(metric)
                times.append(time.perf_counter() - start)
            assert document["reports"] == stored
            ranged = []
            for _ in range(repeats):
                start = time.perf_counter()
                storage.counts(metric, "2026-10-05", "2026-10-20")
                ranged.append(time.perf_counter() - start)
        collector = Collector(Path(tmp), REGISTRY, db=db)  # serves the database at path
        try:
            url = collector.url
            session = requests.Session()
            headers = {"Authorization": f"Bearer {READ_TOKEN}"}
            session.get(url + "/v1/metrics/homepage/counts", headers=headers, timeout=60)
            http = []
            for _ in range(repeats):
                start = time.perf_counter()
                response = session.get(url + "/v1/metrics/homepage/counts", headers=headers,
                                       timeout=60)
                http.append(time.perf_counter() - start)
                assert response.json()["reports"] == stored
        finally:
            collector.stop()
    print(f"counts: {stored:,} stored reports in {'PostgreSQL' if db else 'SQLite'} "
          "(30 days x 64 cohorts, k=128); "
          f"filled through the storage layer in {fill:.1f} s ({stored / fill:,.0f} reports/s)")
    print(f"  storage.counts, all days: median {1000 * statistics.median(times):.2f} ms, "
          f"max {1000 * max(times):.2f} ms ({repeats} runs)")
    print(f"  storage.counts, 16 days:  median {1000 * statistics.median(ranged):.2f} ms")
    print(f"  GET /v1/metrics/homepage/counts over HTTP: median "
          f"{1000 * statistics.median(http):.2f} ms, max {1000 * max(http):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000, help="reports per batch")
    parser.add_argument("--threads", type=int, default=4, help="veil serve threads per worker")
    parser.add_argument("--workers", type=int, default=2, help="veil serve worker processes")
    parser.add_argument("--uploaders", type=int, default=8, help="concurrent uploader threads")
    parser.add_argument("--prefill", type=int, default=0,
                        help="reports stored before the ingestion run (a database in use)")
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-counts", action="store_true")
    parser.add_argument("--db", help="a PostgreSQL URL of an empty database to use instead of "
                        "a temporary SQLite file (its veil_ tables are dropped first)")
    parser.add_argument("--metric", default="homepage", choices=list(REGISTRY),
                        help="metric to ingest: strings (Bloom k=128, FLH, HCMS) or categories "
                             "(d=1024) by oracle")
    parser.add_argument("--installations", type=int,
                        help="installations whose reports make up a batch (default: one per "
                             "report)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    bench_ingest(args.metric, args.batches, args.batch, args.threads, args.workers,
                 args.uploaders, args.prefill, args.db, args.installations)
    if not args.skip_counts:
        bench_counts(args.stored, args.repeats, args.db)


if __name__ == "__main__":
    main()
