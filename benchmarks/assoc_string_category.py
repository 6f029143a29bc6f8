"""One joint report of a string and a 10-value category: the string declared as a category
over its top candidates plus ``other`` (docs/association.md, "String variables").

The population: strings Zipf(1.1) over 1,000 values, each string's category a Dirichlet(1)
draw of its own (fixed by the seed; the unlisted strings share one conditional, the
mixture of theirs). The top ``--candidates`` strings are listed and every other string
reports ``other``, so the table is (candidates + 1) x 10 and the unlisted share is its
last row. N installations, one report each at epsilon (``report_epsilon = epsilon``),
sampled exactly from the cell oracle (as ``veil experiment association`` does). Prints
the mean total variation of the decoder's consistent table from the truth over the seeds.

    python benchmarks/assoc_string_category.py                # N = 10^6, epsilon 2, 20 seeds
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.simulations.association_experiment import joint_document, joint_params
from veil.simulations.populations import total_variation

STRINGS = 1_000
CATEGORIES = 10


def truth(candidates: int, seed: int = 0) -> np.ndarray:
    """The (candidates + 1) x 10 table: the listed strings' rows, then ``other``'s."""
    rng = np.random.default_rng(seed)
    shares = np.arange(1, STRINGS + 1) ** -1.1
    shares /= shares.sum()
    conditional = rng.dirichlet(np.ones(CATEGORIES), size=STRINGS)
    full = shares[:, None] * conditional
    table: np.ndarray = np.vstack([full[:candidates], full[candidates:].sum(axis=0)])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    table = truth(args.candidates)
    params = joint_params(args.epsilon, table.shape)
    scores = []
    for seed in range(args.seeds):
        rng = np.random.default_rng([seed, args.reports])
        document = joint_document(params, rng.multinomial(args.reports, table.reshape(-1)), rng)
        result = decode_counts(document)
        scores.append(total_variation(np.array(result.column("consistent")), table))
    print(f"string (top {args.candidates} + other, {table[-1].sum():.3f} unlisted) x "
          f"{CATEGORIES} categories, N = {args.reports:,}, epsilon {args.epsilon:g}, cell "
          f"oracle {params.cell_oracle.oracle}: total variation {statistics.mean(scores):.4f} "
          f"(sd {statistics.stdev(scores):.4f} over {args.seeds} seeds)")


if __name__ == "__main__":
    main()
