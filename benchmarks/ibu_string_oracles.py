"""IBU on FLH against the decoder's own answers, in the setting of ``veil experiment strings``.

N installations, one report each at epsilon (``report_epsilon = epsilon``) over 1,000
strings under Zipf(1.1), drawn with the simulation encoders' law. Each collection is
decoded by FLH's decoder (its unbiased shares, projected onto the simplex, and its table
of detected strings, the others 0) and by IBU run to convergence over all 1,000 strings:
an FLH report lands in exactly one (function, bucket) cell, so the counts are one
multinomial whose law is affine in the shares (``veil.server.analysis.ibu``). Prints the
total variation of each from the population's shares (docs/strings.md quotes them).

    python benchmarks/ibu_string_oracles.py --epsilons 0.5 1 2 --seeds 1 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.ibu import AffineChannel, ibu, simplex_start
from veil.server.analysis.joint_tests import project_to_simplex
from veil.server.analysis.string_oracles import (
    StringOracleDecoder,
    candidate_buckets,
    candidate_keys,
)
from veil.shared.kinds import FlhParams
from veil.simulations.populations import total_variation
from veil.simulations.string_oracles import report_counts
from veil.simulations.strings_experiment import CANDIDATES, zipf_shares


def flh_channel(params: FlhParams, buckets: np.ndarray) -> AffineChannel:
    """FLH's law over its (function, bucket) cells: cell ``(j, b)`` has probability
    ``(P0 + (P1 - P0) [h_j(x) = b]) / F`` for a report of value ``x``."""
    functions, width = params.hash_functions, params.buckets
    p1, p0 = params.bucket_probs
    rows = (np.arange(functions)[None, :] * width + buckets).reshape(-1)
    columns = np.repeat(np.arange(buckets.shape[0]), functions)
    design = sp.csc_matrix((np.ones(rows.size), (rows, columns)),
                           shape=(functions * width, buckets.shape[0]))
    return AffineChannel(design, p0 / functions, p1 / functions,
                         np.zeros(functions * width), multinomial=True)


def one(epsilon: float, reports: int, seed: int) -> str:
    """One collection's line: the total variation of each estimate."""
    names = [f"https://site{i}.example/page" for i in range(CANDIDATES)]
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(reports, zipf_shares(CANDIDATES))
    truth = counts / reports
    params = FlhParams(epsilon=epsilon, report_epsilon=epsilon)
    keys = candidate_keys(names)
    table = report_counts(params, keys, counts, rng)
    decoder = StringOracleDecoder(params).fit(table, names)
    shares = decoder.proportions_
    channel = flh_channel(params, candidate_buckets(params, keys).astype(np.int64))
    started = time.perf_counter()
    fit = ibu(channel, table.reshape(-1), start=simplex_start(shares))
    seconds = time.perf_counter() - started
    detected = np.where(decoder.detected_, shares, 0.0)
    return (f"epsilon {epsilon:g} seed {seed}: projection "
            f"{total_variation(project_to_simplex(shares), truth):.4f}, detected table "
            f"{total_variation(detected, truth):.4f}, IBU {total_variation(fit.shares, truth):.4f}"
            f" ({fit.steps} steps, converged {fit.converged}, {seconds:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    for epsilon in args.epsilons:
        for seed in args.seeds:
            print(one(epsilon, args.reports, seed), flush=True)


if __name__ == "__main__":
    main()
