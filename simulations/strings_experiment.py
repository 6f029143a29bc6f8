"""``veil experiment strings``: Bloom-filter RAPPOR, FLH and HCMS on one string population.

For each epsilon and number of reports ``n``, one population of ``n`` installations (one
report each) over 1,000 known strings under Zipf(1.1) is reported through each string
oracle at the same epsilon for one report: RAPPOR with ``p = 0``, ``q = 1`` and the ``f``
whose bound ``2h ln((1 - f/2) / (f/2))`` is epsilon (its permanent response is the
report), FLH and HCMS with ``report_epsilon = epsilon`` (no instantaneous noise), so every
report is epsilon-LDP and nothing is memoized across reports. Each is decoded over the
1,000 strings by its own decoder: RAPPOR's regression (non-negative least squares; its
table, the detected strings, the others 0), and FLH's and HCMS's unbiased estimates with
the collision solve, then projected onto the probability simplex (post-processing, free
of privacy cost). The figure of merit is the total variation distance to the
population's shares, ``sum |estimate - share| / 2`` (``tv_table``: of each decoder's
table of detected strings, for all three).

RAPPOR's counts are drawn from its model (:mod:`veil.server.analysis.synthetic`, exact
in distribution); FLH's and HCMS's reports with the simulation encoders' law
(:func:`veil.simulations.string_oracles.report_counts`). NumPy's seeded generators: these
are simulations, never production reports.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.joint_tests import project_to_simplex
from veil.server.analysis.string_oracles import StringOracleDecoder, candidate_keys
from veil.server.analysis.strings import StringDecoder
from veil.server.analysis.synthetic import simulate_string_counts
from veil.shared.kinds import FlhParams, HcmsParams, StringParams
from veil.shared.kinds.string import f_on_grid
from veil.simulations.populations import total_variation
from veil.simulations.report import Results, new_figure, progress
from veil.simulations.string_oracles import report_counts

COLORS = {"rappor": "#E69F00", "flh": "#CC79A7", "hcms": "#0072B2"}
EPSILONS = (1.0, 2.0, 4.0)
SIZES = (100_000, 1_000_000)
CANDIDATES = 1000


def zipf_shares(d: int, exponent: float = 1.1) -> np.ndarray:
    """Zipf(``exponent``) shares over ``d`` values."""
    weights = np.arange(1, d + 1, dtype=float) ** -exponent
    out: np.ndarray = weights / weights.sum()
    return out


def rappor_for(epsilon: float) -> StringParams:
    """Bloom RAPPOR (k = 128, h = 2, m = 64) whose one report is epsilon-LDP: ``p = 0``,
    ``q = 1`` and ``f`` from epsilon."""
    return StringParams(p=0.0, q=1.0, f=f_on_grid(epsilon, 2))


def one_cell(epsilon: float, n: int, names: list[str], shares: np.ndarray,
             rng: np.random.Generator) -> list[dict[str, Any]]:
    """The three oracles' rows at one (epsilon, n)."""
    truth_counts = rng.multinomial(n, shares)
    truth = truth_counts / n
    rows = []
    rappor = rappor_for(epsilon)
    matrix = build_map(rappor, names)
    reports, ones = simulate_string_counts(rappor, matrix, truth, n, rng)
    started = time.perf_counter()
    decoder = StringDecoder(rappor).fit(reports, ones, names, matrix)
    table = np.where(decoder.detected_, decoder.proportions_, 0.0)
    rows.append(_row("rappor", epsilon, n, rappor.k, table, truth, time.perf_counter() - started))
    keys = candidate_keys(names)
    for params in (FlhParams(epsilon=epsilon, report_epsilon=epsilon),
                   HcmsParams(epsilon=epsilon, report_epsilon=epsilon)):
        counts = report_counts(params, keys, truth_counts, rng)
        started = time.perf_counter()
        fitted = StringOracleDecoder(params).fit(counts, names)
        row = _row(params.oracle, epsilon, n, params.report_bits,
                   project_to_simplex(fitted.proportions_), truth, time.perf_counter() - started)
        row["tv_unbiased"] = total_variation(fitted.proportions_, truth)
        row["tv_table"] = total_variation(np.where(fitted.detected_, fitted.proportions_, 0.0), truth)
        rows.append(row)
    return rows


def _row(oracle: str, epsilon: float, n: int, bits: int, estimate: np.ndarray,
         truth: np.ndarray, seconds: float) -> dict[str, Any]:
    return {"oracle": oracle, "epsilon": epsilon, "n": n, "report_bits": bits,
            "tv": total_variation(estimate, truth), "tv_unbiased": float("nan"),
            "tv_table": total_variation(estimate, truth), "decode_seconds": seconds}


def strings(quick: bool = False, seed: int = 1) -> Results:
    """Total variation of the three string oracles over epsilon and N (see the module)."""
    rng = np.random.default_rng(seed)
    d = 100 if quick else CANDIDATES
    sizes = (20_000,) if quick else SIZES
    epsilons = (1.0, 4.0) if quick else EPSILONS
    names = [f"https://site{i}.example/page" for i in range(d)]
    shares = zipf_shares(d)
    rows: list[dict[str, Any]] = []
    for n, epsilon in progress([(n, e) for n in sizes for e in epsilons], "strings"):
        rows.extend(one_cell(epsilon, n, names, shares, rng))
    figure = new_figure(8.0, 3.8)
    axes = figure.subplots(1, len(sizes), sharey=True, squeeze=False)[0]
    for axis, n in zip(axes, sizes, strict=True):
        for oracle, color in COLORS.items():
            sel = [r for r in rows if r["oracle"] == oracle and r["n"] == n]
            axis.plot([r["epsilon"] for r in sel], [r["tv"] for r in sel], "o-", color=color,
                      label=oracle)
        axis.set(title=f"N = {n:,}", xlabel="ε per report", ylabel="total variation")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    notes = [
        f"{d:,} known strings under Zipf(1.1), one report per installation at equal epsilon "
        "(no memoized response across reports). RAPPOR: k = 128, h = 2, m = 64 with p = 0, "
        "q = 1 and f from epsilon, decoded by its regression (its table of detected strings); "
        "FLH and HCMS at their default "
        "pools, unbiased estimates with collisions solved, projected onto the simplex "
        "('tv_unbiased': before the projection). report_bits: RAPPOR's bit vector; FLH's "
        "and HCMS's cohort and payload.",
    ]
    return Results("strings", "String oracles: Bloom RAPPOR, FLH and HCMS over epsilon and N",
                   rows, {"strings": figure}, notes)
