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
   by its standard deviation so that the noise has unit variance (weighted least
   squares with the known weights). An optional *background* column (the same
   share in every bit) stands for the values that are not in the candidate list:
   their Bloom bits land in effectively random places. Its share is left free
   (it may come out slightly negative) so that estimates stay unbiased when the
   list misses nothing.
3. Selection: non-negative Lasso (scikit-learn, CSC input) on unit-norm columns
   with the penalty at the z-score a lone string needs under the correction
   (Bonferroni: ``alpha / n_candidates``), so a candidate with no signal enters
   only with about that probability. It is
   solved on a working set (candidates whose marginal score passes half the
   threshold once the background is removed) and the working set grows until
   the Karush-Kuhn-Tucker conditions hold for every candidate, so the solution
   is that of the Lasso over all candidates at a fraction of the cost.
4. Estimates: non-negative least squares (SciPy) on the selection, standard
   errors from ``(X' W X)^-1``, one-sided z-tests, the chosen multiple-testing
   correction over all candidates, and refits until every reported string is
   significant.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import optimize, stats

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.counts import CountsArrays
from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.results import FREQUENCY_COLUMNS, DecodeResult
from veil.server.analysis.stats import (
    adjust_p_values,
    check_correction,
    check_level,
    critical_z,
    one_sided_p_values,
    z_quantile,
)
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams

#: power at which :attr:`StringDecoder.summary_` states the smallest detectable share
DETECTION_POWER = 0.8
_MAX_REFITS = 20
_MAX_WORKING_SET_ROUNDS = 20


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


def _check_inputs(
    params: StringParams, reports: Any, ones: Any, source: str
) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(params, StringParams):
        raise ParameterError("params", "StringDecoder needs StringParams (k, h, m, p, q, f)")
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


class StringDecoder:
    """Estimate how many reports carry each candidate string.

    Parameters are stored as given and checked in :meth:`fit` (scikit-learn's
    convention). ``correction`` is ``"bonferroni"`` (family-wise error rate
    ``alpha``), ``"bh"`` (Benjamini-Hochberg false discovery rate ``alpha``) or
    ``"none"``; ``confidence`` sets the intervals; ``background`` adds the
    column for values missing from the candidate list.

    After :meth:`fit`: ``result_`` (a :class:`DecodeResult` of detected
    strings), ``summary_``, and per candidate ``estimates_``, ``std_errors_``,
    ``proportions_``, ``p_values_``, ``adjusted_p_values_``, ``detected_``;
    per cohort and bit ``bit_shares_`` and ``bit_variances_`` (shares of the
    cohort's reports) and ``bit_counts_`` and ``bit_count_variances_`` (counts).
    """

    def __init__(
        self,
        params: StringParams,
        *,
        correction: str = "bonferroni",
        alpha: float = 0.05,
        confidence: float = 0.95,
        background: bool = True,
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
    ) -> StringDecoder:
        """Decode counts (``reports`` per cohort, ``ones`` per cohort and bit).

        ``candidate_map`` (``m*k`` x ``len(candidates)``) is built from
        ``candidates`` with our hashing when not given (give it to decode a
        google/rappor ``map.csv``). ``source`` names the input in errors.
        """
        started = time.perf_counter()
        correction = check_correction(self.correction)
        alpha = check_level(self.alpha, "alpha")
        confidence = check_level(self.confidence, "confidence")
        params = self.params
        reports, ones = _check_inputs(params, reports, ones, source)
        if isinstance(candidates, str | bytes):
            raise ParameterError("candidates", "give a list of candidate strings, not one string")
        candidates = [str(c) for c in candidates]
        if not candidates:
            raise ParameterError("candidates", "give at least one candidate string")
        if candidate_map is None:
            candidate_map = build_map(params, candidates, progress=self.progress)
        candidate_map = sp.csc_matrix(candidate_map, dtype=float)
        rows = params.m * params.k
        if candidate_map.shape != (rows, len(candidates)):
            raise ParameterError(
                "map",
                f"the candidate map has shape {candidate_map.shape}; expected "
                f"(m*k, candidates) = ({rows}, {len(candidates)})",
            )
        n_candidates = len(candidates)
        total = int(reports.sum())

        share, variance = bit_estimates(params, reports, ones)
        self.bit_shares_, self.bit_variances_ = share, variance
        # t_ij = (c_ij - p* N_j) / (q* - p*): unbiased counts of reports with each bit set
        cohort_reports = reports.astype(float)[:, None]
        self.bit_counts_ = share * cohort_reports
        self.bit_count_variances_ = np.where(
            cohort_reports > 0, np.where(np.isfinite(variance), variance, 0.0) * cohort_reports**2,
            0.0,
        )
        weight = np.where(np.isfinite(variance), 1.0 / np.sqrt(variance), 0.0).ravel()
        y = share.ravel() * weight
        design = candidate_map.copy()
        design.data = design.data * weight[design.indices]
        norms = np.sqrt(np.asarray(design.multiply(design).sum(axis=0)).ravel())
        equations = int(np.count_nonzero(weight))
        background = weight.copy() if self.background else None

        # Penalty = the z a lone string needs under the correction: Bonferroni's
        # alpha / n; for Benjamini-Hochberg (D + 1) alpha / n once D strings are
        # found (its threshold for one more discovery), repeated until D settles.
        discoveries = 0
        for _ in range(_MAX_REFITS):
            tests = 1 if correction == "none" else n_candidates
            z_select = float(stats.norm.isf(alpha * (discoveries + 1) / tests))
            selected = _lasso_select(design, norms, y, background, z_select)
            columns, theta, cov, back, back_var = _refit_with_additions(
                design, norms, y, background, selected, z_select, alpha, correction, n_candidates
            )
            if correction != "bh" or columns.size <= discoveries:
                break
            discoveries = columns.size
        self.lasso_selected_ = int(selected.size)
        self.selection_z_ = z_select

        z = z_quantile(confidence)
        estimates = np.zeros(n_candidates)
        std_errors = np.zeros(n_candidates)
        raw_p = np.ones(n_candidates)
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None)) if columns.size else np.zeros(0)
        estimates[columns] = theta
        std_errors[columns] = se
        raw_p[columns] = one_sided_p_values(theta, se)
        adjusted = np.ones(n_candidates)
        adjusted[columns] = adjust_p_values(raw_p[columns], correction, n_candidates)
        detected = np.zeros(n_candidates, dtype=bool)
        detected[columns] = adjusted[columns] < alpha

        self.candidates_ = candidates
        self.proportions_ = estimates
        self.estimates_ = estimates * total
        self.std_errors_ = std_errors * total
        self.p_values_ = raw_p
        self.adjusted_p_values_ = adjusted
        self.detected_ = detected
        self.covariance_ = cov
        self.background_share_ = back

        fitted = design[:, columns] @ theta if columns.size else np.zeros(rows)
        if background is not None:
            fitted = fitted + back * background
        order = columns[np.argsort(-theta, kind="stable")] if columns.size else columns
        table = []
        for s in order:
            low = max(estimates[s] - z * std_errors[s], 0.0)
            high = min(estimates[s] + z * std_errors[s], 1.0)
            table.append(
                {
                    "string": candidates[s],
                    "estimate": float(estimates[s] * total),
                    "std_error": float(std_errors[s] * total),
                    "proportion": float(estimates[s]),
                    "prop_std_error": float(std_errors[s]),
                    "prop_low_95": float(low),
                    "prop_high_95": float(high),
                    "p_value": float(raw_p[s]),
                }
            )
        row_reports = np.repeat(reports.astype(float), params.k)
        strings_share = candidate_map[:, columns] @ theta if columns.size else np.zeros(rows)
        bit_mass = {
            "total": float(row_reports @ share.ravel()),
            "detected": float(row_reports @ strings_share),
            "missing": float(back * row_reports.sum()),
        }
        # a lone string's standard error: 1 / its whitened column's norm once the
        # background column is partialled out
        lone = norms**2
        if background is not None:
            lone = lone - (design.T @ background) ** 2 / float(background @ background)
        self.summary_ = self._summary(
            reports, np.sqrt(np.clip(lone, 0.0, None)), y, weight, fitted, columns, theta, back, back_var, bit_mass,
            equations, n_candidates, alpha, correction, confidence, started,
        )
        self.result_ = DecodeResult(
            "string", FREQUENCY_COLUMNS, table, self.summary_,
            f"{self.summary_['detected']} of {self.summary_['candidates']} candidates detected "
            f"({self.summary_['allocated_proportion']:.1%} of reports)",
        )
        return self

    def _summary(
        self, reports: np.ndarray, norms: np.ndarray, y: np.ndarray, weight: np.ndarray,
        fitted: np.ndarray, columns: np.ndarray, theta: np.ndarray, back: float,
        back_var: float, bit_mass: dict[str, float], equations: int, n_candidates: int,
        alpha: float, correction: str, confidence: float, started: float,
    ) -> dict[str, Any]:
        params = self.params
        total = int(reports.sum())
        p_star, q_star = params.effective_probs
        residual = y - fitted
        total_ss = float(y @ y)
        residual_ss = float(residual @ residual)
        dof = max(equations - columns.size - (1 if self.background else 0), 1)
        explained_ss = max(total_ss - residual_ss, 0.0)
        unexplained_ss = max(residual_ss - dof, 0.0)
        signal_ss = explained_ss + unexplained_ss
        # expected distinct bits per value: k (1 - (1 - 1/k)^h)
        bits_per_value = params.k * (1 - (1 - 1 / params.k) ** params.h)
        missing = back * params.k / bits_per_value if self.background else None
        missing_se = np.sqrt(back_var) * params.k / bits_per_value if self.background else None
        usable = norms > 0
        typical_se = float(np.median(1.0 / norms[usable])) if usable.any() else float("inf")
        z_detect = critical_z(alpha, correction, n_candidates) + float(stats.norm.isf(1 - DETECTION_POWER))
        noise_sd = float(np.median(1.0 / weight[weight > 0]))
        return {
            "kind": "string",
            "reports": total,
            "cohorts": params.m,
            "cohorts_with_reports": int(np.count_nonzero(reports)),
            "equations": equations,
            "candidates": n_candidates,
            "candidates_unusable": int(np.count_nonzero(~usable)),
            "lasso_selected": self.lasso_selected_,
            "selection_z": self.selection_z_,
            "detected": int(columns.size),
            "correction": correction,
            "alpha": alpha,
            "confidence": confidence,
            "allocated_proportion": float(theta.sum()) if columns.size else 0.0,
            "allocated_reports": float(theta.sum() * total) if columns.size else 0.0,
            "missing_proportion": None if missing is None else float(missing),
            "missing_proportion_std_error": None if missing_se is None else float(missing_se),
            "signal_explained_by_detected": _ratio(bit_mass["detected"], bit_mass["total"]),
            "signal_attributed_to_missing": _ratio(bit_mass["missing"], bit_mass["total"]),
            "unexplained_variance_fraction": _ratio(unexplained_ss, signal_ss),
            "explained_variance": explained_ss,
            "unexplained_variance": unexplained_ss,
            "noise_variance": float(dof),
            "residual_chi2": residual_ss,
            "residual_dof": dof,
            "residual_p_value": float(stats.chi2.sf(residual_ss, dof)),
            "noise_sd_per_bit_share": noise_sd,
            "std_error_lone_string": typical_se,
            "min_detectable_proportion": min(z_detect * typical_se, 1.0),
            "min_detectable_reports": min(z_detect * typical_se, 1.0) * total,
            "detection_power": DETECTION_POWER,
            "p_star": p_star,
            "q_star": q_star,
            "params": params.to_dict(),
            "epsilon_1": params.epsilon_1,
            "epsilon_inf": params.epsilon_inf,
            "elapsed_seconds": time.perf_counter() - started,
        }


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _lasso_select(
    design: sp.csc_matrix,
    norms: np.ndarray,
    y: np.ndarray,
    background: np.ndarray | None,
    z_select: float,
) -> np.ndarray:
    """Candidates the non-negative Lasso keeps at penalty ``z_select`` (unit-norm columns)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    rows = design.shape[0]
    usable = np.flatnonzero(norms > 0)
    if usable.size == 0:
        return usable
    scale = np.zeros_like(norms)
    scale[usable] = 1.0 / norms[usable]
    unit = design @ sp.diags(scale)
    unit = sp.csc_matrix(unit)
    base = y
    back_unit = None
    if background is not None and np.any(background):
        back_unit = background / np.linalg.norm(background)
        coef = max(float(back_unit @ y), 0.0)
        base = y - coef * back_unit
    score = unit.T @ base
    working = usable[score[usable] > z_select / 2]
    model = Lasso(
        alpha=z_select / rows, fit_intercept=False, positive=True, max_iter=10_000, tol=1e-6,
        selection="cyclic",
    )
    # the background column is scaled up so that its penalty is negligible
    back_column = None if back_unit is None else sp.csc_matrix((back_unit * 1e3)[:, None])
    for _ in range(_MAX_WORKING_SET_ROUNDS):
        blocks = [unit[:, working]] if working.size else []
        if back_column is not None:
            blocks.append(back_column)
        if not blocks:
            return working
        matrix = sp.hstack(blocks, format="csc")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(matrix, y)
        residual = y - matrix @ model.coef_
        gradient = unit.T @ residual
        outside = np.setdiff1d(usable, working, assume_unique=True)
        violators = outside[gradient[outside] > z_select * (1 + 1e-6)]
        if violators.size == 0:
            break
        working = np.union1d(working, violators)
    coef = model.coef_[: working.size]
    return working[coef > 0]


def _refit_with_additions(
    design: sp.csc_matrix,
    norms: np.ndarray,
    y: np.ndarray,
    background: np.ndarray | None,
    selected: np.ndarray,
    z_select: float,
    alpha: float,
    correction: str,
    n_candidates: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """:func:`_refit`, then add candidates whose score on the refit's residual passes
    ``z_select`` and refit again (each candidate is added at most once).

    The Lasso shrinks the strings it keeps, so a string whose bits overlap theirs
    can stay below the penalty; once the kept strings are refitted without
    shrinkage, its score shows.
    """
    tried = np.zeros(design.shape[1], dtype=bool)
    tried[selected] = True
    usable = norms > 0
    safe_norms = np.where(usable, norms, 1.0)
    for _ in range(_MAX_REFITS):
        columns, theta, cov, back, back_var = _refit(
            design, y, background, selected, alpha, correction, n_candidates
        )
        residual = y - (design[:, columns] @ theta if columns.size else 0.0)
        if background is not None:
            residual = residual - back * background
        score = (design.T @ residual) / safe_norms
        new = np.flatnonzero(usable & ~tried & (score > z_select))
        if new.size == 0:
            break
        tried[new] = True
        selected = np.union1d(columns, new)
    return columns, theta, cov, back, back_var


def _refit(
    design: sp.csc_matrix,
    y: np.ndarray,
    background: np.ndarray | None,
    selected: np.ndarray,
    alpha: float,
    correction: str,
    n_candidates: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """Non-negative least squares on the selection, dropping non-significant strings.

    Returns the kept columns, their shares, their covariance, and the background
    share with its variance.
    """
    columns = np.asarray(selected, dtype=np.int64)
    back_norm2 = float(background @ background) if background is not None else 0.0
    for _ in range(_MAX_REFITS):
        dense = design[:, columns].toarray() if columns.size else np.zeros((design.shape[0], 0))
        target, partial = y, dense
        if back_norm2 > 0:
            # the background share is free (not constrained to be >= 0), so a list that
            # misses nothing gives unbiased estimates; partial it out (Frisch-Waugh)
            loading = (background @ dense) / back_norm2
            target = y - background * (background @ y) / back_norm2
            partial = dense - np.outer(background, loading)
        if columns.size:
            theta, _ = optimize.nnls(partial, target, maxiter=50 * columns.size + 100)
            cov = np.linalg.pinv(partial.T @ partial, hermitian=True)
        else:
            theta, cov = np.zeros(0), np.zeros((0, 0))
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        p_values = one_sided_p_values(theta, se)
        adjusted = adjust_p_values(p_values, correction, n_candidates)
        keep = (theta > 0) & (adjusted < alpha)
        if keep.all():
            back = back_var = 0.0
            if back_norm2 > 0:
                back = float(background @ (y - dense @ theta)) / back_norm2
                back_var = 1.0 / back_norm2 + float(loading @ cov @ loading)
            return columns, theta, cov, back, back_var
        columns = columns[keep]
    raise ParameterError("fit", "the selection did not settle; check the counts and map")


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
        counts.params,
        correction=options.correction,
        alpha=options.alpha,
        confidence=options.confidence,
        background=options.background,
        progress=options.progress,
    ).fit(counts.reports, counts.ones, options.candidates, options.candidate_map,
          source=counts.source)
    result = decoder.result_
    result.summary.update({"metric": counts.metric, "start": counts.start, "end": counts.end})
    return result
