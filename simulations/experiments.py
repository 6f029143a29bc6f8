"""Reproductions of published local-DP experiments; each returns :class:`Results`.

Every experiment takes ``quick`` (small sizes, for tests) and ``seed``; the
default sizes run in a few minutes at most on a two-core machine. Randomness
is a seeded NumPy generator: results are reproducible, and none of this is
production noise.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.synthetic import string_counts_from_values
from veil.shared.kinds import BooleanParams, StringParams
from veil.shared.privacy import parallel, sequential
from veil.simulations.association_experiment import association
from veil.simulations.calibration_report import calibration
from veil.simulations.marginals_experiment import marginals
from veil.simulations.oracle_experiment import oracles
from veil.simulations.oracles import ORACLES, Oracle
from veil.simulations.populations import DISTRIBUTIONS, Population
from veil.simulations.report import Results, new_figure, progress
from veil.simulations.sensitivity import HEIGHTS, sample_sensitivity
from veil.simulations.strings_experiment import strings

COLORS = {"GRR": "#E69F00", "SUE": "#56B4E9", "OUE": "#009E73", "OLH": "#CC79A7"}


def _rr_counts(
    params: BooleanParams, n_yes: int, n_no: int, trials: int, rng: np.random.Generator
) -> np.ndarray:
    """Observed 'yes' answers of ``trials`` independent rounds of randomized response.

    Each person answers yes independently with ``yes_probs`` (the SDK's realized
    probabilities), so the total is exactly a sum of two binomials.
    """
    yes_given_no, yes_given_yes = params.yes_probs
    return rng.binomial(n_yes, yes_given_yes, trials) + rng.binomial(n_no, yes_given_no, trials)


def _rr_count_estimate(params: BooleanParams, ones: np.ndarray, n: int) -> np.ndarray:
    """Warner's unbiased count of true 'yes': ``(ones - n (1 - alpha) beta) / alpha``."""
    yes_given_no, yes_given_yes = params.yes_probs
    return (ones - n * yes_given_no) / (yes_given_yes - yes_given_no)


def rr_vs_laplace(quick: bool = False, seed: int = 1) -> Results:
    """Count of 'yes' answers: local randomized response against the central Laplace mechanism.

    At the same epsilon, randomized response adds an independent error per
    person, so the count's error grows like sqrt(n); the central Laplace
    mechanism adds one Laplace(1/epsilon) draw to the exact count, whatever n.
    """
    rng = np.random.default_rng(seed)
    epsilon, share = 1.0, 0.3
    sizes = [10**e for e in range(2, 5 if quick else 7)]
    sizes = sorted(set(sizes + [3 * s for s in sizes[:-1]]))
    trials = 200 if quick else 2000
    params = BooleanParams.for_epsilon(epsilon)
    yes_given_no, yes_given_yes = params.yes_probs
    rows: list[dict[str, Any]] = []
    for n in progress(sizes, "rr-vs-laplace"):
        n_yes = round(share * n)
        truth = float(n_yes)
        rr = _rr_count_estimate(params, _rr_counts(params, n_yes, n - n_yes, trials, rng), n)
        laplace = truth + rng.laplace(0.0, 1.0 / epsilon, trials)
        pi = (n_yes * yes_given_yes + (n - n_yes) * yes_given_no) / n
        rr_sd = math.sqrt(n * pi * (1 - pi)) / (yes_given_yes - yes_given_no)
        for name, estimates, theory in (
            ("randomized response (local)", rr, rr_sd),
            ("Laplace (central)", laplace, math.sqrt(2) / epsilon),
        ):
            rmse = float(np.sqrt(np.mean((estimates - truth) ** 2)))
            rows.append({
                "mechanism": name, "n": n, "epsilon": epsilon, "rmse": rmse, "theory_sd": theory,
                "relative_error": rmse / truth,
            })
    figure = new_figure(6.4, 3.6)
    axes = figure.subplots(1, 2)
    for name, color in (("randomized response (local)", "#D55E00"), ("Laplace (central)", "#0072B2")):
        sel = [r for r in rows if r["mechanism"] == name]
        n = [r["n"] for r in sel]
        axes[0].loglog(n, [r["rmse"] for r in sel], "o", color=color, label=name)
        axes[0].loglog(n, [r["theory_sd"] for r in sel], "-", color=color, alpha=0.6)
        axes[1].loglog(n, [r["relative_error"] for r in sel], "o-", color=color)
    axes[0].set(xlabel="number of people", ylabel="typical error of the count (RMSE)",
                title=f"error in people, ε = {epsilon:g}")
    axes[1].set(xlabel="number of people", ylabel="error ÷ true count", title="relative error")
    axes[0].plot([], [], "-", color="0.4", label="theory")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3,
                  fontsize=7, frameon=False)
    notes = [
        f"True share of 'yes' = {share}; epsilon = {epsilon} for both mechanisms; {trials} trials "
        "per point. Randomized response uses Veil's boolean parameters for this epsilon "
        f"(alpha = tanh(epsilon/2) = {params.alpha:.4f}, beta = 1/2) and Warner's unbiased "
        "estimator; its error follows sqrt(n pi (1 - pi)) / alpha (lines). The central Laplace "
        "mechanism (a trusted curator adds Laplace(1/epsilon) to the exact count) has error "
        "sqrt(2)/epsilon for every n. The local model's relative error still falls like 1/sqrt(n).",
    ]
    return Results("rr-vs-laplace", "Randomized response vs the Laplace mechanism for a count",
                   rows, {"rr_vs_laplace": figure}, notes)


def laplace_mean(quick: bool = False, seed: int = 1) -> Results:
    """Local Laplace mean of heights: error against epsilon for sampled sensitivities."""
    rng = np.random.default_rng(seed)
    n = 1000 if quick else 10000
    trials = 30 if quick else 200
    samples = 20000 if quick else 200000
    epsilons = [0.1, 0.3, 1.0, 3.0, 10.0] if quick else [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
    sample = sample_sensitivity(HEIGHTS.sample, lambda d: d.mean(axis=1), 1, samples, rng)
    closed = HEIGHTS.expected_abs_difference()
    spread = HEIGHTS.sd_abs_difference()
    levels = {
        "E|X-X'|": sample.mean,
        "+1 sd": sample.mean + float(sample.distances.std(ddof=1)),
        "+2 sd": sample.mean + 2 * float(sample.distances.std(ddof=1)),
    }
    rows: list[dict[str, Any]] = []
    for label, delta in levels.items():
        exceed = float((sample.distances > delta).mean())
        for epsilon in progress(epsilons, f"laplace-mean {label}"):
            errors = np.empty(trials)
            for t in range(trials):
                heights = HEIGHTS.sample(n, rng)
                reports = heights + rng.laplace(0.0, delta / epsilon, n)
                errors[t] = reports.mean() - heights.mean()
            rows.append({
                "sensitivity": label, "delta_cm": delta, "epsilon": epsilon, "n": n,
                "rmse_cm": float(np.sqrt(np.mean(errors**2))),
                "theory_cm": math.sqrt(2) * delta / (epsilon * math.sqrt(n)),
                "p_exceed": exceed,
            })
    figure = new_figure(6.4, 3.6)
    axes = figure.subplots(1, 2)
    for label, color in zip(levels, ("#0072B2", "#E69F00", "#D55E00"), strict=True):
        sel = [r for r in rows if r["sensitivity"] == label]
        eps = [r["epsilon"] for r in sel]
        axes[0].loglog(eps, [r["rmse_cm"] for r in sel], "o", color=color,
                       label=f"Δ = {sel[0]['delta_cm']:.2f} ({label})")
        axes[0].loglog(eps, [r["theory_cm"] for r in sel], "-", color=color, alpha=0.6)
    axes[0].set(xlabel="privacy parameter ε (smaller: more private)",
                ylabel="typical error of the mean (cm)", title=f"mean height of {n} people")
    axes[0].legend(fontsize=7, title="sensitivity", title_fontsize=7, loc="upper center",
                   bbox_to_anchor=(0.5, -0.22), frameon=False)
    axes[1].hist(sample.distances, bins=80, density=True, color="#999999")
    axes[1].axvline(closed, color="k", label=f"closed form {closed:.2f}")
    axes[1].axvline(sample.mean, color="#0072B2", ls="--", label=f"sampled {sample.mean:.2f}")
    axes[1].set(xlabel="height difference of two people (cm)", ylabel="share of pairs (density)",
                title="sampled sensitivity")
    axes[1].legend(fontsize=7, title="mean difference", title_fontsize=7, loc="upper center",
                   bbox_to_anchor=(0.5, -0.22), frameon=False)
    notes = [
        "Heights: equal mixture of N(178, 7^2) and N(162, 6.5^2) cm. Each person reports their "
        "height plus Laplace(Δ/ε) noise; the analyst averages the reports. The sensitivity Δ is "
        f"sampled as in Rubinstein and Aldà (2017): |X − X'| over {samples} pairs of neighbours "
        f"gives {sample.mean:.3f} ± {sample.standard_error:.3f} cm (standard error), against the "
        f"closed form E|X − X'| = {closed:.3f} cm (sd {spread:.3f} cm). Lines: sqrt(2) Δ/(ε sqrt(n)).",
        "Such a sensitivity is typical, not worst-case: the 'p_exceed' column is the share of "
        "neighbour pairs whose distance exceeds Δ, for which the stated ε does not hold "
        "(random differential privacy). Veil's number metrics instead clip to [low, high] and use "
        "the full range as sensitivity, which holds for everyone.",
    ]
    return Results("laplace-mean", "Local Laplace mean estimation with sampled sensitivity",
                   rows, {"laplace_mean": figure}, notes)


def composition(quick: bool = False, seed: int = 1) -> Results:
    """A d-bin histogram at total budget epsilon: sequential against parallel composition."""
    rng = np.random.default_rng(seed)
    epsilon, n = 1.0, 10000
    bins = [2, 4, 8, 16] if quick else [2, 4, 8, 16, 32, 64]
    trials = 30 if quick else 200
    rows: list[dict[str, Any]] = []
    for d in progress(bins, "composition"):
        truth = rng.multinomial(n, np.full(d, 1 / d))
        values = np.repeat(np.arange(d), truth)
        # central: d separate counting queries over everyone (sequential) vs one histogram
        # of disjoint bins (parallel); each count has sensitivity 1
        seq_eps = [epsilon / d] * d
        central = {
            "sequential": (seq_eps, truth + rng.laplace(0, d / epsilon, (trials, d))),
            "parallel": ([epsilon] * d, truth + rng.laplace(0, 1 / epsilon, (trials, d))),
        }
        # local: d yes/no questions with randomized response at epsilon/d each, vs one
        # report of the value with optimized unary encoding (OUE) at epsilon
        rr = BooleanParams.for_epsilon(epsilon / d)
        local_seq = np.stack([
            _rr_count_estimate(rr, _rr_counts(rr, int(c), n - int(c), trials, rng), n) for c in truth
        ], axis=1)
        oue = Oracle("OUE", epsilon, d)
        local_par = np.stack([oue.estimate(values, rng) for _ in range(trials)])
        for model, runs in (
            ("central", central),
            ("local", {"sequential": (seq_eps, local_seq), "parallel": ([epsilon], local_par)}),
        ):
            for kind, (budgets, estimates) in runs.items():
                spent = sequential(budgets) if kind == "sequential" else parallel(budgets)
                rows.append({
                    "model": model, "composition": kind, "bins": d, "n": n,
                    "epsilon_total": spent,
                    "rmse_per_bin": float(np.sqrt(np.mean((estimates - truth) ** 2))),
                })
    figure = new_figure(6.4, 3.4)
    axes = figure.subplots(1, 2)
    for axis, model in zip(axes, ("central", "local"), strict=True):
        for kind, color in (("sequential", "#D55E00"), ("parallel", "#0072B2")):
            sel = [r for r in rows if r["model"] == model and r["composition"] == kind]
            axis.loglog([r["bins"] for r in sel], [r["rmse_per_bin"] for r in sel], "o-",
                        color=color, label=kind)
        axis.set_xscale("log", base=2)
        axis.set_xticks(bins, labels=[str(d) for d in bins], minor=False)
        axis.set_xticks([], minor=True)
        axis.set(xlabel="number of bins d", ylabel="typical error per bin (RMSE)",
                 title=f"{model} model, total ε = {epsilon:g}")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2,
                  fontsize=7, frameon=False, title="composition", title_fontsize=7)
    notes = [
        f"n = {n} people, uniform over d bins, total budget epsilon = {epsilon} (the "
        "'epsilon_total' column is computed with veil.shared.privacy.sequential / parallel). "
        "Central: answering the d bin counts as d separate queries splits the budget (Laplace(d/ε) "
        "each, error grows like d); a histogram of disjoint bins costs ε once by parallel "
        "composition (Laplace(1/ε), flat). Local: d yes/no questions at ε/d each against one OUE "
        "report of the value at ε; splitting the budget makes the error grow roughly like d.",
    ]
    return Results("composition", "Sequential vs parallel composition for a histogram", rows,
                   {"composition": figure}, notes)


def variances(quick: bool = False, seed: int = 1) -> Results:
    """Empirical variance of GRR, SUE, OUE, OLH against Wang et al.'s closed forms."""
    rng = np.random.default_rng(seed)
    d, n = (16, 2000) if quick else (32, 10000)
    trials = 1000 if quick else 300
    epsilons = [1.0, 3.0] if quick else [0.5, 1.0, 2.0, 3.0, 4.0, 5.0]
    present = 3 * d // 4  # the last quarter of the domain has frequency zero
    probs = np.zeros(d)
    probs[:present] = np.arange(1, present + 1) ** -1.5
    counts = rng.multinomial(n, probs / probs.sum())
    values = np.repeat(np.arange(d), counts)
    zero = counts == 0
    rows: list[dict[str, Any]] = []
    for name in ORACLES:
        for epsilon in progress(epsilons, f"variances {name}"):
            oracle = Oracle(name, epsilon, d)
            estimates = np.stack([oracle.estimate(values, rng) for _ in range(trials)])
            empirical = estimates.var(axis=0, ddof=1)
            exact = oracle.exact_variance(counts)
            rows.append({
                "oracle": name, "epsilon": epsilon, "d": d, "n": n, "trials": trials,
                "closed_form": oracle.closed_form_variance(n),
                "empirical_zero_freq": float(empirical[zero].mean()),
                "ratio_zero_freq": float(empirical[zero].mean() / oracle.closed_form_variance(n)),
                "ratio_all_values": float(np.mean(empirical / exact)),
                "mean_bias_in_sd": float(np.max(np.abs(estimates.mean(axis=0) - counts)
                                                / np.sqrt(exact / trials))),
            })
    figure = new_figure(5.6, 3.8)
    axis = figure.subplots()
    for name in ORACLES:
        sel = [r for r in rows if r["oracle"] == name]
        eps = [r["epsilon"] for r in sel]
        axis.semilogy(eps, [r["closed_form"] / n for r in sel], "-", color=COLORS[name], label=name)
        axis.semilogy(eps, [r["empirical_zero_freq"] / n for r in sel], "o", color=COLORS[name])
    axis.set(xlabel="privacy parameter ε (smaller: more private)",
             ylabel="variance of a count estimate ÷ n",
             title=f"frequency oracles, {d} values, {n} people")
    axis.plot([], [], "-", color="0.4", label="formula")
    axis.plot([], [], "o", color="0.4", label="simulated")
    figure.legend(*axis.get_legend_handles_labels(), loc="outside right center", fontsize=8,
                  frameon=False)
    notes = [
        f"d = {d} values (Zipf 1.5 over the first {present}, the rest absent), n = {n} users, "
        f"{trials} independent rounds per point. Lines: Wang et al.'s closed forms "
        "(GRR n(d−2+e^ε)/(e^ε−1)², SUE n e^{ε/2}/(e^{ε/2}−1)², OUE and OLH n 4e^ε/(e^ε−1)²); "
        "dots: empirical variance of the count estimates of the absent values. 'ratio_all_values' "
        "compares every value with its exact variance (n_v p(1−p) + (n−n_v) q(1−q))/(p−q)²; OLH uses "
        "g = round(e^ε + 1) buckets, so its ratio to the closed form deviates slightly from 1.",
    ]
    return Results("variances", "Frequency oracles: empirical vs closed-form variance", rows,
                   {"variances": figure}, notes)


# ------------------------------------------------------------------ decoder-based experiments

#: google/rappor's regression configurations: (name, (p, q, f), extra candidates as a
#: fraction of the number of values, regex of true values left out of the candidates)
REGRESSION_CONFIGS = (
    ("typical", (0.39, 0.61, 0.45), 0.2, r"v[0-9]*9$"),
    ("sharp", (0.39, 0.61, 0.45), 0.0, None),
    ("loose", (0.225, 0.775, 0.0), 0.2, r"v[0-9]*9$"),
    ("over_x2", (0.39, 0.61, 0.45), 2.0, r"v[0-9]*9$"),
    ("over_x10", (0.39, 0.61, 0.45), 10.0, r"v[0-9]*9$"),
)


def simulate_counts(
    params: StringParams, population: Population, clients: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(true counts per value, reports per cohort, ones per cohort and bit)`` (fast path)."""
    hist = population.cohort_histogram(clients, params.m, rng)
    true_map = build_map(params, population.values, progress=False)
    reports, ones = string_counts_from_values(params, true_map, hist, rng)
    return hist.sum(axis=0), reports, ones


def decode_metrics(
    params: StringParams,
    population: Population,
    truth: np.ndarray,
    reports: np.ndarray,
    ones: np.ndarray,
    candidates: list[str],
) -> dict[str, float]:
    """Decode with the analysis and score it as google/rappor's regression test does.

    False negatives are true values (with clients) not reported, over their
    number; false positives are reported strings that no client holds, over
    the number of extra candidates; total variation is half the L1 distance
    between the true and estimated proportions; allocated mass is the sum of
    the estimated proportions.
    """
    from veil.server.analysis import StringDecoder

    start = time.perf_counter()
    decoder = StringDecoder(params, correction="bonferroni").fit(reports, ones, candidates)
    elapsed = time.perf_counter() - start
    total = truth.sum()
    actual = {value: count / total for value, count in zip(population.values, truth, strict=True)
              if count > 0}
    estimated = {row["string"]: row["proportion"] for row in decoder.result_.rows}
    extra = [c for c in candidates if c not in set(population.values)]
    false_pos = sum(1 for s in estimated if s not in actual)
    false_neg = sum(1 for s in actual if s not in estimated)
    keys = set(actual) | set(estimated)
    tv = 0.5 * sum(abs(actual.get(s, 0.0) - estimated.get(s, 0.0)) for s in keys)
    true_pos = len(estimated) - false_pos
    detected_true = [actual[s] for s in estimated if s in actual]
    return {
        "actual": len(actual), "detected": len(estimated), "false_pos": false_pos,
        "false_neg": false_neg,
        "fp_rate": false_pos / len(extra) if extra else math.nan,
        "fn_rate": false_neg / len(actual),
        "recall": true_pos / len(actual),
        "precision": true_pos / len(estimated) if estimated else math.nan,
        "total_variation": float(tv), "allocated_mass": float(sum(estimated.values())),
        "smallest_detected_share": min(detected_true) if detected_true else math.nan,
        "min_detectable_share": float(decoder.summary_["min_detectable_proportion"]),
        "decode_seconds": elapsed,
    }


def regression_candidates(population: Population, extra_fraction: float, drop: str | None) -> list[str]:
    """The true values minus those matching ``drop``, plus ``extra_fraction * n`` absent ones."""
    n = len(population)
    kept = [v for v in population.values if drop is None or not re.search(drop, v)]
    return kept + [f"v{i}" for i in range(n + 1, n + 1 + int(n * extra_fraction))]


def regression(quick: bool = False, seed: int = 1) -> Results:
    """google/rappor's regression matrix at the 'small' size: 5 distributions x 5 configurations."""
    rng = np.random.default_rng(seed)
    n_values, clients = 100, 100_000 if quick else 1_000_000
    rows: list[dict[str, Any]] = []
    cases = [(d, c) for d in DISTRIBUTIONS for c in REGRESSION_CONFIGS]
    for distribution, (config, (p, q, f), extra, drop) in progress(cases, "regression"):
        params = StringParams(k=8, h=2, m=128, p=p, q=q, f=f)
        population = Population.named(distribution, n_values)
        truth, reports, ones = simulate_counts(params, population, clients, rng)
        candidates = regression_candidates(population, extra, drop)
        rows.append({
            "distribution": distribution, "config": config, "values": n_values, "clients": clients,
            "candidates": len(candidates),
            **decode_metrics(params, population, truth, reports, ones, candidates),
        })
    figure = new_figure(6.8, 4.2)
    axes = figure.subplots(2, 2).ravel()
    configs = [c[0] for c in REGRESSION_CONFIGS]
    width = 0.16
    for axis, metric, label in zip(
        axes,
        ("fn_rate", "fp_rate", "total_variation", "allocated_mass"),
        ("share of true values missed", "share of absent candidates reported",
         "distance to the true shares (TVD)", "share of reports in detected strings"),
        strict=True,
    ):
        drawn = []
        for i, distribution in enumerate(DISTRIBUTIONS):
            values = [next(r[metric] for r in rows if r["distribution"] == distribution
                           and r["config"] == config) for config in configs]
            drawn += list(np.nan_to_num(values))
            axis.bar(np.arange(len(configs)) + (i - 2) * width, np.nan_to_num(values), width,
                     label=distribution)
        axis.set_xticks(np.arange(len(configs)), configs, fontsize=7)
        axis.set_title(label, fontsize=9)
        # shares start at 0; a panel of zeros says so instead of showing an empty axis
        axis.set_ylim(0, max(max(drawn) * 1.1, 0.05))
        if max(drawn) == 0:
            axis.text(0.5, 0.5, "0 in every case: no absent candidate\nwas reported "
                      "(Bonferroni, alpha 0.05)" if metric == "fp_rate" else "0 in every case",
                      transform=axis.transAxes, ha="center", va="center", fontsize=8)
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center",
                  ncol=len(DISTRIBUTIONS), fontsize=7, frameon=False, title="population",
                  title_fontsize=7)
    notes = [
        f"google/rappor's regression matrix at the 'small' size: {n_values} values, {clients} "
        "clients with one report each, k=8, h=2, m=128; typical/sharp/over: p=0.39, q=0.61, "
        "f=0.45; loose: p=0.225, q=0.775, f=0. Candidates: the true values minus those matching "
        "v[0-9]*9$ (all kept for 'sharp'), plus 0.2/0/0.2/2/10 times n absent ones. Counts are "
        "drawn with the exact per-cohort fast path; decoding uses veil.server.analysis's "
        "StringDecoder (Bonferroni, alpha 0.05). False-positive rate = reported absent strings / "
        "extra candidates (undefined for 'sharp'); false-negative rate = true values not reported / "
        "true values (the left-out tenth counts as missed, as in google/rappor).",
    ]
    return Results("regression", "google/rappor regression matrix (small)", rows,
                   {"regression": figure}, notes)


def detection(quick: bool = False, seed: int = 1) -> Results:
    """RAPPOR paper: recall and precision of detected strings as the number of reports grows."""
    rng = np.random.default_rng(seed)
    params = StringParams()  # k=128, h=2, m=64, p=0.5, q=0.75, f=0.5
    sizes = [10**4, 3 * 10**4, 10**5] if quick else sorted(
        [10**e for e in (4, 5, 6, 7)] + [3 * 10**e for e in (4, 5, 6)])
    populations = (("zipf1.5", 200 if quick else 1000), ("exp", 100))
    rows: list[dict[str, Any]] = []
    for distribution, n_values in populations:
        population = Population.named(distribution, n_values)
        candidates = list(population.values) + [
            f"v{i}" for i in range(n_values + 1, 2 * n_values + 1)]
        for n in progress(sizes, f"detection {distribution}"):
            truth, reports, ones = simulate_counts(params, population, n, rng)
            rows.append({
                "distribution": distribution, "reports": n, "values": n_values,
                "candidates": len(candidates),
                **decode_metrics(params, population, truth, reports, ones, candidates),
            })
    figure = new_figure(7.2, 3.2)
    axes = figure.subplots(1, 3)
    for (distribution, n_values), color in zip(populations, ("#0072B2", "#D55E00"), strict=True):
        sel = [r for r in rows if r["distribution"] == distribution]
        report_counts = [r["reports"] for r in sel]
        label = f"{distribution} ({n_values} values)"
        axes[0].semilogx(report_counts, [r["recall"] for r in sel], "o-", color=color,
                         label=f"recall, {label}")
        axes[0].semilogx(report_counts, [r["precision"] for r in sel], "s--", color=color,
                         mfc="none", label="precision")
        axes[1].loglog(report_counts, [max(r["detected"], 0.5) for r in sel], "o-", color=color,
                       label=label)
        axes[2].loglog(report_counts, [r["smallest_detected_share"] for r in sel], "o",
                       color=color, label=f"smallest detected, {distribution}")
        axes[2].loglog(report_counts, [r["min_detectable_share"] for r in sel], "-", color=color,
                       alpha=0.6, label="detectable (80% power)")
    axes[0].set(xlabel="number of reports", title="share of values found (recall)\nand of "
                "detections right (precision)", ylim=(0, 1.05))
    axes[1].set(xlabel="number of reports", title="strings detected")
    axes[2].set(xlabel="number of reports", title="smallest share detected")
    for axis in axes:
        axis.title.set_fontsize(9)
    handles, labels = axes[0].get_legend_handles_labels()
    more, more_labels = axes[2].get_legend_handles_labels()
    figure.legend([*handles, *more], [*labels, *more_labels], loc="outside lower center",
                  ncol=4, fontsize=6, frameon=False)
    notes = [
        f"RAPPOR's default parameters (k=128, h=2, m=64, p=0.5, q=0.75, f=0.5; epsilon_inf = "
        f"{params.epsilon_inf:.2f}, epsilon_1 = {params.epsilon_1:.2f}), one report per client, "
        "twice as many candidates as true values (half absent), Bonferroni at 0.05. Recall = "
        "share of the values held by at least one client that are detected; precision = share "
        "of detections that are true. A value is detected once its share exceeds a few standard "
        "errors, which shrink like 1/sqrt(N): the smallest detected share and the decoder's "
        "stated detectable share (80% power) fall together, and the detected set grows with N "
        "while precision stays at 1. Long tails stay invisible: recall over all values is low.",
    ]
    return Results("detection", "Detection against the number of reports (RAPPOR paper)", rows,
                   {"detection": figure}, notes)


EXPERIMENTS: dict[str, tuple[str, Callable[..., Results]]] = {
    "regression": ("google/rappor regression matrix (5 distributions x 5 configs)", regression),
    "detection": ("recall and precision of detected strings against N", detection),
    "rr-vs-laplace": ("randomized response vs central Laplace for a count", rr_vs_laplace),
    "laplace-mean": ("local Laplace mean of heights with sampled sensitivity", laplace_mean),
    "composition": ("sequential vs parallel composition for a histogram", composition),
    "variances": ("GRR/SUE/OUE/OLH variance vs Wang et al.'s closed forms", variances),
    "oracles": ("the shipped category oracles' variance against their formulas", oracles),
    "strings": ("Bloom RAPPOR, FLH and HCMS string oracles: total variation over epsilon "
                "and N", strings),
    "calibration": ("stated standard errors and 95% coverage of every closed-form decoder "
                    "over N x epsilon", calibration),
    "association": ("one joint report vs the split budget with EM vs independence, over "
                    "epsilon and N", association),
    "marginals": ("every pairwise table of 8 variables from assigned marginals (CALM) vs "
                  "independence, over epsilon and N", marginals),
}


def run_experiment(name: str, quick: bool = False, seed: int = 1) -> Results:
    """Run the named experiment and time it."""
    start = time.perf_counter()
    results = EXPERIMENTS[name][1](quick=quick, seed=seed)
    results.elapsed = time.perf_counter() - start
    return results
