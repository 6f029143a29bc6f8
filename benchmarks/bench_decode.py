"""Benchmark the string decoder: speed, peak memory and accuracy at RAPPOR's scale.

Scenario (the RAPPOR paper's parameters): k=128, h=2, m=64, p=0.5, q=0.75,
f=0.5; 1,000,000 reports of 10,000 distinct values with Zipf(1.5) shares; the
counts are drawn directly from the model (exact in distribution). Candidate
lists mix the most common true values with decoys that nobody reported:

    1,000 candidates:     500 true + 500 decoys
    10,000 candidates:  5,000 true + 5,000 decoys
    100,000 candidates: 10,000 true + 90,000 decoys

and one more population, 1,000,000 reports of 100,000 values with Zipf(1.5)
shares (about 11,700 of them reported), decoded with all 100,000 as candidates:
the largest list, with signal spread over thousands of them.

Each decode runs in a fresh process that loads the counts, hashes the
candidates (building the map is part of the timing) and decodes. Peak memory
is that process's peak resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``),
which includes the Python interpreter and the imported libraries.

Accuracy: total variation distance between the decoded shares (0 for strings
not reported) and the true shares of all 10,000 values; false positives
(decoys reported); false negatives among true candidates whose share is above
the decoder's stated detection limit (80% power), and among all true candidates.

``--selection`` instead compares ways of selecting the candidates present on
the same data (1,000 and 10,000 candidates; time of selection and refit).

Run (on a quiet machine: the figures are timings):

    python benchmarks/bench_decode.py
    python benchmarks/bench_decode.py --selection
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K, H, M = 128, 2, 64
REPORTS = 1_000_000
VALUES = 10_000
ZIPF = 1.5
SEED = 2026
SIZES = ((1_000, 500), (10_000, 5_000), (100_000, 10_000))
#: the larger population: every one of its values is a candidate
LARGE_VALUES = 100_000


def true_values(values: int = VALUES) -> list[str]:
    """The population's distinct values, most common first."""
    return [f"https://site{i}.example.org/index.html" for i in range(values)]


def true_shares(values: int = VALUES) -> np.ndarray:
    """Zipf(1.5) shares over the values."""
    weights = np.arange(1, values + 1, dtype=float) ** -ZIPF
    return weights / weights.sum()


def candidate_list(size: int, true_count: int, values: int = VALUES) -> list[str]:
    """``true_count`` most common values plus decoys, shuffled (fixed seed)."""
    decoys = [f"https://decoy{i}.example.net/home" for i in range(size - true_count)]
    candidates = true_values(values)[:true_count] + decoys
    order = np.random.default_rng(SEED + size).permutation(size)
    return [candidates[i] for i in order]


def simulate(path: Path, values: int = VALUES) -> int:
    """Draw the counts of a population of ``values`` once and save them; returns the
    expected number of distinct values reported, ``sum(1 - exp(-N s))``."""
    from veil.server.analysis import build_map, simulate_string_counts
    from veil.shared.kinds import StringParams

    params = StringParams(k=K, h=H, m=M)
    true_map = build_map(params, true_values(values))
    rng = np.random.default_rng(SEED)
    reports, ones = simulate_string_counts(params, true_map, true_shares(values), REPORTS, rng)
    np.savez(path, reports=reports, ones=ones)
    return round(float(np.sum(-np.expm1(-REPORTS * true_shares(values)))))


def decode_once(
    counts_path: Path, size: int, true_count: int, background: bool, correction: str,
    values: int = VALUES,
) -> dict:
    """One decode in this process; returns timings, memory and accuracy."""
    from veil.server.analysis import StringDecoder, build_map
    from veil.shared.kinds import StringParams

    data = np.load(counts_path)
    params = StringParams(k=K, h=H, m=M)
    candidates = candidate_list(size, true_count, values)
    started = time.perf_counter()
    candidate_map = build_map(params, candidates, progress=False)
    mapped = time.perf_counter()
    decoder = StringDecoder(params, background=background, correction=correction).fit(
        data["reports"], data["ones"], candidates, candidate_map
    )
    finished = time.perf_counter()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    shares = true_shares(values)
    index = {value: i for i, value in enumerate(true_values(values))}
    estimate = np.zeros(values)
    false_positives = 0
    for row in decoder.result_.rows:
        position = index.get(row["string"])
        if position is None:
            false_positives += 1
        else:
            estimate[position] = row["proportion"]
    decoy_mass = sum(row["proportion"] for row in decoder.result_.rows if row["string"] not in index)
    tvd = 0.5 * (np.abs(estimate - shares).sum() + decoy_mass)
    limit = decoder.summary_["min_detectable_proportion"]
    detectable = shares[:true_count] >= limit
    return {
        "values": values,
        "candidates": size,
        "background": background,
        "correction": correction,
        "map_seconds": mapped - started,
        "decode_seconds": finished - mapped,
        "total_seconds": finished - started,
        "peak_rss_mib": peak_mib,
        "detected": int(decoder.summary_["detected"]),
        "false_positives": false_positives,
        "false_negatives_detectable": int(np.count_nonzero(detectable & (estimate[:true_count] == 0))),
        "detectable": int(np.count_nonzero(detectable)),
        "false_negatives_all": int(np.count_nonzero(estimate[:true_count] == 0)),
        "true_candidates": true_count,
        "tvd": float(tvd),
        "tvd_detected_only": float(0.5 * np.abs(estimate - shares)[estimate > 0].sum()),
        "missing_share": decoder.summary_["missing_proportion"],
        "true_missing_share": float(shares[estimate == 0].sum()),
        "min_detectable": limit,
    }


def compare_selection() -> None:
    """Selection methods on the benchmark data: Lasso, NNLS over all, marginal scores."""
    from scipy import optimize, stats

    from veil.server.analysis import build_map, simulate_string_counts
    from veil.server.analysis.selection import WhitenedSystem, lasso_select, refit
    from veil.server.analysis.strings import bit_estimates
    from veil.shared.kinds import StringParams

    params = StringParams(k=K, h=H, m=M)
    reports, ones = simulate_string_counts(
        params, build_map(params, true_values()), true_shares(), REPORTS,
        np.random.default_rng(SEED),
    )
    shares = true_shares()
    index = {value: i for i, value in enumerate(true_values())}
    share, variance = bit_estimates(params, reports, ones)
    print(f"{'candidates':>10} {'selection':<28} {'selected':>8} {'found':>5} {'FP':>3} "
          f"{'TVD':>6} {'seconds':>7}")
    for size, true_count in SIZES[:2]:
        candidates = candidate_list(size, true_count)
        with_background = WhitenedSystem.build(share, variance, build_map(params, candidates), True)
        design, y, weight, norms = (with_background.design, with_background.y,
                                    with_background.weight, with_background.norms)
        z = stats.norm.isf(0.05 / size)
        methods = ["lasso + background", "nnls over all + background",
                   "marginal score + background", "lasso, no background"]
        for method in methods:
            if method.startswith("nnls") and size > 1_000:
                continue  # a dense (m*k) x candidates matrix: 650 MB at 10,000
            system = (dataclasses.replace(with_background, background=None)
                      if "no background" in method else with_background)
            started = time.perf_counter()
            if method.startswith("lasso"):
                selected = lasso_select(system, z)
            elif method.startswith("nnls"):
                dense = np.column_stack([design.toarray(), weight])
                solution, _ = optimize.nnls(dense, y, maxiter=20_000)
                selected = np.flatnonzero(solution[:-1] > 0)
            else:
                residual = y - weight * (weight @ y) / (weight @ weight)
                selected = np.flatnonzero(design.T @ residual > z * np.maximum(norms, 1e-300))
            solution = refit(system, selected, 0.05, "bonferroni", size)
            columns, theta = solution.columns, solution.theta
            seconds = time.perf_counter() - started
            estimate = np.zeros(VALUES)
            decoy_mass = 0.0
            false_positives = 0
            for column, value in zip(columns, theta, strict=True):
                position = index.get(candidates[column])
                if position is None:
                    false_positives += 1
                    decoy_mass += value
                else:
                    estimate[position] = value
            tvd = 0.5 * (np.abs(estimate - shares).sum() + decoy_mass)
            print(f"{size:>10,} {method:<28} {selected.size:>8} {columns.size:>5} "
                  f"{false_positives:>3} {tvd:>6.4f} {seconds:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS,
                        metavar=("COUNTS", "SIZE", "TRUE", "BACKGROUND", "CORRECTION", "VALUES"))
    parser.add_argument("--sizes", type=int, nargs="*", help="only these candidate list sizes")
    parser.add_argument("--selection", action="store_true",
                        help="compare selection methods instead")
    parser.add_argument("--simulate", nargs=2, help=argparse.SUPPRESS, metavar=("OUT", "VALUES"))
    args = parser.parse_args()
    if args.simulate:
        print(simulate(Path(args.simulate[0]), int(args.simulate[1])))
        return
    if args.selection:
        compare_selection()
        return
    if args.one:
        path, size, true_count, background, correction, values = args.one
        print(json.dumps(decode_once(
            Path(path), int(size), int(true_count), background == "1", correction, int(values)
        )))
        return

    # (population, candidates, true candidates, background column, correction)
    runs = [(VALUES, size, true_count, True, "storey") for size, true_count in SIZES]
    runs += [
        (VALUES, 10_000, 5_000, False, "storey"),
        (VALUES, 100_000, 10_000, True, "bonferroni"),
        (LARGE_VALUES, LARGE_VALUES, LARGE_VALUES, True, "storey"),
    ]
    if args.sizes:
        runs = [run for run in runs if run[1] in args.sizes]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for values in sorted({run[0] for run in runs}):
            counts_path = Path(tmp) / f"counts-{values}.npz"
            started = time.perf_counter()
            # in a process of its own: Linux carries a parent's peak RSS into the children
            # it forks, so simulating here would inflate every decode's figure
            reported = int(subprocess.run(
                [sys.executable, __file__, "--simulate", str(counts_path), str(values)],
                check=True, capture_output=True, text=True,
            ).stdout)
            print(f"simulated {REPORTS:,} reports of {values:,} values (Zipf {ZIPF}, about "
                  f"{reported:,} reported) in {time.perf_counter() - started:.1f} s; "
                  f"k={K} h={H} m={M} p=0.5 q=0.75 f=0.5")
            for _, size, true_count, background, correction in (r for r in runs if r[0] == values):
                out = subprocess.run(
                    [sys.executable, __file__, "--one", str(counts_path), str(size),
                     str(true_count), "1" if background else "0", correction, str(values)],
                    check=True, capture_output=True, text=True,
                )
                results.append(json.loads(out.stdout))
    header = (f"{'values':>7} {'candidates':>10} {'test':>6} {'bg':>3} {'map s':>6} {'decode s':>8} "
              f"{'total s':>7} "
              f"{'peak MiB':>8} {'found':>5} {'FP':>3} {'FN*':>7} {'FN all':>11} {'TVD':>6} "
              f"{'missing':>13} {'limit':>6}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['values']:>7,} {r['candidates']:>10,} {TESTS[r['correction']]:>6} "
            f"{'yes' if r['background'] else 'no':>3} "
            f"{r['map_seconds']:>6.2f} {r['decode_seconds']:>8.2f} {r['total_seconds']:>7.2f} "
            f"{r['peak_rss_mib']:>8.0f} {r['detected']:>5} {r['false_positives']:>3} "
            f"{r['false_negatives_detectable']:>3}/{r['detectable']:<3} "
            f"{r['false_negatives_all']:>5}/{r['true_candidates']:<5} {r['tvd']:>6.4f} "
            f"{_share(r['missing_share']):>6}/{r['true_missing_share']:.3f} {r['min_detectable']:>6.4f}"
        )
    print("test = multiple-testing correction at 0.05 (Storey's adaptive BH, Bonferroni); "
          "bg = background column for values missing from the list.")
    print("FN* = missed true candidates with share above the stated detection limit (80% power); "
          "missing = estimated/true share of reports not attributed to detected strings; "
          "limit = smallest detectable share.")


TESTS = {"storey": "Storey", "bh": "BH", "bonferroni": "Bonf", "none": "none"}


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
