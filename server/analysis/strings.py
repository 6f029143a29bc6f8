"""Decode Bloom-filter RAPPOR counts into string frequencies with honest error bars.

The pipeline, with the variance of the mechanism known at every step:

1. Unbiased bit estimates. In cohort ``j`` with ``N_j`` reports and ``c_ij``
   reported ones for bit ``i``, ``y_ij = (c_ij / N_j - p*) / (q* - p*)`` is an
   unbiased estimate of the share of the cohort's reports whose Bloom bit ``i``
   is set. Each report's bit is an independent Bernoulli(``rho_ij``) draw with
   ``rho_ij = p* + (q* - p*) E[y_ij]``, so ``Var(y_ij) = rho_ij (1 - rho_ij) /
   (N_j (q* - p*)^2)``, with ``rho_ij`` estimated from the counts (smoothed as
   ``(c + 1/2) / (N + 1)`` and clipped to ``[p*, q*]``). Cohorts without reports
   give no equations.
2. Whitened regression. ``y = X theta + e`` where ``X`` is the candidate map and
   ``theta`` the share of reports carrying each candidate; every row is divided
   by its standard deviation at one rate pooled over all bits, so that the noise
   has about unit variance and the weights do not depend on the count they weigh
   (weighted least squares with the known weights, :func:`model_variances`;
   weights from each count's own rate biased the background). An optional
   *background* column (the same share in every bit) stands for the values that are not in the candidate list:
   their Bloom bits land in effectively random places. Its share is left free
   (it may come out slightly negative) so that estimates stay unbiased when the
   list misses nothing.
3. Selection: non-negative Lasso (scikit-learn, CSC input) on unit-norm columns
   with the penalty at the z-score a lone string needs under the correction
   (Bonferroni: ``alpha / n_candidates``), so a candidate with no signal enters
   only with about that probability (:func:`~veil.server.analysis.selection.lasso_select`).
4. Estimates: non-negative least squares (SciPy) on the selection, standard
   errors from ``(X' W X)^-1``, one-sided z-tests, the chosen multiple-testing
   correction over all candidates, and refits until every reported string is
   significant (:mod:`veil.server.analysis.selection`). Equations that read far
   above the fit (the bits of a common value missing from the list) are left out
   and the fit repeats (:meth:`StringDecoder._select`).

:class:`StringDecoder` runs these steps as the stages of :meth:`~StringDecoder.fit`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.candidate_map import remembered_map
from veil.server.analysis.closed_form import sample_summary
from veil.server.analysis.cost import privacy_cost
from veil.server.analysis.counts import CountsArrays
from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.results import STRING_COLUMNS, DecodeResult, frequency_rows
from veil.server.analysis.selection import (
    MAX_REFITS,
    LeastSquares,
    WhitenedSystem,
    joint_fit,
    lasso_select,
    refit_with_additions,
)
from veil.server.analysis.stats import (
    adjust_p_values,
    check_correction,
    check_level,
    chi2_sf,
    critical_z,
    normal_isf,
    one_sided_p_values,
    z_quantile,
)
from veil.shared.errors import ParameterError
from veil.shared.kinds import MechanismParams, StringParams

#: power at which :attr:`StringDecoder.summary_` states the smallest detectable share
DETECTION_POWER = 0.8
#: the share of fits of a list that misses nothing in which noise alone would leave out
#: an equation (:meth:`StringDecoder._select`)
OUTLIER_RATE = 0.01


def bit_estimates(
    params: StringParams, reports: np.ndarray, ones: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased shares of set Bloom bits per cohort and their variances, both ``(m, k)``.

    Entries of cohorts without reports are 0 with infinite variance.
    """
    p_star, q_star = params.effective_probs
    spread = q_star - p_star
    reports = np.asarray(reports, dtype=float)[:, None]
    ones = np.asarray(ones, dtype=float)
    active = reports > 0
    safe = np.where(active, reports, 1.0)
    share = np.where(active, (ones / safe - p_star) / spread, 0.0)
    rho = np.clip((ones + 0.5) / (safe + 1.0), p_star, q_star)
    variance = np.where(active, rho * (1 - rho) / (safe * spread**2), np.inf)
    return share, np.broadcast_to(variance, share.shape).copy()


def model_variances(params: StringParams, reports: np.ndarray, ones: np.ndarray) -> np.ndarray:
    """Variances of the bit shares used to weigh the regression, shape ``(m, k)``.

    ``rho (1 - rho) / (N_j (q* - p*)^2)`` with one pooled rate ``rho`` (all reported
    ones over all reported bits, clipped to ``[p*, q*]``), so that the weights depend on
    the cohort sizes only, not on the counts they weigh. Weights from each count's own
    rate (as :func:`bit_estimates` states it) give bits that read high a smaller variance
    and more weight: with ``p*, q* > 1/2`` that biased the background share upwards (the
    missing share by +2.1 at 1,500 reports with k=128, m=64). The pooled rate is within
    ``[p*, q*]`` like every bit's, so the weights are off by at most
    ``max rho(1-rho) / min rho(1-rho)`` over that range (about 14% at p=0.5, q=0.75,
    f=0.5), which costs little efficiency and leaves the estimates unbiased.
    Entries of cohorts without reports are infinite.
    """
    p_star, q_star = params.effective_probs
    reports = np.asarray(reports, dtype=float)
    rho = float(np.clip((np.sum(ones) + 0.5) / (reports.sum() * params.k + 1.0), p_star, q_star))
    safe = np.where(reports > 0, reports, 1.0)
    per_cohort = np.where(reports > 0, rho * (1 - rho) / (safe * (q_star - p_star) ** 2), np.inf)
    return np.broadcast_to(per_cohort[:, None], (params.m, params.k)).copy()


def _string_params(params: MechanismParams) -> StringParams:
    """``params`` if they are a string metric's; a :class:`ParameterError` otherwise."""
    if not isinstance(params, StringParams):
        raise ParameterError("params", "StringDecoder needs StringParams (k, h, m, p, q, f)")
    return params


def _check_counts(
    params: MechanismParams, reports: Any, ones: Any, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Validation: whole, consistent counts of the shape ``params`` say, as int64 arrays."""
    params = _string_params(params)
    reports = np.asarray(reports)
    ones = np.asarray(ones)
    if reports.shape != (params.m,):
        raise ParameterError(
            "counts",
            f"{source}: has {reports.size} cohort row(s) but params say m={params.m} cohorts",
        )
    if ones.shape != (params.m, params.k):
        raise ParameterError(
            "counts",
            f"{source}: bit counts have shape {ones.shape}; params say "
            f"(m, k) = ({params.m}, {params.k})",
        )
    whole = reports.dtype.kind in "iu" and ones.dtype.kind in "iu"
    if not whole and not (np.all(np.mod(reports, 1) == 0) and np.all(np.mod(ones, 1) == 0)):
        raise ParameterError("counts", f"{source}: counts must be whole numbers")
    reports = reports.astype(np.int64)
    ones = ones.astype(np.int64)
    if np.any(reports < 0) or np.any(ones < 0):
        raise ParameterError("counts", f"{source}: counts must not be negative")
    bad = np.argwhere(ones > reports[:, None])
    if bad.size:
        j, i = bad[0]
        raise ParameterError(
            "counts",
            f"{source}: cohort {j} bit {i} has {ones[j, i]} ones but only {reports[j]} reports",
        )
    if reports.sum() == 0:
        raise ParameterError("counts", f"{source}: there are no reports to decode (all cohorts are empty)")
    p_star, q_star = params.effective_probs
    if not q_star > p_star:
        raise ParameterError(
            "f",
            f"with f={params.f} every reported bit is a coin flip (p* = q* = {p_star:.4g}): "
            "the reports carry no information about the values; use f < 1",
        )
    return reports, ones


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The checked test settings of one fit."""

    correction: str
    alpha: float
    confidence: float


class StringDecoder:
    """Estimate how many reports carry each candidate string.

    Parameters are stored as given and checked in :meth:`fit` (scikit-learn's
    convention). ``correction`` is ``"storey"`` (the default: false discovery
    rate ``alpha`` by Benjamini-Hochberg adapted to the estimated share of absent
    candidates), ``"bh"`` (Benjamini-Hochberg), ``"bonferroni"`` (family-wise
    error rate ``alpha``) or ``"none"``; ``confidence`` sets the intervals;
    ``background`` adds the column for values missing from the candidate list.

    Candidates are fitted jointly (every one tested against all others, exact
    p-values) when the equations afford it, otherwise selected by a Lasso first
    (``summary_["fit"]`` says which; :mod:`veil.server.analysis.selection`).

    After :meth:`fit`: ``result_`` (a :class:`DecodeResult` of detected
    strings), ``summary_``, and per candidate ``estimates_``, ``std_errors_``,
    ``proportions_``, ``p_values_``, ``adjusted_p_values_``, ``detected_``;
    per cohort and bit ``bit_shares_`` and ``bit_variances_`` (shares of the
    cohort's reports) and ``bit_counts_`` and ``bit_count_variances_`` (counts), and
    ``excluded_`` (a flat mask, row ``cohort * k + bit``: the equations left out of the
    fit because a value missing from the list made them read far above it) with
    ``excluded_share_``, the share of reports those values hold there.
    """

    def __init__(
        self,
        params: StringParams,
        *,
        correction: str = DEFAULT_OPTIONS.correction,
        alpha: float = DEFAULT_OPTIONS.alpha,
        confidence: float = DEFAULT_OPTIONS.confidence,
        background: bool = DEFAULT_OPTIONS.background,
        progress: bool | None = None,
    ) -> None:
        self.params = params
        self.correction = correction
        self.alpha = alpha
        self.confidence = confidence
        self.background = background
        self.progress = progress

    def fit(
        self,
        reports: Any,
        ones: Any,
        candidates: Sequence[str],
        candidate_map: sp.spmatrix | None = None,
        *,
        source: str = "counts",
        metric: str = "",
    ) -> StringDecoder:
        """Decode counts (``reports`` per cohort, ``ones`` per cohort and bit).

        ``candidate_map`` (``m*k`` x ``len(candidates)``) is built from
        ``candidates`` with our hashing when not given (give it to decode a
        google/rappor ``map.csv``); the last one built is reused for the same parameters
        and candidates (:func:`~veil.server.analysis.candidate_map.remembered_map`). ``source`` names the input in errors, ``metric``
        names the metric in the result's rows.
        """
        started = time.perf_counter()
        settings = _Settings(
            check_correction(self.correction),
            check_level(self.alpha, "alpha"),
            check_level(self.confidence, "confidence"),
        )
        reports, ones = _check_counts(self.params, reports, ones, source)
        names, matrix = self._check_candidates(candidates, candidate_map)
        system = self._unbiased_counts(reports, ones, matrix)
        solution, fitted_system = self._select(system, settings, len(names))
        rows = self._infer(names, solution, settings, int(reports.sum()), metric)
        self.excluded_share_, self._excluded_share_se = self._excluded_excess(
            reports, system, solution
        )
        self.summary_ = self._summary(reports, matrix, fitted_system, solution, settings, started)
        self.result_ = DecodeResult(
            "string", STRING_COLUMNS, rows, self.summary_, _description(self.summary_)
        )
        return self

    def _check_candidates(
        self, candidates: Sequence[str], candidate_map: sp.spmatrix | None
    ) -> tuple[list[str], sp.csc_matrix]:
        """Validation: the candidates as strings and their float CSC map of shape ``(m*k, n)``."""
        if isinstance(candidates, str | bytes):
            raise ParameterError("candidates", "give a list of candidate strings, not one string")
        names = [str(c) for c in candidates]
        if candidate_map is None:
            candidate_map = remembered_map(self.params, tuple(names), self.progress)
        matrix = sp.csc_matrix(candidate_map, dtype=float)
        rows = self.params.m * self.params.k
        if matrix.shape != (rows, len(names)):
            raise ParameterError(
                "map",
                f"the candidate map has shape {matrix.shape}; expected "
                f"(m*k, candidates) = ({rows}, {len(names)})",
            )
        return names, matrix

    def _unbiased_counts(
        self, reports: np.ndarray, ones: np.ndarray, candidate_map: sp.csc_matrix
    ) -> WhitenedSystem:
        """Unbiased bit shares and counts with their variances, and the whitened system."""
        share, variance = bit_estimates(self.params, reports, ones)
        self.bit_shares_, self.bit_variances_ = share, variance
        # t_ij = (c_ij - p* N_j) / (q* - p*): unbiased counts of reports with each bit set
        cohort_reports = reports.astype(float)[:, None]
        self.bit_counts_ = share * cohort_reports
        self.bit_count_variances_ = np.where(
            cohort_reports > 0, np.where(np.isfinite(variance), variance, 0.0) * cohort_reports**2,
            0.0,
        )
        weights_variance = model_variances(self.params, reports, ones)
        return WhitenedSystem.build(
            share, weights_variance, candidate_map, self.background, bit_variance=variance
        )

    def _select(
        self, system: WhitenedSystem, settings: _Settings, n_candidates: int
    ) -> tuple[LeastSquares, WhitenedSystem]:
        """:meth:`_fit`, then again without the equations (cohort, bit) that read far above
        the fit, until none is left; returns the fit and the equations it used.

        A value missing from the candidate list that many reports carry sets its own bits
        in every cohort; the background column spreads its share over all bits, so those
        bits read far above the fit. Left in, they pass for signal of every listed string
        that shares them: with the most common of 300 Zipf(1.5) values missing from a list
        with 5,000 decoys, 22% of Storey's detections were decoys, and 37% of the runs
        reported a decoy under Bonferroni (``benchmarks/error_rates.py``). An equation is
        left out when its residual passes the z that a :data:`OUTLIER_RATE` share of fits
        would reach somewhere by noise alone (one-sided, Bonferroni over the equations),
        so a list that misses nothing almost never loses one.
        """
        self.excluded_ = np.zeros(system.y.size, dtype=bool)
        solution = self._fit(system, settings, n_candidates)
        fitted_system = system
        z_outlier = normal_isf(OUTLIER_RATE / max(system.equations, 1))
        for _ in range(MAX_REFITS):
            residual = system.standardized(system.y - system.fitted(solution))
            new = (system.weight > 0) & ~self.excluded_ & (residual > z_outlier)
            if not new.any():
                break
            self.excluded_ |= new
            fitted_system = system.without(self.excluded_)
            solution = self._fit(fitted_system, settings, n_candidates)
        return solution, fitted_system

    def _excluded_excess(
        self, reports: np.ndarray, system: WhitenedSystem, solution: LeastSquares
    ) -> tuple[float, float]:
        """The share of reports the left-out equations hold above the fit, with its
        standard error: ``sum (N_j / N) r_ij`` over them (``r`` the residual bit share)
        divided by the distinct bits a value sets, i.e. the share of the missing values
        that set them."""
        excluded = self.excluded_
        if not excluded.any():
            return 0.0, 0.0
        params = self.params
        weight = system.weight[excluded]
        residual = (system.y - system.fitted(solution))[excluded] / weight
        cohort_share = np.repeat(reports / reports.sum(), params.k)[excluded]
        excess = float(cohort_share @ residual) / params.bits_per_value
        own_variance = system.noise[excluded] / weight**2
        variance = float(cohort_share**2 @ own_variance) / params.bits_per_value**2
        return excess, float(np.sqrt(variance))

    def _fit(self, system: WhitenedSystem, settings: _Settings, n_candidates: int) -> LeastSquares:
        """The joint fit of every candidate when the equations afford it
        (:func:`~veil.server.analysis.selection.joint_fit`); otherwise selection by
        the Lasso, then least squares on it.

        Lasso penalty = the z a lone string needs under the correction: Bonferroni's
        alpha / n; for Benjamini-Hochberg and Storey (D + 1) alpha / n once D strings
        are found (the threshold for one more discovery), repeated until D settles.
        """
        self.lasso_selected_: int | None = None
        self.selection_z_: float | None = None
        joint = joint_fit(system)
        if joint is not None:
            return joint
        correction, alpha = settings.correction, settings.alpha
        discoveries = 0
        for _ in range(MAX_REFITS):
            tests = 1 if correction == "none" else max(n_candidates, 1)
            z_select = normal_isf(alpha * (discoveries + 1) / tests)
            selected = lasso_select(system, z_select)
            solution = refit_with_additions(
                system, selected, z_select, alpha, correction, n_candidates
            )
            if correction not in ("bh", "storey") or solution.columns.size <= discoveries:
                break
            discoveries = solution.columns.size
        self.lasso_selected_ = int(selected.size)
        self.selection_z_ = z_select
        return solution

    def _infer(
        self, candidates: list[str], solution: LeastSquares, settings: _Settings, total: int,
        metric: str,
    ) -> list[dict[str, Any]]:
        """Inference: estimates, standard errors, p-values and detections of every
        candidate; returns the result rows of the detected ones, largest first."""
        n_candidates = len(candidates)
        columns, theta, cov = solution.columns, solution.theta, solution.covariance
        estimates = np.zeros(n_candidates)
        std_errors = np.zeros(n_candidates)
        raw_p = np.ones(n_candidates)
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None)) if columns.size else np.zeros(0)
        estimates[columns] = theta
        std_errors[columns] = se
        raw_p[columns] = one_sided_p_values(theta, se)
        adjusted = np.ones(n_candidates)
        adjusted[columns] = adjust_p_values(raw_p[columns], settings.correction, n_candidates)
        detected = np.zeros(n_candidates, dtype=bool)
        detected[columns] = adjusted[columns] < settings.alpha

        self.candidates_ = candidates
        self.proportions_ = estimates
        self.estimates_ = estimates * total
        self.std_errors_ = std_errors * total
        self.p_values_ = raw_p
        self.adjusted_p_values_ = adjusted
        self.detected_ = detected
        self.covariance_ = cov
        self.background_share_ = solution.background_share

        found = np.flatnonzero(detected)
        order = found[np.argsort(-estimates[found], kind="stable")]
        return frequency_rows(
            metric, "string", [candidates[s] for s in order], estimates[order],
            std_errors[order], total, z_quantile(settings.confidence), STRING_COLUMNS,
            raw_p[order],
        )

    def _summary(
        self,
        reports: np.ndarray,
        candidate_map: sp.csc_matrix,
        system: WhitenedSystem,
        solution: LeastSquares,
        settings: _Settings,
        started: float,
    ) -> dict[str, Any]:
        """Sample, fit quality, the detection limit and the privacy cost of the fit."""
        params = self.params
        total = int(reports.sum())
        n_candidates = len(self.candidates_)
        columns = solution.columns
        p_star, q_star = params.effective_probs
        total_ss = system.chi2(system.y)
        residual_ss = solution.residual_ss
        dof = max(solution.dof, 1)
        explained_ss = max(total_ss - residual_ss, 0.0)
        unexplained_ss = max(residual_ss - dof, 0.0)
        signal_ss = explained_ss + unexplained_ss
        # unbiased, so at small N it can leave [0, 1]; shown clipped, with a note
        missing, missing_se = self._missing_share(solution) if self.background else (None, None)
        norms = system.lone_norms
        usable = norms > 0
        lone_se = float(np.median(1.0 / norms[usable])) if usable.any() else float("inf")
        # the standard error a candidate gets in this fit: the joint fit's own, or a lone
        # string's widened by the dispersion
        typical_se = (
            float(np.median(self.std_errors_[columns])) / total if solution.method == "joint"
            else lone_se * float(np.sqrt(solution.dispersion))
        )
        detected = self.detected_
        allocated = float(self.proportions_[detected].sum())
        z_detect = critical_z(settings.alpha, settings.correction, n_candidates) + normal_isf(
            1 - DETECTION_POWER
        )
        noise_sd = float(np.median(1.0 / system.weight[system.weight > 0]))
        bit_mass = self._bit_mass(reports, candidate_map, solution)
        shown_allocated = float(np.clip(allocated, 0.0, 1.0))
        summary: dict[str, Any] = {
            "kind": "string",
            "reports": total,
            "cohorts": params.m,
            "cohorts_with_reports": int(np.count_nonzero(reports)),
            "equations": system.equations,
            "candidates": n_candidates,
            "candidates_unusable": int(np.count_nonzero(~usable)),
            "lasso_selected": self.lasso_selected_,
            "selection_z": self.selection_z_,
            "detected": int(np.count_nonzero(detected)),
            "fit": solution.method,
            "dispersion": solution.dispersion,
            "correction": settings.correction,
            "alpha": settings.alpha,
            "confidence": settings.confidence,
            "allocated_proportion": shown_allocated,
            "allocated_proportion_unbiased": allocated,
            "allocated_reports": shown_allocated * total,
            **_missing_fields(missing, missing_se, shown_allocated, settings.confidence),
            "signal_explained_by_detected": _ratio(bit_mass["detected"], bit_mass["total"]),
            "signal_attributed_to_missing": _ratio(bit_mass["missing"], bit_mass["total"]),
            "unexplained_variance_fraction": _ratio(unexplained_ss, signal_ss),
            "explained_variance": explained_ss,
            "unexplained_variance": unexplained_ss,
            "noise_variance": float(dof),
            "equations_excluded": int(np.count_nonzero(self.excluded_)),
            "excluded_share": self.excluded_share_,
            "residual_chi2": residual_ss,
            "residual_dof": dof,
            "residual_p_value": chi2_sf(residual_ss, dof),
            "noise_sd_per_bit_share": noise_sd,
            "std_error_lone_string": lone_se,
            "std_error_typical": typical_se,
            "min_detectable_proportion": min(z_detect * typical_se, 1.0),
            "min_detectable_reports": min(z_detect * typical_se, 1.0) * total,
            "detection_power": DETECTION_POWER,
            "p_star": p_star,
            "q_star": q_star,
            "params": params.to_dict(),
            "epsilon_1": params.epsilon_1,
            "epsilon_inf": params.epsilon_inf,
            "privacy": privacy_cost(params, None, "strings"),
            "elapsed_seconds": time.perf_counter() - started,
        }
        notes = []
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
        if self.excluded_.any():
            excluded = summary["equations_excluded"]
            message = (
                f"{excluded:,} of {system.equations + excluded:,} (cohort, bit) counts read far "
                "above what the candidates and the background explain: values missing from "
                f"the candidate list carry about {self.excluded_share_:.2%} of the reports in "
                "them. They were left out of the fit, so that they cannot pass for listed "
                "strings that share their bits"
            )
            if self.excluded_share_ >= summary["min_detectable_proportion"]:  # as a detection
                summary["warning"] = (
                    f"{message}; find the missing values with veil discover (a discovery "
                    "channel) or add them to the candidates"
                )
            else:
                notes.append(message)
        if notes:
            summary["note"] = "; ".join(notes)
        return summary

    def _missing_share(self, solution: LeastSquares) -> tuple[float, float]:
        """The share of reports whose values are not in the table, with its standard error.

        The background share per bit times ``scale`` (bits per share of values) counts the
        values not listed, and :attr:`excluded_share_` those whose bits were left out of
        the fit; the joint fit also estimates every listed candidate, so the ones not
        detected are added (with their covariances, and the background's covariance with
        them: ``-loading' C``). On the Lasso path the background already holds the
        candidates left out of the selection.
        """
        scale = self.params.k / self.params.bits_per_value
        missing = solution.background_share * scale + self.excluded_share_
        variance = solution.background_variance * scale**2 + self._excluded_share_se**2
        if solution.method == "joint" and solution.background_covariance is not None:
            rest = ~self.detected_[solution.columns]
            cov = solution.covariance
            missing += float(solution.theta[rest].sum())
            variance += float(cov[np.ix_(rest, rest)].sum())
            variance += 2 * scale * float(solution.background_covariance[rest].sum())
        return missing, float(np.sqrt(max(variance, 0.0)))

    def _bit_mass(
        self, reports: np.ndarray, candidate_map: sp.csc_matrix, solution: LeastSquares
    ) -> dict[str, float]:
        """Reports' set bits in all, explained by the detected strings, and by the values
        missing from the table (the background and the bits left out of the fit)."""
        found = np.flatnonzero(self.detected_)
        row_reports = np.repeat(reports.astype(float), self.params.k)
        strings_share = (
            candidate_map[:, found] @ self.proportions_[found] if found.size
            else np.zeros(candidate_map.shape[0])
        )
        return {
            "total": float(row_reports @ self.bit_shares_.ravel()),
            "detected": float(row_reports @ strings_share),
            "missing": float(
                (solution.background_share
                 + self.excluded_share_ * self.params.bits_per_value / self.params.k)
                * row_reports.sum()
            ),
        }


def _missing_fields(
    missing: float | None, missing_se: float | None, allocated: float, confidence: float
) -> dict[str, float | None]:
    """The summary's missing share: the unbiased estimate with its standard error and its
    interval (within [0, 1], where the truth lies), and the estimate clipped to
    ``[0, 1 - allocated]`` as a separate figure.

    The estimate is shown unclipped because clipping it to what the detected strings leave
    biased it: the shown allocated and missing shares of a list that misses nothing added
    up to 0.85 on average at 1,500 reports and 0.93 at 20,000. Its interval says what the
    data can defend; at small N it spans most of [0, 1]."""
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


def _description(summary: dict[str, Any]) -> str:
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
        f"({summary['confidence']:.0%} interval {low:.1%} to {high:.1%})"
    )
    if high - low > 0.5:
        text += ": too few reports to say how much of the population the table leaves out"
    return text


def _ratio(part: float, whole: float) -> float | None:
    """``part / whole`` as a fraction in [0, 1] (noise can push unbiased parts past the
    whole at small N), or ``None`` when there is no positive whole to divide."""
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else None


@decodes(StringParams)
def decode_strings(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """The decoder of string metrics: :class:`StringDecoder` over ``options.candidates``."""
    if options.candidates is None:
        raise ParameterError(
            "candidates",
            f"metric {counts.metric or '(unnamed)'} holds strings: give the candidate strings "
            "to look for (a file with one per line, or a google/rappor map.csv)",
        )
    decoder = StringDecoder(
        _string_params(counts.params),
        correction=options.correction,
        alpha=options.alpha,
        confidence=options.confidence,
        background=options.background,
        progress=options.progress,
    ).fit(counts.reports, counts.ones, options.candidates, options.candidate_map,
          source=counts.source, metric=counts.metric)
    result = decoder.result_
    result.summary.update(sample_summary(counts))
    return result
