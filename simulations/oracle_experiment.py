"""``veil experiment oracles``: the shipped category oracles against their variance formulas.

For each oracle (GRR, OUE, OLH, Hadamard: :mod:`veil.shared.kinds.oracles`), each
epsilon and each domain size ``d``, ``n`` reports of a fixed population are drawn
with the oracle's own statistic sampler
(:func:`veil.simulations.oracle_encoding.simulate_oracle_counts`, the exact law of
the SDK's reports, one per installation) and decoded by the oracle's decoder
(:data:`veil.server.analysis.decoders.DECODERS`), ``rounds`` times. The empirical
variance of every category's share estimate is compared with the formula the
decoder states, ``params.share_variance(share, n)``. One-shot parameters
(``report_epsilon = epsilon``: no instantaneous noise) make the figures
comparable with the literature's closed forms per report of an absent value,
listed beside them: Wang et al.'s for GRR, OUE and OLH
(:meth:`veil.simulations.oracles.Oracle.closed_form_variance`) and
``((e^eps + 1) / (e^eps - 1))^2`` for Hadamard response.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from veil.server.analysis.decoders import DECODERS
from veil.server.counts import CountsArrays
from veil.shared.kinds.oracles import ORACLES, OracleParams
from veil.shared.statistics import statistic_for
from veil.simulations.oracle_encoding import simulate_oracle_counts
from veil.simulations.oracles import Oracle
from veil.simulations.report import Results, new_figure, progress

COLORS = {"grr": "#E69F00", "oue": "#009E73", "olh": "#CC79A7", "hadamard": "#0072B2"}
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DOMAINS = (2, 16, 1024, 65536)


def population(d: int, n: int) -> np.ndarray:
    """True counts: Zipf(1.1) over the first half of the categories (all of them for
    ``d = 2``), the rest absent; rounded so that they add up to ``n``."""
    present = d if d <= 2 else d // 2
    weights = np.zeros(d)
    weights[:present] = np.arange(1, present + 1) ** -1.1
    counts: np.ndarray = np.floor(n * weights / weights.sum()).astype(np.int64)
    counts[0] += n - counts.sum()
    return counts


def rounds_for(d: int, quick: bool) -> int:
    """Rounds per point: enough that the pooled variance has a relative sd near 2% or less
    (``sqrt(2 / (rounds - 1))`` for one category, shrinking with more of them; for ``d = 2``
    the two shares move together, so only the rounds count)."""
    if quick:
        return {2: 400, 16: 60}.get(d, 10)
    return {2: 5000, 16: 1000, 1024: 20}.get(d, 8)


def decode_shares(params: OracleParams, counts: np.ndarray, n: int) -> np.ndarray:
    """The decoder's share estimates from one sampled statistic."""
    field = statistic_for(params).fields[0].name  # the counts vector: responses, or OUE's ones
    arrays = CountsArrays(metric="m", params=params, reports=np.array([n]),
                          fields={field: counts.reshape(1, -1).astype(np.int64)},
                          source="simulation")
    result = DECODERS[params.mechanism_name](arrays)
    return np.array([row["proportion"] for row in result.rows])


def wang_variance(oracle: str, epsilon: float, d: int) -> float:
    """Wang et al.'s closed form per report for an absent value (one-shot, ideal hashing);
    Hadamard response's is ``((e^eps + 1) / (e^eps - 1))^2``."""
    if oracle == "hadamard":
        e = math.exp(epsilon)
        return ((e + 1) / (e - 1)) ** 2
    return Oracle(oracle.upper(), epsilon, d).closed_form_variance(1)


def oracles(quick: bool = False, seed: int = 1) -> Results:
    """Empirical variance of the shipped oracles' share estimates against their formulas."""
    rng = np.random.default_rng(seed)
    n = 20_000 if quick else 1_000_000
    epsilons = (1.0, 4.0) if quick else EPSILONS
    domains = (2, 16, 1024) if quick else DOMAINS
    rows: list[dict[str, Any]] = []
    cells = [(name, d, eps) for name in ORACLES for d in domains for eps in epsilons]
    for name, d, epsilon in progress(cells, "oracles"):
        categories = tuple(f"c{i}" for i in range(d))
        params = ORACLES[name](categories=categories, epsilon=epsilon, report_epsilon=epsilon)
        truth = population(d, n)
        shares = truth / n
        rounds = rounds_for(d, quick)
        estimates = np.stack([decode_shares(params, simulate_oracle_counts(params, truth, rng), n)
                              for _ in range(rounds)])
        stated = np.array([params.share_variance(float(s), n) for s in shares])
        empirical = estimates.var(axis=0, ddof=1)
        # each round's mean squared error over the categories, over the mean stated variance
        # (the estimates are unbiased): its spread over rounds gives the ratio's standard
        # error, correlations between categories included
        per_round = ((estimates - shares) ** 2).mean(axis=1) / stated.mean()
        absent = shares == 0
        rows.append({
            "oracle": name, "epsilon": epsilon, "d": d, "n": n, "rounds": rounds,
            "report_bytes": params.report_bytes,
            "variance_per_report": params.share_variance(),
            "wang_closed_form": wang_variance(name, epsilon, d),
            "empirical_per_report": float(empirical.mean() * n),
            "stated_per_report": float(stated.mean() * n),
            "ratio": float(empirical.mean() / stated.mean()),
            "mse_ratio": float(per_round.mean()),
            "mse_ratio_se": float(per_round.std(ddof=1) / math.sqrt(rounds)),
            "ratio_absent": float(empirical[absent].mean() / stated[absent].mean())
            if absent.any() else math.nan,
            "max_bias_in_se": float(np.max(np.abs(estimates.mean(axis=0) - shares)
                                           / np.sqrt(stated / rounds))),
        })
    figure = new_figure(9.0, 5.6)
    axes = figure.subplots(2, 2, sharex=True).ravel()
    for axis, d in zip(axes, domains, strict=False):
        for name in ORACLES:
            sel = [r for r in rows if r["oracle"] == name and r["d"] == d]
            eps = [r["epsilon"] for r in sel]
            axis.semilogy(eps, [r["stated_per_report"] for r in sel], "-", color=COLORS[name],
                          label=f"{name} (formula)")
            axis.semilogy(eps, [r["empirical_per_report"] for r in sel], "o",
                          color=COLORS[name], markersize=4, label=f"{name} (simulated)")
        axis.set(title=f"d = {d:,} categories", ylabel="variance of a share × N")
        axis.grid(True, which="major", alpha=0.3)
    for axis in axes[len(domains):]:
        axis.set_visible(False)
    # the lowest visible panel of each column carries the column's ε ticks: with an odd
    # number of domains the one above a hidden panel is the last of its column
    for column in range(2):
        shown = [axis for axis in axes[column::2] if axis.get_visible()]
        shown[-1].tick_params(labelbottom=True)
    figure.supxlabel("privacy parameter ε (one report, no instantaneous noise)", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right center", fontsize=7)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    notes = [
        f"n = {n:,} reports per round (one per installation), a Zipf(1.1) population over half "
        "of the categories, the oracle's own statistic sampler (the exact law of the SDK's "
        "reports) and its decoder; report_epsilon = epsilon. 'ratio' is the empirical variance "
        "of the share estimates, averaged over categories, over the variance the decoder "
        f"states (params.share_variance); the largest distance from 1 is {worst:.3f}. "
        "'wang_closed_form' is the literature's per-report variance of an absent value; OLH "
        "differs from it because its bucket count g is a prime whose table fits 2^20 counters.",
    ]
    return Results("oracles", "Category oracles: simulated variance against the formulas", rows,
                   {"oracles": figure}, notes)
