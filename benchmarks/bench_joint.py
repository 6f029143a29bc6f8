"""Joint metrics: decoding a large joint table, and the SDK's encoding of a joint report.

Prints, on one core:

* the time and peak memory of decoding 10^7 joint reports of a 1,000 x 10 table (the
  cells' statistic sampled with the cell oracle's exact sampler and written as a counts
  document first; the decode runs in a child process that reads the document, as
  ``veil decode`` reads one from a collector, so its peak memory is its own);
* joint reports encoded per second by the SDK (``JointEncoder.encode`` of a dict, the
  production CSPRNG), best of ``--repeat`` runs, for a 10 x 10 table at epsilon 1 / 2 / 4.

::

    python benchmarks/bench_joint.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from veil.client import make_encoder
from veil.shared.kinds import JointParams
from veil.shared.registry import Metric
from veil.simulations.association_experiment import joint_document

DECODE = """
import json, sys, time
from veil.server.analysis.decoders import decode_counts
document = json.load(open(sys.argv[1]))
started = time.perf_counter()
result = decode_counts(document)
print(time.perf_counter() - started, len(result.rows), result.summary["independence"]["method"])
"""


def decode_large(reports: int, rows: int, columns: int) -> None:
    params = JointParams(of=("page", "country"),
                         domains=(tuple(f"p{i}" for i in range(rows)),
                                  tuple(f"c{i}" for i in range(columns))), epsilon=4.0)
    rng = np.random.default_rng(1)
    table = np.outer(np.arange(1, rows + 1) ** -1.1, rng.dirichlet(np.ones(columns)))
    counts = rng.multinomial(reports, (table / table.sum()).reshape(-1))
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "counts.json"
        path.write_text(json.dumps(joint_document(params, counts, rng)))
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", DECODE, str(path)], capture_output=True,
                             text=True, check=True)
        wall = time.perf_counter() - started
    decode_seconds, cells, method = run.stdout.split(maxsplit=2)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"decode {reports:,} joint reports, {rows} x {columns} table ({params.encoding}, "
          f"{params.responses:,} counters): {float(decode_seconds):.2f} s decoding, "
          f"{wall:.2f} s with Python's start and reading the document; peak memory "
          f"{peak:.0f} MB; {cells} cells; test: {method.strip()}")


def encode_rate(epsilon: float, repeat: int, count: int = 100_000) -> None:
    params = JointParams(of=("browser", "country"),
                         domains=(tuple(f"b{i}" for i in range(10)),
                                  tuple(f"c{i}" for i in range(10))), epsilon=epsilon)
    encoder = make_encoder(Metric("joint", params), bytes(32))
    values = [{"browser": f"b{i % 10}", "country": f"c{i // 10 % 10}"} for i in range(1000)]
    for value in values:  # the memoized permanent responses, as a running installation has
        encoder.encode(value)
    best = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        for i in range(count):
            encoder.encode(values[i % 1000])
        best = max(best, count / (time.perf_counter() - started))
    print(f"SDK encode, joint 10 x 10 at epsilon {epsilon:g} ({params.encoding}): "
          f"{best:,.0f} reports/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reports", type=int, default=10_000_000)
    args = parser.parse_args()
    with open("/proc/loadavg") as handle:
        print(f"load average: {handle.read().split()[:3]}")
    decode_large(args.reports, 1000, 10)
    for epsilon in (1.0, 2.0, 4.0):
        encode_rate(epsilon, args.repeat)


if __name__ == "__main__":
    main()
