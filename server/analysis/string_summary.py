"""The string decoder's summary: the sample, the fit's quality, the detection limit, and
the share of reports the table leaves out (the missing share), with the notes and the
warning that say how to read them.

:class:`~veil.server.analysis.strings.StringDecoder` hands what its fit found over as a
:class:`StringFit`; :func:`fit_summary` turns it into ``summary.json``'s figures and
:func:`description` into the one line a command prints. docs/analysis.md describes every
figure.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.cost import privacy_cost
from veil.server.analysis.selection import LeastSquares, WhitenedSystem
from veil.server.analysis.stats import chi2_sf, detection_z, z_quantile
from veil.server.analysis.tables import confidence_label
from veil.shared.kinds import StringParams

#: power at which the summary states the smallest detectable share
DETECTION_POWER = 0.8


@dataclasses.dataclass(frozen=True)
class Settings:
    """The checked test settings of one fit."""

    correction: str
    alpha: float
    confidence: float


@dataclasses.dataclass(frozen=True)
class StringFit:
    """What one fit of the string decoder leaves for its summary: the counts (``reports``
    per cohort) and ``candidate_map``, the equations the fit used (``system``) and its
    ``solution``; per candidate the ``proportions``, ``std_errors`` (in reports) and
    ``detected`` mask; per cohort and bit the unbiased ``bit_shares``; the equations left
    out (``excluded``) with the share of reports they hold (``excluded_share`` and its
    standard error); whether a ``background`` column was fitted; and the Lasso's
    selection, when the fit took that path."""

    params: StringParams
    settings: Settings
    reports: np.ndarray
    candidate_map: sp.csc_matrix
    system: WhitenedSystem
    solution: LeastSquares
    proportions: np.ndarray
    std_errors: np.ndarray
    detected: np.ndarray
    bit_shares: np.ndarray
    excluded: np.ndarray
    excluded_share: float
    excluded_share_se: float
    background: bool
    lasso_selected: int | None
    selection_z: float | None


def fit_summary(fit: StringFit, started: float) -> dict[str, Any]:
    """Sample, fit quality, the detection limit and the privacy cost of the fit (``started``:
    when the decode began, by :func:`time.perf_counter`)."""
    params, settings, solution = fit.params, fit.settings, fit.solution
    total = int(fit.reports.sum())
    # unbiased, so at small N it can leave [0, 1]; shown clipped, with a note
    missing, missing_se = missing_share(fit) if fit.background else (None, None)
    allocated = float(fit.proportions[fit.detected].sum())
    shown_allocated = float(np.clip(allocated, 0.0, 1.0))  # as allocated_fields shows it
    p_star, q_star = params.effective_probs
    summary: dict[str, Any] = {
        "kind": "string",
        "reports": total,
        "cohorts": params.m,
        "cohorts_with_reports": int(np.count_nonzero(fit.reports)),
        "equations": fit.system.equations,
        "candidates": len(fit.proportions),
        "candidates_unusable": int(np.count_nonzero(~(fit.system.lone_norms > 0))),
        "lasso_selected": fit.lasso_selected,
        "selection_z": fit.selection_z,
        "detected": int(np.count_nonzero(fit.detected)),
        "fit": solution.method,
        "dispersion": solution.dispersion,
        "correction": settings.correction,
        "alpha": settings.alpha,
        "confidence": settings.confidence,
        **allocated_fields(allocated, total),
        **missing_fields(missing, missing_se, shown_allocated, settings.confidence),
        **_fit_quality(fit),
        **_detection_limit(fit, total),
        "p_star": p_star,
        "q_star": q_star,
        "params": params.to_dict(),
        "epsilon_1": params.epsilon_1,
        "epsilon_inf": params.epsilon_inf,
        "privacy": privacy_cost(params, *params.possible_values),
        "elapsed_seconds": time.perf_counter() - started,
    }
    _add_notes(summary, fit, allocated, missing, missing_se)
    return summary


def _fit_quality(fit: StringFit) -> dict[str, Any]:
    """How much of the reports' signal the detected strings and the missing values explain,
    the variance left unexplained, the equations left out and the residual test."""
    system, solution = fit.system, fit.solution
    total_ss = system.chi2(system.y)
    residual_ss = solution.residual_ss
    dof = max(solution.dof, 1)
    explained_ss = max(total_ss - residual_ss, 0.0)
    unexplained_ss = max(residual_ss - dof, 0.0)
    mass = bit_mass(fit)
    return {
        "signal_explained_by_detected": _ratio(mass["detected"], mass["total"]),
        "signal_attributed_to_missing": _ratio(mass["missing"], mass["total"]),
        "unexplained_variance_fraction": _ratio(unexplained_ss, explained_ss + unexplained_ss),
        "explained_variance": explained_ss,
        "unexplained_variance": unexplained_ss,
        "noise_variance": float(dof),
        "equations_excluded": int(np.count_nonzero(fit.excluded)),
        "excluded_share": fit.excluded_share,
        "residual_chi2": residual_ss,
        "residual_dof": dof,
        "residual_p_value": chi2_sf(residual_ss, dof),
        "noise_sd_per_bit_share": float(np.median(1.0 / system.weight[system.weight > 0])),
    }


def _detection_limit(fit: StringFit, total: int) -> dict[str, Any]:
    """A lone string's standard error, a candidate's in this fit, and the smallest share
    detected with :data:`DETECTION_POWER` under the correction."""
    settings, solution = fit.settings, fit.solution
    norms = fit.system.lone_norms
    usable = norms > 0
    lone_se = float(np.median(1.0 / norms[usable])) if usable.any() else float("inf")
    # the standard error a candidate gets in this fit: the joint fit's own, or a lone
    # string's widened by the dispersion
    typical_se = (
        float(np.median(fit.std_errors[solution.columns])) / total
        if solution.method == "joint"
        else lone_se * float(np.sqrt(solution.dispersion))
    )
    return {"std_error_lone_string": lone_se,
            **detection_fields(typical_se, total, settings.alpha, settings.correction,
                               len(fit.proportions))}


def allocated_fields(allocated: float, total: int) -> dict[str, Any]:
    """The detected strings' share: unbiased (it may leave [0, 1] at small N), and shown
    clipped to [0, 1] as a share and as reports out of ``total``."""
    shown = float(np.clip(allocated, 0.0, 1.0))
    return {"allocated_proportion": shown, "allocated_proportion_unbiased": allocated,
            "allocated_reports": shown * total}


def detection_fields(typical_se: float, total: int, alpha: float, correction: str,
                     candidates: int) -> dict[str, Any]:
    """A candidate's typical standard error and the smallest share (and reports out of
    ``total``) detected with :data:`DETECTION_POWER` among ``candidates`` at ``alpha`` under
    ``correction``."""
    limit = min(detection_z(alpha, correction, candidates, DETECTION_POWER) * typical_se, 1.0)
    return {"std_error_typical": typical_se, "min_detectable_proportion": limit,
            "min_detectable_reports": limit * total, "detection_power": DETECTION_POWER}


def _add_notes(summary: dict[str, Any], fit: StringFit, allocated: float,
               missing: float | None, missing_se: float | None) -> None:
    """The summary's ``note`` (shares that sampling noise pushed out of range, equations
    left out) and ``warning`` (values missing from the list that hold a detectable share)."""
    notes = []
    shown_allocated = summary["allocated_proportion"]
    if not allocated <= 1.0:
        notes.append(
            f"the detected strings' unbiased shares add up to {allocated:.3g}, above 1 by "
            "sampling noise; allocated_proportion shows it clipped, "
            "allocated_proportion_unbiased keeps it"
        )
    if missing is not None and not 0.0 <= missing <= 1.0 - shown_allocated:
        notes.append(
            f"the missing share's unbiased estimate {missing:.3g} (std error "
            f"{missing_se:.2g}) lies outside [0, {1.0 - shown_allocated:.3g}] (1 less the "
            "allocated share) by sampling noise; read its interval "
            f"[{summary['missing_proportion_low']:.3g}, "
            f"{summary['missing_proportion_high']:.3g}], not the point; "
            "missing_proportion_clipped is the estimate moved into that range"
        )
    if fit.excluded.any():
        excluded = summary["equations_excluded"]
        message = (
            f"{excluded:,} of {fit.system.equations + excluded:,} (cohort, bit) counts read far "
            "above what the candidates and the background explain: values missing from "
            f"the candidate list carry about {fit.excluded_share:.2%} of the reports in "
            "them. They were left out of the fit, so that they cannot pass for listed "
            "strings that share their bits"
        )
        if fit.excluded_share >= summary["min_detectable_proportion"]:  # as a detection
            summary["warning"] = (
                f"{message}; find the missing values with veil discover (a discovery "
                "channel) or add them to the candidates"
            )
        else:
            notes.append(message)
    if notes:
        summary["note"] = "; ".join(notes)


def missing_share(fit: StringFit) -> tuple[float, float]:
    """The share of reports whose values are not in the table, with its standard error.

    The background share per bit times ``scale`` (bits per share of values) counts the
    values not listed, and the excluded share those whose bits were left out of the fit;
    the joint fit also estimates every listed candidate, so the ones not detected are
    added (with their covariances, and the background's covariance with them:
    ``-loading' C``). On the Lasso path the background already holds the candidates left
    out of the selection.
    """
    solution = fit.solution
    scale = fit.params.k / fit.params.bits_per_value
    missing = solution.background_share * scale + fit.excluded_share
    variance = solution.background_variance * scale**2 + fit.excluded_share_se**2
    if solution.method == "joint" and solution.background_covariance is not None:
        rest = ~fit.detected[solution.columns]
        cov = solution.covariance
        missing += float(solution.theta[rest].sum())
        variance += float(cov[np.ix_(rest, rest)].sum())
        variance += 2 * scale * float(solution.background_covariance[rest].sum())
    return missing, float(np.sqrt(max(variance, 0.0)))


def bit_mass(fit: StringFit) -> dict[str, float]:
    """Reports' set bits in all, explained by the detected strings, and by the values
    missing from the table (the background and the bits left out of the fit)."""
    params, candidate_map = fit.params, fit.candidate_map
    found = np.flatnonzero(fit.detected)
    row_reports = np.repeat(fit.reports.astype(float), params.k)
    strings_share = (
        candidate_map[:, found] @ fit.proportions[found] if found.size
        else np.zeros(candidate_map.shape[0])
    )
    return {
        "total": float(row_reports @ fit.bit_shares.ravel()),
        "detected": float(row_reports @ strings_share),
        "missing": float(
            (fit.solution.background_share
             + fit.excluded_share * params.bits_per_value / params.k)
            * row_reports.sum()
        ),
    }


def missing_fields(
    missing: float | None, missing_se: float | None, allocated: float, confidence: float
) -> dict[str, float | None]:
    """The summary's missing share: the unbiased estimate with its standard error and its
    interval (within [0, 1], where the truth lies), and the estimate clipped to
    ``[0, 1 - allocated]`` as a separate figure.

    The estimate is shown unclipped because clipping it to what the detected strings leave
    biased it low (docs/analysis.md, "What the string decoder guarantees", Small N, gives
    the measured totals). Its interval says what the data can defend; at small N it spans
    most of [0, 1]."""
    if missing is None or missing_se is None:
        return {key: None for key in (
            "missing_proportion", "missing_proportion_unbiased", "missing_proportion_std_error",
            "missing_proportion_low", "missing_proportion_high", "missing_proportion_clipped")}
    half = z_quantile(confidence) * missing_se
    return {
        "missing_proportion": float(missing),
        "missing_proportion_unbiased": float(missing),
        "missing_proportion_std_error": float(missing_se),
        "missing_proportion_low": float(np.clip(missing - half, 0.0, 1.0)),
        "missing_proportion_high": float(np.clip(missing + half, 0.0, 1.0)),
        "missing_proportion_clipped": float(np.clip(missing, 0.0, 1.0 - allocated)),
    }


def description(summary: dict[str, Any]) -> str:
    """The one-line summary: detections, their share, and the share not in the table with
    its interval (what the reader can conclude about it)."""
    text = (
        f"{summary['detected']:,} of {summary['candidates']:,} candidates detected "
        f"({summary['allocated_proportion']:.1%} of reports)"
    )
    if summary["missing_proportion"] is None:
        return text
    low, high = summary["missing_proportion_low"], summary["missing_proportion_high"]
    text += (
        f"; not in the table: {summary['missing_proportion']:.1%} "
        f"({confidence_label(summary['confidence'])}% interval {low:.1%} to {high:.1%})"
    )
    if high - low > 0.5:
        text += ": too few reports to say how much of the population the table leaves out"
    return text


def _ratio(part: float, whole: float) -> float | None:
    """``part / whole`` as a fraction in [0, 1] (noise can push unbiased parts past the
    whole at small N), or ``None`` when there is no positive whole to divide."""
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else None
