"""String discovery: decoding time and memory of the prefix search and the string decode.

Simulates ``--reports`` installations of the built-in population (100,000 URL-like
strings of 8-64 bytes under Zipf(1.1)) with the default discovery parameters at
epsilon 4, encodes every discovery report first (not timed), then times the prefix
search over all levels and the string decoder over the candidates it found, on one
core (BLAS limited to one thread), and prints the peak resident memory::

    python benchmarks/bench_discover.py --reports 10000000
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy: one core, as stated
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import platform
import resource
import sys
import time

import numpy as np

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.discovery import PrefixSearch
from veil.server.analysis.strings import StringDecoder
from veil.server.analysis.synthetic import string_counts_from_values
from veil.shared.kinds.discovery import DiscoveryParams
from veil.simulations.discovery_experiment import (
    figures_of_merit,
    simulate_levels,
    string_channel_params,
    url_zipf_population,
)


def peak_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=10_000_000, help="installations")
    parser.add_argument("--epsilon", type=float, default=4.0, help="epsilon (default 4)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the simulation")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    population = url_zipf_population(100_000, rng)
    params = DiscoveryParams(epsilon=args.epsilon)
    strings = string_channel_params(args.epsilon)
    on_discovery = int(rng.binomial(args.reports, params.share))
    per_level = rng.multinomial(on_discovery, np.full(params.levels, 1 / params.levels))
    started = time.perf_counter()
    # held compactly, so that the timed search starts with every report in memory
    levels = [(rows.astype(np.int32), buckets.astype(np.uint8))
              for rows, buckets in simulate_levels(params, population, per_level, rng)]
    cohort_values = population.cohort_histogram(args.reports - on_discovery, strings.m, rng)
    reports, ones = string_counts_from_values(
        strings, build_map(strings, list(population.values)), cohort_values, rng)
    print(f"Python {platform.python_version()} on {platform.machine()}; "
          f"{args.reports:,} installations, {on_discovery:,} on {params.levels} discovery "
          f"levels; simulated in {time.perf_counter() - started:.1f} s (not timed below); "
          f"peak {peak_mb():,.0f} MB so far")
    started = time.perf_counter()
    search = PrefixSearch(params).fit(
        (rows.astype(np.int64), buckets.astype(np.int64)) for rows, buckets in levels)
    searched = time.perf_counter() - started
    candidates = sorted(search.strings_)
    started = time.perf_counter()
    decoder = StringDecoder(strings, correction="bh").fit(reports, ones, candidates)
    decoded = time.perf_counter() - started
    found = [row["string"] for row in decoder.result_.rows]
    merit = figures_of_merit(found, population.shares)
    print(f"prefix search {searched:.1f} s ({searched / params.levels:.2f} s a level), "
          f"{len(candidates)} candidates; string decode {decoded:.1f} s; "
          f"total {searched + decoded:.1f} s; peak {peak_mb():,.0f} MB")
    print("found " + ", ".join(f"{key} {value:.3f}" if isinstance(value, float) else
                               f"{key} {value}" for key, value in merit.items())
          + f"; {len(found)} detected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
