"""``veil experiment marginals``: every pairwise table of many variables from assigned
marginals, against what one could do without them.

Eight variables of eight values each (``8^8`` cells: far beyond one report of the
tuple), associated through four latent classes (shares 0.4, 0.3, 0.2, 0.1; each
variable's distribution in each class a Dirichlet(0.5) draw, fixed by the population seed;
a pair's table is on average 0.18 in total variation from the product of its margins),
``N`` installations, one report each at ``epsilon`` (``report_epsilon = epsilon``). A
joint metric with ``marginals = k`` assigns each installation one of the ``C(8, k)``
marginals; the collector counts per marginal; the decoder
(:mod:`veil.server.analysis.joint_marginals`) makes them consistent and reconstructs all
28 pairwise tables. Scores: the mean over the 28 pairs of the total variation
``0.5 sum |estimate - truth|`` from the population's pairwise tables, averaged over
seeds, for

* **consistent** (the decoder's ``consistent`` column): consistent and non-negative;
* **linear**: the weighted least-squares projection alone (unbiased; what the stated
  errors describe);
* **raw**: each pair's own unbiased table, neither projected nor clipped (``k = 2``);
* **independence**: the product of the consistent one-way marginals, what separate
  metrics would answer.

Each collection draws the assignment ``Multinomial(N, uniform)``, each marginal's
composition from the population and its cell oracle's statistic with the exact sampler
(:func:`~veil.simulations.oracle_encoding.simulate_oracle_counts`), as
:func:`~veil.simulations.calibration_joint.marginals_document` does.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.joint_marginals import MarginalsResult, marginal_estimates
from veil.server.counts import counts_arrays
from veil.shared.kinds.joint import JointParams
from veil.simulations.calibration_joint import marginals_document
from veil.simulations.populations import total_variation
from veil.simulations.report import Results, new_figure, progress

VARIABLES = 8
VALUES = 8
CLASSES = np.array([0.4, 0.3, 0.2, 0.1])
#: the Dirichlet concentration of each variable's distribution in a class
CONCENTRATION = 0.5
EPSILONS = (1.0, 2.0, 4.0)
SIZES = (100_000, 1_000_000)
COLORS = {"consistent": "#0072B2", "linear": "#56B4E9", "raw": "#999999",
          "independence": "#009E73"}


def population(seed: int = 0, variables: int = VARIABLES, values: int = VALUES) -> np.ndarray:
    """The joint table (``values`` per axis) of the latent-class population (module
    docstring), fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    table = np.zeros((values,) * variables)
    for share in CLASSES:
        term = np.asarray(share)
        for _ in range(variables):
            term = np.multiply.outer(term, rng.dirichlet(np.full(values, CONCENTRATION)))
        table += term
    return table


def params_for(epsilon: float, marginals: int, variables: int = VARIABLES,
               values: int = VALUES) -> JointParams:
    """The joint metric: ``variables`` variables ``a, b, ...`` of ``values`` values."""
    names = tuple(chr(ord("a") + i) for i in range(variables))
    return JointParams(of=names, domains=tuple(tuple(f"{name}{j}" for j in range(values))
                                               for name in names),
                       epsilon=epsilon, report_epsilon=epsilon, marginals=marginals)


def one_round(table: np.ndarray, pairs: dict[tuple[int, int], np.ndarray], n: int,
              epsilon: float, marginals: int, rng: np.random.Generator) -> dict[str, float]:
    """Each estimate's mean total variation over the pairs, on one collection."""
    params = params_for(epsilon, marginals, table.ndim, table.shape[0])
    document = marginals_document(params, table, n, rng)
    result = decode_counts(document)
    assert isinstance(result, MarginalsResult)
    scores: dict[str, list[float]] = {key: [] for key in COLORS}
    raw = marginal_estimates(counts_arrays(document), 0.95).tables if marginals == 2 else None
    for (a, b), truth in pairs.items():
        pair = f"{params.of[a]} x {params.of[b]}"
        final = result.pair_table(pair)
        scores["consistent"].append(total_variation(final, truth))
        scores["linear"].append(total_variation(result.pair_table(pair, "proportion"), truth))
        scores["independence"].append(total_variation(
            np.outer(final.sum(axis=1), final.sum(axis=0)), truth))
        if raw is not None:
            scores["raw"].append(total_variation(raw[params.marginal_sets.index((a, b))], truth))
    return {key: float(np.mean(values)) if values else float("nan")
            for key, values in scores.items()}


def marginals(quick: bool = False, seed: int = 1) -> Results:
    """The experiment (see the module docstring)."""
    variables, values = (4, 4) if quick else (VARIABLES, VALUES)
    table = population(0, variables, values)
    pairs = {(a, b): table.sum(axis=tuple(c for c in range(variables) if c not in (a, b)))
             for a, b in itertools.combinations(range(variables), 2)}
    sizes = (20_000,) if quick else SIZES
    rows = []
    for k in (2, 3):
        for epsilon in EPSILONS:
            for n in sizes:
                rounds = 2 if quick else (20 if n >= 1_000_000 else 10)
                rng = np.random.default_rng([seed, k, int(epsilon * 10), n])
                scores = [one_round(table, pairs, n, epsilon, k, rng)
                          for _ in progress(range(rounds), f"k {k}, eps {epsilon:g}, N {n:,}")]
                row: dict[str, Any] = {"marginals": k, "epsilon": epsilon, "reports": n,
                                       "rounds": rounds}
                for key in COLORS:
                    row[f"tv_{key}"] = float(np.mean([s[key] for s in scores]))
                    row[f"tv_{key}_sd"] = float(np.std([s[key] for s in scores], ddof=1))
                rows.append(row)
    notes = [f"{variables} variables of {values} values, {len(pairs)} pairs; four latent "
             "classes (shares 0.4, 0.3, 0.2, 0.1), each variable Dirichlet(0.5) per class "
             "(population seed 0); one report per installation at epsilon "
             "(report_epsilon = epsilon); mean over the pairs of the total variation, mean "
             "(and standard deviation) over the rounds. consistent: the decoder's consistent "
             "column; linear: the weighted least-squares projection alone; raw: each pair's "
             "own table (k = 2); independence: the product of the consistent one-way "
             "marginals."]
    return Results("marginals", "Assigned marginals: every pairwise table of many variables",
                   rows, {"marginals": _figure(rows)}, notes)


def _figure(rows: list[dict[str, Any]]) -> Any:
    figure = new_figure(7.0, 3.6)
    ax = figure.subplots()
    largest = max(row["reports"] for row in rows)
    for k, style in ((2, "-"), (3, "--")):
        chosen = [row for row in rows if row["marginals"] == k and row["reports"] == largest]
        for design, label in (("consistent", "consistent (decoder)"),
                              ("linear", "weighted least squares only"),
                              ("raw", "each pair's own table"),
                              ("independence", "product of one-way marginals")):
            points = [(row["epsilon"], row[f"tv_{design}"]) for row in chosen
                      if np.isfinite(row[f"tv_{design}"])]
            if points:
                ax.semilogy(*zip(*points, strict=True), style, marker="o", color=COLORS[design],
                            label=f"{label}, marginals = {k}")
    ax.set(xlabel="epsilon per installation", ylabel="mean total variation over the pairs",
           title=f"Every pairwise table from assigned marginals, N = {largest:,}")
    ax.set_xticks(EPSILONS)
    ax.legend(fontsize=6)
    return figure
