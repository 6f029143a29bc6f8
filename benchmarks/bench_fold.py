"""Bulk counting on SQLite: reading counts with reports waiting past the fold mark, a fold,
and the migration from schema 5 (which copies the reports once).

1. Counts: a store holding ``--stored`` Bloom string reports (k=128, m=64) over 30 past
   days, all folded, then the time of ``storage.counts`` with 0 and with ``--waiting``
   reports of today waiting past the mark (behind a relay's batch of another metric: a
   collector between two folds), and of one fold of them.
2. Migration: the same store turned back into the schema 5 layout, then ``veil migrate``
   timed (one transaction that copies the reports to the table keyed by ``seq``).
3. Folds over many cohorts: ``--waiting`` FLH (16,384 cohorts) and HCMS (4,096) reports,
   each of a random cohort (as when every report comes from another installation), folded
   into a new day's aggregates, then as many again into the rows the first fold wrote.
4. Folds over many metrics: ``--waiting`` reports spread over ``--metrics`` category
   metrics (GRR, 8 categories) and one day, folded: median of 5 (more than 64 metrics, so
   that a batch is not counted as it is stored).

Run it alone on the machine (it measures the machine)::

    python benchmarks/bench_fold.py [--stored 1000000] [--waiting 32768] [--metrics 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the schema 5 layout of the tests

from bench_ingest import REGISTRY, prefill, random_int

from tests.server.conftest import before_the_fold_mark
from veil.server.cli import main as veil
from veil.server.storage import open_storage
from veil.shared.registry import Registry
from veil.shared.wire import Report


def timed_counts(path: Path, repeats: int) -> float:
    """Median seconds of ``storage.counts`` of the Bloom metric, all days."""
    times = []
    with open_storage(path) as storage:
        metric = storage.registry["homepage"]
        for _ in range(repeats):
            started = time.perf_counter()
            storage.counts(metric, min_reports=0)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--waiting", type=int, default=32_768)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=100)
    args = parser.parse_args()
    print("load average:", Path("/proc/loadavg").read_text().strip())
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "veil.db"
        fill = prefill(path, args.stored)  # past days: every insert is folded
        print(f"{args.stored:,} reports stored over 30 past days in {fill:.1f} s")
        folded = timed_counts(path, args.repeats)
        with open_storage(path, fold_limit=10**9) as storage:
            # a relay's batch over the 4,096 cohorts of an HCMS metric waits past the mark,
            # and the Bloom reports stored after it wait behind it
            hcms = storage.registry["homepage_hcms"].params
            spread = [random_int(hcms.cohorts) for _ in range(1000)]
            storage.insert([Report(os.urandom(16).hex(), "homepage_hcms", cohort, 0, 0)
                            for cohort in spread])
            for offset in range(0, args.waiting, 1000):
                storage.insert([Report(os.urandom(16).hex(), "homepage", i % 64,
                                       os.urandom(16).hex(), None)
                                for i in range(min(1000, args.waiting - offset))])
        waiting = timed_counts(path, args.repeats)
        print(f"storage.counts, median of {args.repeats}: {1000 * folded:.2f} ms with every "
              f"report folded, {1000 * waiting:.2f} ms with {args.waiting:,} of its reports "
              "waiting (and 1,000 of another metric)")
        with open_storage(path, fold_limit=1) as storage:
            started = time.perf_counter()
            storage.insert([Report(os.urandom(16).hex(), "homepage", 0, os.urandom(16).hex(),
                                   None)])  # its commit folds every report waiting
            print(f"one insert and the fold of {args.waiting + 1_001:,} reports: "
                  f"{time.perf_counter() - started:.2f} s")
        before_the_fold_mark(path)
        started = time.perf_counter()
        assert veil(["migrate", "--db", str(path)]) == 0
        elapsed = time.perf_counter() - started
        total = args.stored + args.waiting + 1_001
        print(f"veil migrate from schema 5, {total:,} reports: {elapsed:.1f} s "
              f"({elapsed / total * 1e6:.1f} s per million)")
        fold_figures(Path(workdir), args.waiting)
        many = [many_metrics_fold(Path(workdir) / f"many{i}.db", args.metrics, args.waiting)
                for i in range(5)]
        print(f"one insert and the fold of {args.waiting + 1:,} reports of {args.metrics} "
              f"category metrics, median of 5: {statistics.median(many):.3f} s")


def timed_folds(path: Path, metric: str, reports: int) -> list[float]:
    """Seconds of two folds of ``reports`` reports of ``metric`` from random cohorts: into a
    new day, then into the rows the first wrote."""
    params = REGISTRY[metric].params
    times = []
    with open_storage(path, REGISTRY, create=True, fold_limit=10**9) as storage:
        for _ in range(2):
            for offset in range(0, reports, 1000):
                storage.insert([Report(os.urandom(16).hex(), metric, random_int(params.cohorts),
                                       value, value)
                                for value in (random_int(params.responses)
                                              for _ in range(min(1000, reports - offset)))])
            with open_storage(path, fold_limit=1) as folding:
                started = time.perf_counter()
                folding.insert([Report(os.urandom(16).hex(), metric, 0, 0, 0)])
                times.append(time.perf_counter() - started)
    return times


def fold_figures(workdir: Path, reports: int) -> None:
    """Print :func:`timed_folds` of the FLH and the HCMS metric."""
    for metric in ("homepage_flh", "homepage_hcms"):
        params = REGISTRY[metric].params
        new, existing = timed_folds(workdir / f"{metric}.db", metric, reports)
        print(f"one insert and the fold of {reports + 1:,} {params.mechanism_name} reports over "
              f"{params.cohorts:,} cohorts: {new:.3f} s into a new day, {existing:.3f} s into "
              "its rows")


def many_metrics_fold(path: Path, metrics: int, reports: int) -> float:
    """Seconds of one fold of ``reports`` reports spread over ``metrics`` GRR metrics."""
    registry = Registry.from_toml("version = 1\n" + "".join(
        f'[metrics.c{i}]\nkind = "category"\noracle = "grr"\nepsilon = 2.0\n'
        f'categories = ["a", "b", "c", "d", "e", "f", "g", "h"]\n' for i in range(metrics)))
    with open_storage(path, registry, create=True, fold_limit=10**9) as storage:
        for offset in range(0, reports, 1000):
            storage.insert([Report(os.urandom(16).hex(), f"c{(offset + i) % metrics}", 0,
                                   value, value)
                            for i, value in enumerate(random_int(8)
                                                      for _ in range(min(1000, reports - offset)))])
    with open_storage(path, fold_limit=1) as folding:
        started = time.perf_counter()
        folding.insert([Report(os.urandom(16).hex(), "c0", 0, 0, 0)])
        return time.perf_counter() - started


if __name__ == "__main__":
    main()
