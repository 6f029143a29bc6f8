"""``veil experiment discovery``: find the frequent strings of a population nobody listed.

The population (a ``value,count`` CSV, or :func:`~veil.simulations.discovery.url_population`
under Zipf(1.1)) is reported end to end with the code the deployment runs: each
installation is assigned to the discovery channel (a uniformly random level) with
probability ``share`` or else to the string channel; discovery reports are encoded
level by level (:func:`~veil.simulations.discovery.encode_discovery`), the prefixes
are extended by :class:`~veil.server.analysis.discovery.PrefixSearch`, and the strings
found are decoded by the string decoder over the string channel's counts, drawn
exactly from the RAPPOR model (:func:`~veil.server.analysis.synthetic.string_counts_from_values`).
PEM (:mod:`veil.simulations.pem`) runs on the same population, N and epsilon.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.charts import draw_prefix_search
from veil.server.analysis.discovery import PrefixSearch
from veil.server.analysis.strings import StringDecoder
from veil.server.analysis.synthetic import string_counts_from_values
from veil.server.analysis.tables import STRING_COLUMNS, write_rows
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams
from veil.shared.kinds.discovery import DiscoveryParams
from veil.simulations.discovery import encode_discovery, url_population, value_vectors
from veil.simulations.populations import Population
from veil.simulations.report import Results, new_figure

#: the strings whose recall the experiment reports, by share
RECALL_SHARES = (0.01, 0.003)
#: the top strings compared with PEM (F1)
TOP = 32
#: longest value of ``--quick`` runs
QUICK_LENGTH = 24
#: columns of discovered.csv: the decode table's plus the method that found the row
DISCOVERED_COLUMNS = ("method", *STRING_COLUMNS)


def string_channel_params(epsilon: float, *, k: int = 128, m: int = 64) -> StringParams:
    """The string channel's parameters for one report per installation: one hash, no
    instantaneous response (``p = 0``, ``q = 1``), ``f`` for ``epsilon_inf = epsilon``."""
    chosen = StringParams.for_epsilon(epsilon, k=k, h=1, m=m, p=0.0)
    return dataclasses.replace(chosen, q=1.0)


def url_zipf_population(size: int, rng: np.random.Generator, exponent: float = 1.1, *,
                        high: int = 64) -> Population:
    """The built-in population: ``size`` URL-like strings of 8 to ``high`` bytes under
    Zipf(``exponent``), ranks in random order of the strings."""
    values = url_population(size, rng, high=high)
    order = rng.permutation(len(values))
    weights = np.arange(1, len(values) + 1, dtype=float) ** -exponent
    return Population(tuple(values[i] for i in order), weights / weights.sum())


@dataclasses.dataclass
class DiscoveryRun:
    """One simulated deployment: the search, the decoded table and the figures of merit."""

    params: DiscoveryParams
    string_params: StringParams
    search: PrefixSearch
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]


def simulate_levels(params: DiscoveryParams, population: Population, reports: np.ndarray,
                    rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each level's ``(rows, buckets)`` for ``reports[L]`` installations at level ``L``
    holding values of ``population``, encoded when asked for (a search reaches it)."""
    for level, n in enumerate(reports):
        held = rng.multinomial(int(n), population.probs)
        present = np.flatnonzero(held)
        vectors = value_vectors(params, [population.values[i] for i in present], level)
        yield encode_discovery(params, np.repeat(vectors, held[present]), rng)


def run_discovery(population: Population, reports: int, epsilon: float, seed: int, *,
                  params: DiscoveryParams | None = None, alpha: float = 0.05,
                  progress: Any = None) -> DiscoveryRun:
    """Simulate ``reports`` installations (one report each) and discover their strings."""
    if isinstance(reports, bool) or not isinstance(reports, int) or reports < 1:
        raise ParameterError("reports", f"must be an integer >= 1; got {reports!r}")
    params = params or DiscoveryParams(epsilon=epsilon)
    string_params = string_channel_params(epsilon)
    rng = np.random.default_rng(seed)
    on_discovery = int(rng.binomial(reports, params.share))
    per_level = rng.multinomial(on_discovery, np.full(params.levels, 1 / params.levels))
    search = PrefixSearch(params, progress=progress).fit(
        simulate_levels(params, population, per_level, rng))
    on_strings = reports - on_discovery
    cohort_values = population.cohort_histogram(on_strings, string_params.m, rng)
    truth = build_map(string_params, list(population.values))
    cohort_reports, ones = string_counts_from_values(string_params, truth, cohort_values, rng)
    candidates = sorted(search.strings_)
    decoder = StringDecoder(string_params, correction="bh", alpha=alpha).fit(
        cohort_reports, ones, candidates, metric="discovery")
    rows = [{"method": "veil", **row} for row in decoder.result_.rows]
    found = [row["string"] for row in rows]
    metrics = {
        "method": "veil", "reports": reports, "epsilon": epsilon,
        "candidates": len(candidates), "discovered": len(found),
        **figures_of_merit(found, population.shares),
        "seconds": search.seconds_,
    }
    return DiscoveryRun(params, string_params, search, rows, metrics)


def figures_of_merit(found: list[str], shares: dict[str, float]) -> dict[str, Any]:
    """Recall of the strings above each of :data:`RECALL_SHARES`, precision of ``found``
    (strings with a positive share in the population) and F1 of the top :data:`TOP`."""
    out: dict[str, Any] = {}
    found_set = set(found)
    for level in RECALL_SHARES:
        frequent = [value for value, share in shares.items() if share >= level]
        out[f"recall_{level:g}"] = (sum(value in found_set for value in frequent) / len(frequent)
                                    if frequent else math.nan)
    out["precision"] = (sum(shares.get(value, 0.0) > 0 for value in found) / len(found)
                        if found else math.nan)
    top = set(sorted(shares, key=shares.__getitem__, reverse=True)[:TOP])
    reported = set(found[:TOP])
    hits = len(top & reported)
    out[f"f1_top{TOP}"] = 2 * hits / (len(top) + len(reported)) if top or reported else math.nan
    return out


def discovery_experiment(population: Population | None, reports: int, epsilon: float,
                         seed: int, *, pem: bool = True, quick: bool = False,
                         ) -> tuple[Results, list[dict[str, Any]]]:
    """Run Veil's discovery (and PEM) and return the results and the discovered rows.
    ``quick``: values of at most 24 bytes (2,000 built-in ones), for tests."""
    from veil.simulations.pem import run_pem

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    length = QUICK_LENGTH if quick else DiscoveryParams.max_length
    if population is None:
        population = url_zipf_population(2_000 if quick else 100_000, rng, high=length)
    params = DiscoveryParams(epsilon=epsilon, max_length=length)
    run = run_discovery(population, reports, epsilon, seed, params=params)
    shares = population.shares
    table = list(run.rows)
    metrics = [run.metrics]
    if pem:
        result = run_pem(list(population.values), population.probs, reports, epsilon,
                         np.random.default_rng(seed + 1), k=TOP, max_length=length,
                         fingerprint_bits=20 if quick else 24)
        found = [value for value, _ in result.strings]
        metrics.append({"method": "pem", "reports": reports, "epsilon": epsilon,
                        "candidates": len(found), "discovered": len(found),
                        **figures_of_merit(found, shares), "seconds": result.seconds})
        table += [{"method": "pem", "metric": "discovery", "kind": "string", "value": value,
                   "string": value, "estimate": share * reports, "proportion": share}
                  for value, share in result.strings]
    figure = _figure(run, table, shares)
    notes = [
        f"{reports:,} installations, one report each, epsilon = {epsilon:g} per installation "
        f"for the whole metric: a share {run.params.share:g} on the discovery channel "
        f"({run.params.levels} levels of {run.params.segment} bytes, local hashing with "
        f"{run.params.buckets} buckets, epsilon_inf = {run.params.epsilon_inf:.3g}), the rest "
        f"on the string channel (k = {run.string_params.k}, h = 1, m = {run.string_params.m}, "
        f"epsilon_inf = {run.string_params.epsilon_inf:.3g}). Veil's rows are the strings the "
        "string decoder detects among the discovered candidates (false discovery rate 5%); "
        f"PEM's are its top {TOP} (Wang, Li and Jha; same N, epsilon and segments, every "
        "installation on its groups).",
    ]
    results = Results("discovery", "Discovering frequent strings nobody listed", metrics,
                      {"discovery": figure}, notes, time.perf_counter() - started)
    return results, table


def _figure(run: DiscoveryRun, table: list[dict[str, Any]], shares: dict[str, float]) -> Any:
    figure = new_figure(9.0, 4.0)
    left, right = figure.subplots(1, 2, width_ratios=(2, 1))
    top = sorted(shares, key=shares.__getitem__, reverse=True)[:40]
    found = {method: {row["string"] for row in table if row["method"] == method}
             for method in ("veil", "pem")}
    x = np.arange(1, len(top) + 1)  # the most frequent string is rank 1
    left.bar(x, [shares[v] for v in top], color="#bbbbbb", label="true share")
    for method, marker, color, lift in (("veil", "o", "#0072B2", 1.08), ("pem", "x", "#D55E00", 1.2)):
        hit = [i for i, value in enumerate(top) if value in found[method]]
        if not hit and method not in {row["method"] for row in table}:
            continue  # a method that did not run (--no-pem) gets no legend entry
        left.plot([i + 1 for i in hit], [shares[top[i]] * lift for i in hit], marker,
                  color=color, ls="none", label=f"found by {method}")
    left.set(yscale="log", xlabel="rank of the string (1: the most frequent)", ylabel="share",
             title="the 40 most frequent strings and who found them")
    left.legend(fontsize=7)
    draw_prefix_search(right, run.search.levels_)
    for axis in (left, right):
        axis.title.set_fontsize(9)
    return figure


def write_discovered(path: Path, table: list[dict[str, Any]]) -> None:
    """``discovered.csv``: the tidy decode schema with a ``method`` column first."""
    write_rows(path, DISCOVERED_COLUMNS,
               [{column: row.get(column) for column in DISCOVERED_COLUMNS} for row in table])
