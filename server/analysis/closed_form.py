"""Closed-form unbiased estimators for categories, booleans and bounded numbers.

Each takes the validated counts (:class:`~veil.server.counts.CountsArrays`)
and returns a :class:`~veil.server.analysis.results.DecodeResult`. Standard
errors are for the population share (or mean): they treat reports as independent
draws from the population, one per installation, the same model as the string
decoder and the frequency oracles (docs/analysis.md, "What the error bars mean").

* Categories (basic RAPPOR, one bit per category): the share with category
  ``i`` is ``(c_i / N - p*) / (q* - p*)``, variance ``rho (1 - rho) / (N (q* - p*)^2)``
  with ``rho = c_i / N`` (smoothed, clipped to ``[p*, q*]``). The shares' sum (truth 1)
  is ``(sum_i K_i / N - d p*) / (q* - p*)`` with ``K_i`` the set bits of report ``i``,
  independent given the value, so its variance is
  ``(q* (1 - q*) + (d - 1) p* (1 - p*)) / (N (q* - p*)^2)``, covariances included.
* Booleans (Warner): with ``P(yes | false) = y0`` and ``P(yes | true) = y1``,
  ``share_true = (mean - y0) / (y1 - y0)``, variance ``mean (1 - mean) / (N (y1 - y0)^2)``.
* Numbers, laplace/gaussian: the mean of the reports (the noise has mean zero),
  standard error ``sqrt(s^2 / N)`` from the empirical variance of the reports.
* Numbers, 1bitmean: ``E[bit] = (N0 + t (Ns - N0)) / 2^32`` for the mean grid
  position ``t`` in [0, 1], inverted and mapped to ``[low, high]``.

Every estimate is unbiased, so a share near 0 or 1 can read outside [0, 1] by sampling
noise (at any N for a share of exactly 0). The tables keep such shares unbiased (their
intervals are clipped to [0, 1]) and the summary's ``note`` names them; summary shares
are shown clipped, with the unbiased value kept beside them.

:func:`start_decode`, :func:`require_reports`, :func:`sample_summary`,
:func:`base_summary` and :func:`category_shares_result` are the steps these decoders share with the frequency
oracles' (:mod:`veil.server.analysis.oracles`).
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import numpy as np

from veil.server.analysis.cost import privacy_cost
from veil.server.analysis.decoders import DEFAULT_OPTIONS, ESTIMATORS, DecodeOptions, decodes
from veil.server.analysis.ibu import AffineChannel, IbuEstimate, estimate, with_ibu_shares
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import check_level, z_quantile
from veil.server.analysis.tables import RESULT_COLUMNS, frequency_rows, number_row
from veil.server.counts import CountsArrays
from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError
from veil.shared.kinds import BooleanParams, CategoryParams, MechanismParams, NumberParams

P = TypeVar("P", bound=MechanismParams)


def require_reports(counts: CountsArrays, minimum: int = 1) -> int:
    """The number of reports, at least ``minimum``; :class:`ParameterError` otherwise."""
    total = counts.total_reports
    if total < minimum:
        what = "no reports" if total == 0 else f"only {total} report(s)"
        raise ParameterError(
            "counts",
            f"{counts.source}: metric {counts.metric or '(unnamed)'} has {what}; "
            f"need at least {minimum} to estimate",
        )
    return total


def _outside_note(labels: list[str], shares: np.ndarray, std_errors: np.ndarray) -> str | None:
    """A note naming the unbiased shares that sampling noise put outside [0, 1], if any."""
    outside = [
        f"{label!r} {share:.3g} (std error {se:.2g})"
        for label, share, se in zip(labels, shares, std_errors, strict=True)
        if not 0.0 <= share <= 1.0
    ]
    if not outside:
        return None
    return (
        f"unbiased share(s) outside [0, 1] by sampling noise: {', '.join(outside)}; the table "
        "keeps them unbiased for averaging over runs; the true shares lie in [0, 1], to which "
        "the intervals are clipped"
    )


def start_decode(
    counts: CountsArrays, options: DecodeOptions, params_type: type[P], decoder: str,
    estimators: tuple[str, ...] = ESTIMATORS,
) -> tuple[float, float, P]:
    """Start time, checked confidence level and parameters (``params_type``, else a
    :class:`ParameterError` naming ``decoder``) of a closed-form decode, whose estimators
    are ``estimators`` (another is refused by name)."""
    started = time.perf_counter()
    if options.estimator not in estimators:
        raise ParameterError(
            "estimator", f"{counts.params.kind} metrics have the {' and '.join(estimators)} "
                         f"estimator only (got {options.estimator!r}); ibu is for category "
                         "and string metrics")
    confidence = check_level(options.confidence, "confidence")
    params = counts.params
    if not isinstance(params, params_type):
        raise ParameterError("params", f"{decoder} needs {params_type.__name__}")
    return started, confidence, params


def sample_summary(counts: CountsArrays) -> dict[str, Any]:
    """What every decoder says about its sample: the metric, its reports and the days
    they cover (``start`` and ``end`` the first and last day with reports, when known)."""
    summary: dict[str, Any] = {
        "kind": counts.params.kind,
        "metric": counts.metric,
        "reports": counts.total_reports,
        "start": counts.start,
        "end": counts.end,
        "days_with_reports": None if counts.days is None else len(counts.days),
    }
    if counts.description:
        summary["description"] = counts.description
    return summary


def base_summary(counts: CountsArrays, started: float, confidence: float) -> dict[str, Any]:
    """The summary keys every closed-form decoder states: the sample, the parameters and
    their privacy cost (over the parameters' ``possible_values``, see
    :func:`~veil.server.analysis.cost.privacy_cost`), and the time since ``started``."""
    params = counts.params
    return {
        **sample_summary(counts),
        "confidence": confidence,
        "params": params.to_dict(),
        "epsilon_1": params.epsilon_1,
        "epsilon_inf": params.epsilon_inf,
        "privacy": privacy_cost(params, *params.possible_values),
        "elapsed_seconds": time.perf_counter() - started,
    }


@decodes(CategoryParams)
def decode_category(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Share of reports in each category, with standard errors and intervals."""
    started, confidence, params = start_decode(counts, options, CategoryParams, "decode_category")
    total = require_reports(counts)
    params.check_informative(about="the categories")
    p_star, q_star = params.effective_probs
    spread = q_star - p_star
    ones = counts.ones.reshape(-1).astype(float)
    share = (ones / total - p_star) / spread
    rho = np.clip((ones + 0.5) / (total + 1.0), p_star, q_star)
    se = np.sqrt(rho * (1 - rho) / (total * spread**2))
    set_bits_variance = q_star * (1 - q_star) + (share.size - 1) * p_star * (1 - p_star)
    summary = base_summary(counts, started, confidence)
    found = None
    if options.estimator == "ibu":
        channel = AffineChannel.identity(share.size, p_star, q_star, total)
        found = estimate(channel, ones, share, se, confidence)
    return category_shares_result(counts, list(params.categories), share, se, confidence,
                                  summary, {"p_star": p_star, "q_star": q_star},
                                  "category shares", set_bits_variance / (total * spread**2),
                                  found)


#: how far a sum of shares may pass 0 or 1 by floating-point rounding alone (GRR's, exactly 1,
#: came out as 1.0000000000000002) before the summary notes it clipped
SUM_ROUNDING = 1e-12


def category_shares_result(counts: CountsArrays, labels: list[str], share: np.ndarray,
                           se: np.ndarray, confidence: float, summary: dict[str, Any],
                           details: dict[str, Any], description: str,
                           allocated_variance: float,
                           found: IbuEstimate | None = None) -> DecodeResult:
    """The result of a category decoder: a row per category, the allocated share (whose
    estimate has variance ``allocated_variance``: the shares' covariances make it differ
    from the sum of their variances), ``details`` and the notes on shares that sampling
    noise put outside [0, 1]. With ``found`` (the ``ibu`` estimator) the rows show IBU's
    shares and bootstrap intervals (the p-values still test the unbiased shares)."""
    rows = frequency_rows(counts.metric, "category", labels, share, se, counts.total_reports,
                          z_quantile(confidence))
    if found is not None:
        rows = with_ibu_shares(rows, found, counts.total_reports)
        summary.update(found.summary_fields())
        details = {**details, "shares_unbiased": [float(value) for value in share]}
        share = found.fit.shares
    allocated = float(share.sum())
    summary.update(
        {
            "categories": len(labels),
            "allocated_proportion": float(np.clip(allocated, 0.0, 1.0)),
            "allocated_proportion_unbiased": allocated,
            "allocated_proportion_std_error": float(np.sqrt(allocated_variance)),
            **details,
        }
    )
    outside = None if found is not None else _outside_note(labels, share, se)
    notes = [outside] if outside else []
    if not -SUM_ROUNDING <= allocated <= 1.0 + SUM_ROUNDING:
        notes.append(f"allocated_proportion shows the unbiased sum of shares {allocated:.4g} "
                     "clipped to [0, 1]; allocated_proportion_unbiased keeps it")
    if notes:
        summary["note"] = "; ".join(notes)
    return DecodeResult("category", RESULT_COLUMNS, rows, summary,
                        f"{len(rows)} {description}")


@decodes(BooleanParams)
def decode_boolean(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Share of true answers (and of false ones), Warner's estimator."""
    started, confidence, params = start_decode(counts, options, BooleanParams, "decode_boolean",
                                               ("unbiased",))
    total = require_reports(counts)
    yes_if_false, yes_if_true = params.yes_probs
    spread = yes_if_true - yes_if_false
    if not spread > 0:
        raise ParameterError("alpha", "with alpha=0 the answers carry no information; use alpha > 0")
    mean = float(counts.ones[0]) / total
    share_true = (mean - yes_if_false) / spread
    se = float(np.sqrt(mean * (1 - mean) / (total * spread**2)))
    share = np.array([share_true, 1 - share_true])
    std_errors = np.array([se, se])
    rows = frequency_rows(counts.metric, "boolean", ["true", "false"], share, std_errors, total,
                          z_quantile(confidence))
    summary = base_summary(counts, started, confidence)
    summary.update({"yes_share": mean, "yes_if_false": yes_if_false, "yes_if_true": yes_if_true})
    note = _outside_note(["true", "false"], share, std_errors)
    if note:
        summary["note"] = note
    return DecodeResult("boolean", RESULT_COLUMNS, rows, summary,
                        f"true share {share_true:.4g} \u00b1 {se:.3g} (standard error)",
                        chart="share")


@decodes(NumberParams)
def decode_number(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Mean of the (clipped, grid-rounded) values, with standard error and interval."""
    started, confidence, params = start_decode(counts, options, NumberParams, "decode_number",
                                               ("unbiased",))
    z = z_quantile(confidence)
    width = params.high - params.low
    if params.mechanism == "1bitmean":
        total = require_reports(counts)
        low_num, high_num = params.one_bit_numerator(0), params.one_bit_numerator(params.resolution)
        spread = (high_num - low_num) / PROB_ONE
        if not spread > 0:
            raise ParameterError(
                "epsilon",
                f"1bitmean with epsilon={params.epsilon!r} reports the same bit probability "
                "for every value, so the reports carry no information; use epsilon >= 1e-8",
            )
        share = float(counts.ones[0]) / total
        position = (share - low_num / PROB_ONE) / spread
        mean = params.low + width * position
        se = width * float(np.sqrt(share * (1 - share) / total)) / spread
        details = {"one_share": share, "noise_variance": None}
    else:
        total = require_reports(counts, 2)
        sum_, sum_sq = float(counts.sums[0]), float(counts.sum_squares[0])
        mean = sum_ / total
        variance = max(sum_sq - sum_ * mean, 0.0) / (total - 1)
        se = float(np.sqrt(variance / total))
        details = {"report_variance": variance, "noise_variance": params.noise_variance()}
    # The true mean lies in [low, high], so intersecting the interval with it keeps its
    # coverage; the estimate itself stays unclipped (clipping would bias it).
    row = number_row(counts.metric, "mean", mean, se, z, params.low, params.high)
    summary = base_summary(counts, started, confidence)
    summary.update(details)
    if not params.low - z * se <= mean <= params.high + z * se:
        summary["warning"] = (
            f"the mean estimate {mean:.6g} lies outside [{params.low:g}, {params.high:g}] by more "
            "than its interval: honest reports make this unlikely; look for forged reports"
        )
    summary.update({"mechanism": params.mechanism, "low": params.low, "high": params.high})
    return DecodeResult("number", RESULT_COLUMNS, [row], summary,
                        f"mean {mean:.6g} \u00b1 {se:.3g} (standard error)", chart="range")
