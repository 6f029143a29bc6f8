"""``veil experiment association``: one joint report against the split budget and against
independence, over epsilon and N.

A 10 x 10 table with dependence (a Zipf(1.1) first variable, each of its values with
its own conditional distribution of the second) is estimated three ways, each
installation spending the same total ``epsilon``, one report per installation
(``report_epsilon = epsilon``: no instantaneous noise, as the literature's figures):

* **joint**: one report of the pair through a joint metric's cell oracle
  (:class:`~veil.shared.kinds.JointParams`, ``encoding = "auto"``), decoded by
  :func:`~veil.server.analysis.joint.decode_joint`; the consistent (projected) table;
* **split + EM** (google/rappor's association design): each variable reported
  separately in the same row with ``epsilon / 2`` through GRR (the oracle whose pair
  of reports has a 10 x 10 histogram, which makes the EM exact and fast), the joint
  table estimated by EM over the pairs' likelihood ``P(r1 | x) P(r2 | y)``
  (:func:`split_em`) until the log-likelihood gains less than 1e-10 per report;
* **split, plain inversion**: the same pairs inverted linearly,
  ``A^-1 (H / N) B^-T`` (unbiased, not projected), for reference;
* **independence**: the product of the two marginals of the split reports (projected
  onto the simplex): what one gets without joint reporting at all.

Scores: total variation ``0.5 sum |estimate - truth|``, mean over seeds. The null
check draws tables of two independent variables and reads the independence test's
p-values (uniform if the test is honest; KS statistic and p-value in the notes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.joint_tests import project_to_simplex
from veil.server.counts import counts_document
from veil.shared.kinds import GrrParams
from veil.shared.kinds.joint import JointParams
from veil.shared.statistics import statistic_for
from veil.simulations.oracle_encoding import simulate_oracle_counts
from veil.simulations.populations import total_variation
from veil.simulations.report import Results, new_figure, progress

EPSILONS = (1.0, 2.0, 4.0)
SIZES = (100_000, 1_000_000)
SIDE = 10
#: EM stops once the mean log-likelihood per report gains less than this
EM_TOLERANCE = 1e-10
COLORS = {"joint": "#0072B2", "split_em": "#E69F00", "split_inversion": "#999999",
          "independence": "#009E73"}


def dependent_table(side: int = SIDE, seed: int = 0) -> np.ndarray:
    """The truth: ``P(x)`` Zipf(1.1) over ``side`` values, ``P(y | x)`` a Dirichlet(1) draw
    per ``x`` (fixed by ``seed``), as a ``(side, side)`` table summing to 1."""
    rng = np.random.default_rng(seed)
    rows = np.arange(1, side + 1) ** -1.1
    rows /= rows.sum()
    conditional = rng.dirichlet(np.ones(side), size=side)
    table: np.ndarray = rows[:, None] * conditional
    return table


def joint_params(epsilon: float, shape: tuple[int, int] = (SIDE, SIDE)) -> JointParams:
    """A joint metric over two category variables of ``shape``, one report at ``epsilon``."""
    return JointParams(of=("x", "y"),
                       domains=tuple(tuple(f"{name}{i}" for i in range(size))
                                     for name, size in zip("xy", shape, strict=True)),
                       epsilon=epsilon, report_epsilon=epsilon)


def joint_document(params: JointParams, true_counts: np.ndarray,
                   rng: np.random.Generator) -> dict[str, Any]:
    """The counts document of one report per installation, ``true_counts[cell]`` of them per
    cell, sampled with the cell oracle's exact statistic sampler."""
    counts = simulate_oracle_counts(params.cell_oracle, true_counts, rng)
    field = statistic_for(params).fields[0].name
    return counts_document(params, np.array([int(true_counts.sum())]), counts, "joint", field)


def grr_channel(params: GrrParams) -> np.ndarray:
    """``A[r, x] = P(report r | value x)`` of GRR with these parameters."""
    p, q = params.support_probs
    return np.full((params.d, params.d), q) + np.eye(params.d) * (p - q)


def split_pairs(table: np.ndarray, n: int, epsilon: float, rng: np.random.Generator,
                ) -> tuple[np.ndarray, GrrParams, GrrParams]:
    """The histogram of ``n`` installations' report pairs ``(r1, r2)``, each variable
    reported through GRR at ``epsilon / 2``, and the two GRR parameter sets."""
    rows, cols = table.shape
    first = GrrParams(categories=tuple(map(str, range(rows))), epsilon=epsilon / 2,
                      report_epsilon=epsilon / 2)
    second = GrrParams(categories=tuple(map(str, range(cols))), epsilon=epsilon / 2,
                       report_epsilon=epsilon / 2)
    a, b = grr_channel(first), grr_channel(second)
    true_counts = rng.multinomial(n, table.reshape(-1)).reshape(rows, cols)
    pairs = np.zeros((rows, cols), dtype=np.int64)
    for x in range(rows):
        for y in range(cols):
            if true_counts[x, y]:
                pairs += rng.multinomial(true_counts[x, y], np.outer(a[:, x], b[:, y]).reshape(-1)
                                         ).reshape(rows, cols)
    return pairs, first, second


def split_em(pairs: np.ndarray, a: np.ndarray, b: np.ndarray, max_iterations: int = 20_000,
             ) -> tuple[np.ndarray, int]:
    """The maximum-likelihood joint table from report pairs (histogram ``pairs``) with
    channels ``a`` and ``b`` (``P(r1 | x)``, ``P(r2 | y)``), by EM from the uniform table:
    ``pi <- pi * (A^T (H / (A pi B^T)) B) / N``. Each step raises the likelihood (EM's
    monotonicity); it stops when the mean log-likelihood per report gains less than
    :data:`EM_TOLERANCE`, or after ``max_iterations``. Returns the table and the steps."""
    n = pairs.sum()
    pi = np.full((a.shape[1], b.shape[1]), 1.0 / (a.shape[1] * b.shape[1]))
    previous = -np.inf
    for step in range(1, max_iterations + 1):
        expected = a @ pi @ b.T
        likelihood = float((pairs * np.log(np.maximum(expected, 1e-300))).sum() / n)
        pi = pi * (a.T @ (pairs / np.maximum(expected, 1e-300)) @ b) / n
        if likelihood - previous < EM_TOLERANCE:
            return pi, step
        previous = likelihood
    return pi, max_iterations


def split_inversion(pairs: np.ndarray, first: GrrParams, second: GrrParams) -> np.ndarray:
    """The split design's unbiased table by plain inversion, ``A^-1 (H / N) B^-T`` (no
    projection): the design the issue's "split budget" figures assume."""
    inverse_a = np.linalg.inv(grr_channel(first))
    inverse_b = np.linalg.inv(grr_channel(second))
    out: np.ndarray = inverse_a @ (pairs / pairs.sum()) @ inverse_b.T
    return out


def split_marginals(pairs: np.ndarray, first: GrrParams, second: GrrParams) -> np.ndarray:
    """The independence-only answer: the product of the two projected marginals."""
    n = pairs.sum()
    shares = []
    for params, counts in ((first, pairs.sum(axis=1)), (second, pairs.sum(axis=0))):
        p, q = params.support_probs
        shares.append(project_to_simplex((counts / n - q) / (p - q)))
    product: np.ndarray = np.outer(*shares)
    return product


def one_round(table: np.ndarray, n: int, epsilon: float, rng: np.random.Generator,
              ) -> dict[str, float]:
    """Every design's total variation on one simulated population of ``n``."""
    params = joint_params(epsilon, table.shape)
    true_counts = rng.multinomial(n, table.reshape(-1))
    result = decode_counts(joint_document(params, true_counts, rng))
    pairs, first, second = split_pairs(table, n, epsilon, rng)
    em, steps = split_em(pairs, grr_channel(first), grr_channel(second))
    return {
        "joint": total_variation(np.array(result.column("consistent")), table),
        "joint_unbiased": total_variation(np.array(result.column("proportion")), table),
        "split_em": total_variation(em, table),
        "split_inversion": total_variation(split_inversion(pairs, first, second), table),
        "independence": total_variation(split_marginals(pairs, first, second), table),
        "em_steps": float(steps),
    }


def null_p_values(tables: int, n: int, epsilon: float, seed: int,
                  side: int = SIDE) -> np.ndarray:
    """The independence test's p-values on ``tables`` joint metrics of two independent
    variables (fresh marginals per table, Dirichlet(1)), ``n`` reports each."""
    rng = np.random.default_rng(seed)
    params = joint_params(epsilon, (side, side))
    out = np.empty(tables)
    for t in progress(range(tables), "null tables"):
        truth = np.outer(rng.dirichlet(np.ones(side)), rng.dirichlet(np.ones(side)))
        document = joint_document(params, rng.multinomial(n, truth.reshape(-1)), rng)
        out[t] = decode_counts(document).summary["independence"]["p_value"]
    return out


def power(n: int, epsilon: float, tables: int, seed: int) -> float:
    """The independence test's rejection rate at 5% for a crash rate of 10% on one browser
    and 15% on another, the two equally common (a 2 x 2 joint metric), ``n`` reports."""
    rng = np.random.default_rng(seed)
    params = joint_params(epsilon, (2, 2))
    truth = np.array([[0.45, 0.05], [0.425, 0.075]])
    rejected = [decode_counts(joint_document(params, rng.multinomial(n, truth.reshape(-1)), rng))
                .summary["independence"]["p_value"] < 0.05 for _ in range(tables)]
    return float(np.mean(rejected))


def association(quick: bool = False, seed: int = 1) -> Results:
    """The experiment (see the module docstring)."""
    from scipy.stats import kstest

    table = dependent_table()
    sizes = (20_000, 100_000) if quick else SIZES
    rows = []
    for epsilon in EPSILONS:
        for n in sizes:
            rounds = 3 if quick else (20 if n >= 1_000_000 else 10)
            rng = np.random.default_rng([seed, int(epsilon * 10), n])
            scores = [one_round(table, n, epsilon, rng)
                      for _ in progress(range(rounds), f"eps {epsilon:g}, N {n:,}")]
            row: dict[str, Any] = {"epsilon": epsilon, "reports": n, "rounds": rounds}
            for key in scores[0]:
                row[f"tv_{key}" if key != "em_steps" else key] = float(
                    np.mean([s[key] for s in scores]))
            row["split_over_joint"] = row["tv_split_em"] / row["tv_joint"]
            row["power_2x2"] = power(n // 10, epsilon, 40 if quick else 400, seed)
            rows.append(row)
    null_tables, null_n = (100, 20_000) if quick else (1000, 100_000)
    notes = ["10 x 10 table, P(x) Zipf(1.1), P(y | x) Dirichlet(1) per x (seed 0); one "
             "report per installation at the total epsilon; mean total variation over the "
             "rounds. Joint: cell oracle chosen by auto, consistent (projected) table; split: "
             "GRR at epsilon/2 per variable, EM; independence: product of the split marginals. "
             "power_2x2: the independence test's rejection rate at 5% with N/10 reports of a "
             "2 x 2 table, crash rate 10% on one browser and 15% on another, equally common."]
    for epsilon in (1.0, 4.0):
        p_values = null_p_values(null_tables, null_n, epsilon, seed + 7)
        test = kstest(p_values, "uniform")
        notes.append(
            f"independence test under independence, epsilon {epsilon:g}, {null_tables} tables of "
            f"{null_n:,} reports: KS statistic {test.statistic:.4f}, p = {test.pvalue:.3g}; "
            f"rejections at 5%: {np.mean(p_values < 0.05):.3f}")
    return Results("association", "Association: one joint report vs the split budget vs "
                   "independence", rows, {"association": _figure(rows)}, notes)


def _figure(rows: list[dict[str, Any]]) -> Any:
    figure = new_figure(7.0, 3.6)
    ax = figure.subplots()
    sizes = sorted({row["reports"] for row in rows})
    for design, label in (("joint", "one joint report"), ("split_em", "split budget + EM"),
                          ("split_inversion", "split budget, plain inversion"),
                          ("independence", "independence (product of marginals)")):
        for n, style in zip(sizes, ("--", "-"), strict=False):
            chosen = [row for row in rows if row["reports"] == n]
            ax.semilogy([row["epsilon"] for row in chosen],
                        [row[f"tv_{design}"] for row in chosen], style, marker="o",
                        color=COLORS[design], label=f"{label}, N = {n:,}")
    ax.set(xlabel="total epsilon per installation", ylabel="mean total variation",
           title="10 x 10 joint table: error against epsilon")
    ax.set_xticks(EPSILONS)
    ax.legend(fontsize=6)
    return figure
