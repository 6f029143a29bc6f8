"""``veil simulate``: how fast simulated reports are encoded, aggregated and decoded.

Two encoding paths are measured for string reports:

* ``matrix``: every report is materialized (Bloom bits, PRR, IRR as packed
  ``uint64`` words), in chunks of one million, then aggregated into the
  collector's per-cohort counts;
* ``fast``: the per-cohort counts are drawn directly (exact; see
  :mod:`veil.server.analysis.synthetic`).

Then the counts are decoded with the analysis' string decoder.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from veil.server.analysis.candidate_map import bloom_index_array, indices_to_map
from veil.server.analysis.synthetic import string_counts_from_values
from veil.shared.kinds import StringParams
from veil.simulations.encoding import encode_strings, pack_indices
from veil.simulations.populations import Population
from veil.simulations.report import progress

MATRIX_CHUNK = 1_000_000


@dataclasses.dataclass
class SimulationTimings:
    """Seconds spent in each stage and the resulting rates."""

    reports: int
    hashing: float = 0.0
    fast: float | None = None
    encode: float | None = None
    aggregate: float | None = None
    decode: float | None = None
    detected: int | None = None
    candidates: int = 0

    def lines(self) -> list[str]:
        """Human-readable figures."""
        out = [f"hashing {self.hashing:.2f} s (each value once per cohort)"]
        if self.fast is not None:
            out.append(
                f"fast path (per-cohort counts drawn directly): {self.fast:.2f} s, "
                f"{self.reports / self.fast:,.0f} reports/s"
            )
        if self.encode is not None and self.aggregate is not None:
            out.append(
                f"report matrix: encode {self.encode:.2f} s ({self.reports / self.encode:,.0f} "
                f"reports/s), aggregate {self.aggregate:.2f} s "
                f"({self.reports / self.aggregate:,.0f} reports/s), total "
                f"{self.encode + self.aggregate:.2f} s"
            )
        if self.decode is not None:
            out.append(
                f"decode {self.candidates} candidates: {self.decode:.2f} s, {self.detected} detected"
            )
        return out


def run_simulation(
    params: StringParams,
    population: Population,
    reports: int,
    rng: np.random.Generator,
    path: str = "both",
    candidates: int = 1000,
) -> SimulationTimings:
    """Simulate ``reports`` one-per-client string reports and time every stage."""
    timings = SimulationTimings(reports=reports)
    start = time.perf_counter()
    index = bloom_index_array(params, population.values, progress=False)
    table = pack_indices(index, params.k)
    true_map = indices_to_map(index, params.k, params.m)
    timings.hashing = time.perf_counter() - start

    counts: tuple[np.ndarray, np.ndarray] | None = None
    if path in ("fast", "both"):
        start = time.perf_counter()
        hist = population.cohort_histogram(reports, params.m, rng)
        counts = string_counts_from_values(params, true_map, hist, rng)
        timings.fast = time.perf_counter() - start
    if path in ("matrix", "both"):
        encode = aggregate = 0.0
        totals = np.zeros(params.m, np.int64)
        ones = np.zeros((params.m, params.k), np.int64)
        chunks = range(0, reports, MATRIX_CHUNK)
        for begin in progress(chunks, "encoding", total=len(chunks)):
            size = min(MATRIX_CHUNK, reports - begin)
            start = time.perf_counter()
            values = population.sample(size, rng)
            cohorts = rng.integers(0, params.m, size)
            encoded = encode_strings(params, table, values, cohorts, rng)
            middle = time.perf_counter()
            chunk_reports, chunk_ones = encoded.counts(params.m)
            totals += chunk_reports
            ones += chunk_ones
            aggregate += time.perf_counter() - middle
            encode += middle - start
        timings.encode, timings.aggregate = encode, aggregate
        counts = (totals, ones)
    if candidates > 0 and counts is not None:
        from veil.server.analysis import StringDecoder

        names = list(population.values[:candidates])
        timings.candidates = len(names)
        start = time.perf_counter()
        decoder = StringDecoder(params).fit(counts[0], counts[1], names)
        timings.decode = time.perf_counter() - start
        timings.detected = len(decoder.result_.rows)
    return timings


def describe(params: StringParams, population: Population, reports: int) -> dict[str, Any]:
    """The simulated configuration, for printing."""
    return {
        "reports": reports, "values": len(population), "k": params.k, "h": params.h,
        "m": params.m, "p": params.p, "q": params.q, "f": params.f,
    }
