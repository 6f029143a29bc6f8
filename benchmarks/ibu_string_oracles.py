"""IBU on FLH and HCMS against the decoders' unbiased answers, in the setting of
``veil experiment strings``.

N installations, one report each at epsilon (``report_epsilon = epsilon``) over 1,000
strings under Zipf(1.1), drawn with the simulation encoders' law. Each collection is
decoded once by the oracle's decoder with ``estimator="ibu"``: its unbiased table of
detected strings (the others 0), its unbiased shares of every candidate projected onto the
simplex, and IBU over the detected strings and the background (what ``veil decode
--estimator ibu`` shows; its seconds are the IBU step's alone) and, for FLH, by IBU run to convergence over
all 1,000 strings: an FLH report lands in exactly one (function, bucket) cell, so the
counts are one multinomial whose law is affine in the shares
(``veil.server.analysis.ibu``). Prints the total variation of each from the population's
shares (docs/strings.md quotes them).

    python benchmarks/ibu_string_oracles.py --epsilons 0.5 1 2 4 --seeds 1 2 [--oracle hcms]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from veil.server.analysis.ibu import ibu, simplex_start
from veil.server.analysis.joint_tests import project_to_simplex
from veil.server.analysis.string_oracle_ibu import oracle_channel
from veil.server.analysis.string_oracles import (
    StringOracleDecoder,
    candidate_buckets,
    candidate_keys,
)
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.simulations.populations import total_variation
from veil.simulations.string_oracles import report_counts
from veil.simulations.strings_experiment import CANDIDATES, zipf_shares


def detected_shares(decoder: StringOracleDecoder, names: list[str]) -> np.ndarray:
    """The shares a decoder's table shows (IBU's with ``estimator="ibu"``), 0 for the strings
    it does not list."""
    out = np.zeros(len(names))
    position = {name: index for index, name in enumerate(names)}
    for row in decoder.result_.rows:
        out[position[row["string"]]] = row["proportion"]
    return out


def one(oracle: str, epsilon: float, reports: int, seed: int) -> str:
    """One collection's line: the total variation of each estimate."""
    names = [f"https://site{i}.example/page" for i in range(CANDIDATES)]
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(reports, zipf_shares(CANDIDATES))
    truth = counts / reports
    params: StringOracleParams = (FlhParams(epsilon=epsilon, report_epsilon=epsilon)
                                  if oracle == "flh"
                                  else HcmsParams(epsilon=epsilon, report_epsilon=epsilon))
    keys = candidate_keys(names)
    table = report_counts(params, keys, counts, rng)
    started = time.perf_counter()
    decoder = StringOracleDecoder(params, estimator="ibu").fit(table, names)
    ibu_seconds = time.perf_counter() - started - decoder.summary_["elapsed_seconds"]
    table_shares = np.where(decoder.detected_, decoder.proportions_, 0.0)  # the unbiased table
    line = (f"{oracle} epsilon {epsilon:g} seed {seed}: detected table "
            f"{total_variation(table_shares, truth):.4f}, ibu "
            f"{total_variation(detected_shares(decoder, names), truth):.4f} "
            f"({int(decoder.detected_.sum())} strings, {ibu_seconds:.1f} s), projection "
            f"{total_variation(project_to_simplex(decoder.proportions_), truth):.4f}")
    if isinstance(params, FlhParams):
        # the decoder's channel over every string, without the background
        channel = dataclasses.replace(oracle_channel(params, candidate_buckets(params, keys),
                                                     float(reports)), background_rate=None)
        started = time.perf_counter()
        fit = ibu(channel, table.reshape(-1), start=simplex_start(decoder.proportions_))
        line += (f", IBU over every string {total_variation(fit.shares, truth):.4f} "
                 f"({fit.steps} steps, {time.perf_counter() - started:.1f} s)")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--oracle", choices=("flh", "hcms"), default="flh")
    args = parser.parse_args()
    for epsilon in args.epsilons:
        for seed in args.seeds:
            print(one(args.oracle, epsilon, args.reports, seed), flush=True)


if __name__ == "__main__":
    main()
