"""Benchmark aggregation from the Parquet archive: per bucket on one core, and on Dask.

Scenario: N string reports (k=128, m=64 cohorts; random ids, cohorts and bits: the
statistic's cost does not depend on the values) over D days, written as a Veil archive
of B buckets per day directly with pyarrow (the layout ``veil archive`` writes: one
``part-main.parquet`` per (metric, day, bucket), row groups of 1,048,576 reports,
zstd), plus a replayed copy of ``--replayed`` of the reports of each bucket in a second
file of the bucket (a second source), so that deduplication has work to do.

Figures, each the best of ``--repeat`` runs:

(a) the statistic alone: ``BitCounts.accumulate_arrays`` on the arrays of one bucket, in
    this process (one core), in reports/s;
(b) deduplication: ``first_occurrences`` on the ids of one bucket with its replays, and
    on the ids without any (the common case), in ms and reports/s; then the whole
    per-bucket function (``aggregate_bucket``: read the files, dedup, statistic) on one core;
(c) end to end: ``veil.server.archive.aggregate`` of the whole archive into a new SQLite
    store on a local cluster of 1, then 2 worker processes (1 thread each; the cluster
    is started before the clock starts), in archived reports/s, and the speed-up.

Run (on a quiet machine: the figures are timings):

    python benchmarks/bench_aggregate.py                      # about a minute on 2 cores
    python benchmarks/bench_aggregate.py --reports 2000000 --days 2 --buckets 4
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

K, COHORTS = 128, 64
REPORTS = 16_000_000
DAYS = 1
BUCKETS = 16
REPLAYED = 0.01
SEED = 2026
METRIC = "homepage"


def registry() -> Any:
    """One string metric at RAPPOR's scale."""
    from veil.shared.kinds import StringParams
    from veil.shared.registry import Metric, Registry

    return Registry([Metric(METRIC, StringParams(k=K, h=2, m=COHORTS), min_reports=1)])


def day_name(index: int) -> str:
    return f"2025-01-{index + 1:02d}"


def synthesize(rng: np.random.Generator, count: int, bucket: int, buckets: int,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random reports whose ids fall in ``bucket`` (first id byte modulo ``buckets``)."""
    ids = rng.integers(0, 256, size=(count, 16), dtype=np.uint8)
    ids[:, 0] = rng.integers(0, 256 // buckets, size=count, dtype=np.uint8) * buckets + bucket
    cohorts = rng.integers(0, COHORTS, size=count, dtype=np.int64)
    payloads = rng.integers(0, 256, size=(count, K // 8), dtype=np.uint8)
    return ids, cohorts, payloads


def write_archive(root: Path, reports: int, days: int, buckets: int, replayed: float) -> int:
    """Write the archive (and its manifest); returns the rows written, replays included."""
    import pyarrow.parquet as pq

    from veil.server.archive.layout import ArchiveFile, Manifest, bucket_dir, file_name, to_table
    from veil.server.archive.writer import COMPRESSION, ROW_GROUP_REPORTS
    from veil.shared.statistics import statistic_for

    reg = registry()
    statistic = statistic_for(reg[METRIC].params)
    rng = np.random.default_rng(SEED)
    per_file = reports // (days * buckets)
    manifest = Manifest(root, reg, buckets, [])
    rows = 0
    for day in range(days):
        for bucket in range(buckets):
            ids, cohorts, payloads = synthesize(rng, per_file, bucket, buckets)
            relative = bucket_dir(METRIC, day_name(day), bucket)
            (root / relative).mkdir(parents=True)
            copies = int(per_file * replayed)
            parts = [("main", slice(None))] + ([("replay", slice(0, copies))] if copies else [])
            for source, rows_slice in parts:
                table = to_table(statistic, ids[rows_slice], cohorts[rows_slice],
                                 payloads[rows_slice])
                path = f"{relative}/{file_name(source)}"
                pq.write_table(table, root / path, row_group_size=ROW_GROUP_REPORTS,
                               compression=COMPRESSION, use_dictionary=["cohort"],
                               write_statistics=["cohort"])
                manifest.files.append(ArchiveFile(path, METRIC, day_name(day), bucket, source,
                                                  table.num_rows))
                rows += table.num_rows
    manifest.save()
    return rows


def best(repeat: int, work: Callable[[], Any]) -> float:
    """The shortest of ``repeat`` timed runs of ``work``, in seconds."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def one_core(root: Path, repeat: int) -> None:
    """Figures (a) and (b), on the files of the first bucket of the first day."""
    from veil.server.archive.bucket import aggregate_bucket, first_occurrences, read_source
    from veil.server.archive.layout import Manifest, from_table
    from veil.shared.statistics import statistic_for

    manifest = Manifest.load(root)
    task = manifest.tasks()[0]
    metric = manifest.registry[METRIC]
    statistic = statistic_for(metric.params)
    tables = [read_source(path) for path in task.paths]
    arrays = [from_table(statistic, table, path) for table, path in zip(tables, task.paths,
                                                                          strict=True)]
    ids = np.concatenate([a[0] for a in arrays])
    cohorts, payloads = arrays[0][1], arrays[0][2]
    n = len(cohorts)

    seconds = best(repeat, lambda: statistic.accumulate_arrays(metric.params, cohorts, payloads))
    print(f"(a) statistic alone (accumulate_arrays, k={K}, {COHORTS} cohorts), one core: "
          f"{n:,} reports in {seconds * 1e3:.0f} ms = {n / seconds / 1e6:.1f} M reports/s")

    with_replays = best(repeat, lambda: first_occurrences(ids))
    without = best(repeat, lambda: first_occurrences(arrays[0][0]))
    print(f"(b) dedup (first_occurrences), one core: {len(ids):,} ids with "
          f"{len(ids) - n:,} replays in {with_replays * 1e3:.0f} ms "
          f"({len(ids) / with_replays / 1e6:.1f} M ids/s); {n:,} distinct ids in "
          f"{without * 1e3:.0f} ms ({n / without / 1e6:.1f} M ids/s)")
    whole = best(repeat, lambda: aggregate_bucket(metric, task.paths))
    print(f"    whole per-bucket function (read {len(task.paths)} files, dedup, statistic), "
          f"one core: {len(ids) / whole / 1e6:.1f} M reports/s")


def end_to_end(root: Path, workers: list[int], repeat: int) -> None:
    """Figure (c): ``aggregate`` on local clusters of each size in ``workers``."""
    from distributed import Client, LocalCluster

    from veil.server.archive import aggregate
    from veil.server.storage import open_storage

    rates: dict[int, float] = {}
    for count in workers:
        began = time.perf_counter()
        with LocalCluster(n_workers=count, threads_per_worker=1, processes=True,
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
            started = time.perf_counter() - began
            runs = []
            for run in range(repeat):
                with tempfile.TemporaryDirectory() as scratch, open_storage(
                        Path(scratch) / f"target-{run}.db", registry(), create=True) as target:
                    runs.append(aggregate(root, target, scheduler=client, progress=False))
            summary = min(runs, key=lambda s: s.seconds)
        rates[count] = summary.reports_per_second
        print(f"(c) aggregate, {count} worker{'s' if count > 1 else ''} (cluster started in "
              f"{started:.1f} s, not counted): {summary.rows:,} archived reports "
              f"({summary.duplicates:,} duplicates) in {summary.tasks} tasks, "
              f"{summary.seconds:.2f} s = {summary.reports_per_second / 1e6:.2f} M reports/s")
    if len(rates) > 1:
        low, high = min(rates), max(rates)
        print(f"    speed-up {high} workers / {low}: {rates[high] / rates[low]:.2f}x "
              f"(on {os.cpu_count()} cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=REPORTS,
                        help=f"distinct reports in the archive (default {REPORTS:,})")
    parser.add_argument("--days", type=int, default=DAYS, help=f"days (default {DAYS})")
    parser.add_argument("--buckets", type=int, default=BUCKETS,
                        help=f"buckets per day (default {BUCKETS})")
    parser.add_argument("--replayed", type=float, default=REPLAYED,
                        help=f"share of each bucket's reports replayed (default {REPLAYED})")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="cluster sizes for (c) (default: 1 2)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the best counts")
    parser.add_argument("--dir", type=Path, help="where to write the archive (default: a "
                                                 "temporary directory, removed after)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch) / "archive"
        began = time.perf_counter()
        rows = write_archive(root, args.reports, args.days, args.buckets, args.replayed)
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        print(f"archive: {rows:,} reports (k={K}, {COHORTS} cohorts) over {args.days} days x "
              f"{args.buckets} buckets, {size / 2**20:,.0f} MiB ({size / rows:.1f} B a report), "
              f"written in {time.perf_counter() - began:.1f} s")
        one_core(root, args.repeat)
        end_to_end(root, args.workers, args.repeat)


if __name__ == "__main__":
    main()
