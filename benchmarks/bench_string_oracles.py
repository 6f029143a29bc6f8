"""String oracle benchmarks: SDK encoding, decoding 10^4 candidates, and ingestion.

1. SDK encoding on one core: reports per CPU second of each string oracle's encoder at
   its defaults (epsilon 2), for a new value each report (the permanent response derived
   every time) and for one repeated value (memoized); wall-time rates beside them.
2. Decoding: ``--candidates`` candidates (default 10,000) from ``--reports`` reports
   (default 10^6, Zipf(1.1) over the candidates) per oracle, the decoder's wall time.
3. Ingestion: validated batches of 1,000 reports stored through the SQLite storage layer
   (``Storage.insert``: ids, raw reports and aggregates in one fsynced transaction), for
   Bloom RAPPOR (k = 128, h = 2, m = 64), FLH and HCMS, each batch from 200 installations
   or from one (an SDK's upload); HTTP adds the same to each.

Run it alone on the machine (it measures the machine)::

    python benchmarks/bench_string_oracles.py [--reports 1000000] [--candidates 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from veil.client.encoders import make_encoder
from veil.server.analysis.string_oracles import StringOracleDecoder, candidate_keys
from veil.server.storage import open_storage
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report, validate_batch
from veil.simulations.string_oracles import report_counts

REGISTRY = Registry.from_toml("""
version = 1
[metrics.rappor]
kind = "string"
[metrics.flh]
kind = "string"
oracle = "flh"
epsilon = 2.0
[metrics.hcms]
kind = "string"
oracle = "hcms"
epsilon = 2.0
""")


def bench_encoding(seconds: float = 2.0) -> None:
    """Reports per second of this process's CPU time (one core, whatever else runs on the
    machine) and of wall time (which a loaded machine halves)."""
    for name in REGISTRY:
        encoder = make_encoder(REGISTRY[name], os.urandom(32), 7)
        for label, values in (("new value each report", (f"v{i}" for i in range(10**9))),
                              ("one repeated value", iter(lambda: "example.com", None))):
            count, started, cpu = 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - started < seconds:
                for _ in range(1000):
                    encoder.encode(next(values))
                count += 1000
            rate = count / (time.process_time() - cpu)
            wall = count / (time.perf_counter() - started)
            print(f"encode {name:7} {label:22} {rate:12,.0f} reports/s of CPU ({wall:,.0f} "
                  "of wall time)")


def bench_decode(reports: int, candidates: int) -> None:
    rng = np.random.default_rng(1)
    names = [f"https://site{i}.example/page" for i in range(candidates)]
    weights = np.arange(1, candidates + 1, dtype=float) ** -1.1
    counts = rng.multinomial(reports, weights / weights.sum())
    keys = candidate_keys(names)
    for name in ("flh", "hcms"):
        params = REGISTRY[name].params
        table = report_counts(params, keys, counts, rng)
        started = time.perf_counter()
        decoder = StringOracleDecoder(params).fit(table, names)
        print(f"decode {name:5} {candidates:,} candidates from {reports:,} reports: "
              f"{time.perf_counter() - started:.2f} s ({decoder.solve_iterations_} solve "
              f"iterations, {decoder.summary_['detected']} detected, report "
              f"{params.report_bits} bits)")


def bench_ingest(batches: int) -> None:
    """Validated batches stored through the SQLite storage layer, each of 1,000 reports
    either from 200 installations (as a relay would forward them: a batch touches one
    aggregate row per cohort present) or from one installation (as the SDK uploads: one
    cohort a batch), every metric in turn and each shape twice (rates vary run to run)."""
    rnd = random.Random(1)
    bodies = {}
    for name in REGISTRY:
        metric = REGISTRY[name]
        encoders = [make_encoder(metric, rnd.randbytes(32), rnd.getrandbits(32),
                                 random_bytes=rnd.randbytes) for _ in range(batches * 200)]
        for installations in (200, 1):
            made = []
            for b in range(batches):
                reports = []
                for i in range(1000):
                    encoder = encoders[b * installations + i % installations]
                    reports.append(make_report(f"{rnd.getrandbits(128):032x}", name,
                                               encoder.cohort,
                                               encoder.encode(f"v{rnd.randrange(1000)}"),
                                               metric.params.fingerprint))
                made.append(validate_batch(make_batch(f"{b:032x}", reports), REGISTRY).reports)
            bodies[name, installations] = made
    for installations in (200, 1, 200, 1):
        for name in REGISTRY:
            with tempfile.TemporaryDirectory() as workdir:
                storage = open_storage(str(Path(workdir) / "veil.db"), REGISTRY, create=True)
                started = time.perf_counter()
                for reports in bodies[name, installations]:
                    storage.insert(reports)
                elapsed = time.perf_counter() - started
                storage.close()
            print(f"ingest {name:7} {batches * 1000 / elapsed:12,.0f} reports/s ({batches} "
                  f"batches of 1,000 from {installations} installation(s) each, SQLite)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--candidates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    print("load average:", Path("/proc/loadavg").read_text().strip())
    bench_encoding()
    bench_decode(args.reports, args.candidates)
    bench_ingest(args.batches)
    print("load average:", Path("/proc/loadavg").read_text().strip())


if __name__ == "__main__":
    main()
