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

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.candidate_map import remembered_map
from veil.server.analysis.closed_form import sample_summary
from veil.server.analysis.decoders import (
    DEFAULT_OPTIONS,
    DecodeOptions,
    check_estimator,
    decodes,
)
from veil.server.analysis.ibu import AffineChannel, IbuEstimate, rows_with_ibu
from veil.server.analysis.ibu import estimate as ibu_estimate
from veil.server.analysis.results import DecodeResult
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
    normal_isf,
    one_sided_p_values,
)
from veil.server.analysis.string_summary import Settings, StringFit, description, fit_summary
from veil.server.analysis.tables import RANKED_COLUMNS, STRING_COLUMNS, detected_table, ranked_table
from veil.server.counts import CountsArrays
from veil.shared.errors import ParameterError
from veil.shared.kinds import MechanismParams, StringParams

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
    and more weight: with ``p*, q* > 1/2`` that biased the background share upwards
    (docs/analysis.md, "How strings are decoded", gives the size). The pooled rate is within
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
    params.check_informative()
    return reports, ones


class StringDecoder:
    """Estimate how many reports carry each candidate string.

    Parameters are stored as given and checked in :meth:`fit` (scikit-learn's
    convention). ``correction`` is ``"storey"`` (the default: false discovery
    rate ``alpha`` by Benjamini-Hochberg adapted to the estimated share of absent
    candidates), ``"bh"`` (Benjamini-Hochberg), ``"bonferroni"`` (family-wise
    error rate ``alpha``) or ``"none"``; ``confidence`` sets the intervals;
    ``background`` adds the column for values missing from the candidate list;
    ``estimator`` ``"ibu"`` shows the detected strings' shares from iterative Bayesian
    update over the fitted candidates (:func:`string_ibu`) instead of least squares;
    ``all_candidates`` makes the table list every candidate, ranked
    (:func:`ranked_rows`).

    Candidates are fitted jointly (every one tested against all others, exact
    p-values) when the equations afford it, otherwise selected by a Lasso first
    (``summary_["fit"]`` says which; :mod:`veil.server.analysis.selection`).

    After :meth:`fit`: ``result_`` (a :class:`DecodeResult` of detected
    strings), ``summary_``, and per candidate ``estimates_`` and ``std_errors_`` (in
    reports), ``proportions_`` (shares of all reports), ``p_values_``,
    ``adjusted_p_values_``, ``detected_``;
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
        estimator: str = DEFAULT_OPTIONS.estimator,
        all_candidates: bool = DEFAULT_OPTIONS.all_candidates,
    ) -> None:
        self.params = params
        self.correction = correction
        self.alpha = alpha
        self.confidence = confidence
        self.background = background
        self.progress = progress
        self.estimator = estimator
        self.all_candidates = all_candidates

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
        check_estimator(self.estimator)
        settings = Settings(
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
        fit = StringFit(
            params=self.params, settings=settings, reports=reports, candidate_map=matrix,
            system=fitted_system, solution=solution, proportions=self.proportions_,
            std_errors=self.std_errors_, detected=self.detected_, bit_shares=self.bit_shares_,
            excluded=self.excluded_, excluded_share=self.excluded_share_,
            excluded_share_se=self._excluded_share_se, background=self.background,
            lasso_selected=self.lasso_selected_, selection_z=self.selection_z_,
        )
        self.summary_ = fit_summary(fit, started)
        columns: tuple[str, ...] = STRING_COLUMNS
        if self.all_candidates:
            rows = ranked_rows(self, fitted_system, solution, settings, metric, int(reports.sum()))
            columns = RANKED_COLUMNS
        if self.estimator == "ibu":
            found, components = string_ibu(self, reports, ones, matrix, solution, settings)
            rows = rows_with_ibu(rows, found, components, self.candidates_, int(reports.sum()))
            self.summary_.update(found.summary_fields())
            self.summary_["ibu_background_share"] = (
                float(found.fit.shares[-1]) if self.background else None)
            self.summary_["ibu_explained_share"] = float(
                found.fit.shares[: components.size].sum())
        self.result_ = DecodeResult(
            "string", columns, rows, self.summary_, description(self.summary_)
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
        self, system: WhitenedSystem, settings: Settings, n_candidates: int
    ) -> tuple[LeastSquares, WhitenedSystem]:
        """:meth:`_fit`, then again without the equations (cohort, bit) that read far above
        the fit, until none is left; returns the fit and the equations it used.

        A value missing from the candidate list that many reports carry sets its own bits
        in every cohort; the background column spreads its share over all bits, so those
        bits read far above the fit. Left in, they pass for signal of every listed string
        that shares them (docs/analysis.md, "What the string decoder guarantees", gives the
        error rates measured with and without this step). An equation is
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

    def _fit(self, system: WhitenedSystem, settings: Settings, n_candidates: int) -> LeastSquares:
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
        self, candidates: list[str], solution: LeastSquares, settings: Settings, total: int,
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

        return detected_table(metric, candidates, estimates, std_errors, detected, total,
                              settings.confidence)


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
        estimator=options.estimator,
        all_candidates=options.all_candidates,
    ).fit(counts.reports, counts.ones, options.candidates, options.candidate_map,
          source=counts.source, metric=counts.metric)
    result = decoder.result_
    result.summary.update(sample_summary(counts))
    return result


#: bootstrap replicates behind the ``ibu`` estimator's intervals: each refits every
#: candidate of the fit, so fewer than the categories' (the standard errors' own relative
#: error is then about 1 / sqrt(2 * 100), 7%)
STRING_REPLICATES = 100



def ranked_rows(decoder: StringDecoder, system: WhitenedSystem, solution: LeastSquares,
                settings: Settings, metric: str, total: int) -> list[dict[str, Any]]:
    """A row per candidate, ranked by its z: a fitted candidate's estimate over its standard
    error; any other's score on the fit's residual, ``x' r / (|x| sqrt(dispersion))`` with
    the background partialled out of ``x`` (the z of the one step that would add it to the
    fit), its estimate that step, ``z`` times its lone standard error. Every row has its
    one-sided p-value; ``detected`` marks the detected strings (1) and ``rank`` the order."""
    norms = system.lone_norms
    usable = norms > 0
    scale = float(np.sqrt(solution.dispersion))
    residual = system.y - system.fitted(solution)
    score = np.asarray(system.design.T @ residual, dtype=float)
    if system.background is not None and np.any(system.background):
        back = system.background
        loading = np.asarray(system.design.T @ back, dtype=float) / float(back @ back)
        score = score - loading * float(back @ residual)
    lone_se = np.where(usable, 1.0 / np.where(usable, norms, 1.0), np.inf) * scale
    z = np.where(usable, score / np.where(usable, norms, 1.0) / scale, -np.inf)
    shares = np.where(usable, z * lone_se, 0.0)
    se = np.where(usable, lone_se, 0.0)
    fitted = solution.columns
    shares[fitted] = decoder.proportions_[fitted]
    se[fitted] = decoder.std_errors_[fitted] / total
    return ranked_table(metric, decoder.candidates_, shares, se, decoder.detected_, total,
                        settings.confidence)


def string_ibu(decoder: StringDecoder, reports: np.ndarray, ones: np.ndarray,
               candidate_map: sp.csc_matrix, solution: LeastSquares,
               settings: Settings) -> tuple[IbuEstimate, np.ndarray]:
    """IBU over the fitted candidates (every usable one on the joint fit, the selection on
    the Lasso path) and the background, from the set-bit counts of the equations the fit
    used (a left-out equation holds a value missing from the list that the background
    does not describe), with its bootstrap; returns it and the candidates it covers.

    Bit ``i`` of cohort ``j`` reads 1 with probability ``p* + (q* - p*) x`` for a report
    of a value that sets it (``x = 1``) or not (``x = 0``); a value missing from the list
    sets it with probability ``bits_per_value / k`` (the background column's rate)."""
    params = decoder.params
    p_star, q_star = params.effective_probs
    rows = np.flatnonzero(~decoder.excluded_ & np.repeat(reports > 0, params.k))
    components = np.asarray(solution.columns, dtype=np.int64)
    total = float(reports.sum())
    channel = AffineChannel(
        sp.csc_matrix(candidate_map[rows][:, components]), p_star, q_star,
        np.repeat(reports.astype(float), params.k)[rows],
        background_rate=params.bits_per_value / params.k if decoder.background else None,
        cohorts=rows // params.k,
    )
    unbiased = decoder.proportions_[components]
    unbiased_se = decoder.std_errors_[components] / total
    background = solution.background_share * params.k / params.bits_per_value
    found = ibu_estimate(channel, ones.reshape(-1)[rows], unbiased, unbiased_se,
                         settings.confidence, background if decoder.background else None,
                         STRING_REPLICATES)
    return found, components
