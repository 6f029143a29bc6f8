"""The string decoder's error rates when values are missing from the candidate list.

300 values with Zipf(1.5) shares; 100 of them are listed with ``--decoys`` decoys,
the others are not. For each choice of unlisted values, ``--runs`` seeded runs of
1,000,000 reports (k=128, h=2, m=64, p=0.5, q=0.75, f=0.5), decoded under Storey's
correction and under Bonferroni's, print Storey's mean false share (with its standard
error) and the share of runs in which Bonferroni reported a decoy, both with and
without leaving out the equations that read far above the fit
(:data:`veil.server.analysis.strings.OUTLIER_RATE`)::

    python benchmarks/error_rates.py [--runs 100] [--decoys 5000]
"""

from __future__ import annotations

import argparse

import numpy as np

from veil.server.analysis import StringDecoder, build_map, simulate_string_counts
from veil.server.analysis import strings as string_decoder
from veil.shared.kinds import StringParams

PARAMS = StringParams(k=128, h=2, m=64, p=0.5, q=0.75, f=0.5)
VALUES = 300
LISTED = 100


def listings(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The listed values (indices by rank) of each case."""
    every_tenth = np.array([i for i in range(VALUES) if i % 10 != 9])
    return {
        "the 200 rarest": np.arange(LISTED),
        "every tenth by rank": every_tenth[:LISTED],
        "the most common": np.arange(1, LISTED + 1),
        "the second most common": np.array([0, *range(2, LISTED + 1)]),
        "200 of the 300 at random": rng.permutation(VALUES)[:LISTED],
    }


def error_rates(listed: np.ndarray, decoys: int, runs: int, seed: int) -> tuple[float, ...]:
    """Storey's mean false share and its standard error, Bonferroni's share of runs with
    a decoy, and the unlisted share of the reports."""
    shares = np.arange(1, VALUES + 1) ** -1.5
    shares /= shares.sum()
    values = [f"value-{i}" for i in range(VALUES)]
    candidates = [values[i] for i in listed] + [f"decoy-{i}" for i in range(decoys)]
    true_map = build_map(PARAMS, values)
    candidate_map = build_map(PARAMS, candidates)
    rng = np.random.default_rng(seed)
    false_share = np.zeros(runs)
    any_false = np.zeros(runs, dtype=bool)
    for run in range(runs):
        reports, ones = simulate_string_counts(PARAMS, true_map, shares, 1_000_000, rng)
        storey = StringDecoder(PARAMS).fit(reports, ones, candidates, candidate_map).detected_
        false_share[run] = storey[LISTED:].sum() / max(storey.sum(), 1)
        strict = StringDecoder(PARAMS, correction="bonferroni").fit(
            reports, ones, candidates, candidate_map
        )
        any_false[run] = strict.detected_[LISTED:].any()
    return (false_share.mean(), false_share.std(ddof=1) / np.sqrt(runs), any_false.mean(),
            1 - shares[listed].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--decoys", type=int, default=5000)
    args = parser.parse_args()
    rate = string_decoder.OUTLIER_RATE
    print(f"{'unlisted':26s} {'share':>6s} {'exclusion':>9s} {'Storey FDP':>16s} {'Bonferroni FWER':>15s}")
    for name, listed in listings(np.random.default_rng(5)).items():
        for exclusion in (True, False):
            string_decoder.OUTLIER_RATE = rate if exclusion else 0.0
            fdp, fdp_se, fwer, unlisted = error_rates(listed, args.decoys, args.runs, seed=5)
            print(f"{name:26s} {unlisted:6.1%} {'yes' if exclusion else 'no':>9s} "
                  f"{fdp:9.3f} ± {fdp_se:.3f} {fwer:15.0%}", flush=True)
    string_decoder.OUTLIER_RATE = rate


if __name__ == "__main__":
    main()
