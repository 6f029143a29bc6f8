"""The string decoder's regression: whitened equations, a joint fit or a Lasso selection.

:class:`WhitenedSystem` is ``y = X theta + e`` with unit-variance noise (step 2 of
:mod:`veil.server.analysis.strings`). When the candidate list is small enough for the
equations, :func:`joint_fit` estimates every candidate at once by least squares: each
p-value is then exact, with no selection before the test. Otherwise :func:`lasso_select`
picks candidates with a non-negative Lasso solved on a growing working set, and
:func:`refit` and :func:`refit_with_additions` estimate the shares of that selection by
non-negative least squares, dropping strings that are not significant.

Both scale their covariances by the *dispersion*, the residual chi-square per degree of
freedom when it exceeds 1: values missing from the list set their own bits, which the
background column (one share over every bit) fits only on average, and the excess shows
in the residual. Without it those bits pass for signal of the listed strings that share
them, and the stated error rates no longer hold.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.stats import adjust_p_values, one_sided_p_values
from veil.shared.errors import ParameterError

#: rounds of refitting (and of Benjamini-Hochberg's selection) before giving up
MAX_REFITS = 20
_MAX_WORKING_SET_ROUNDS = 20
#: the joint fit is used when it widens the median candidate's standard error by at most
#: this factor over that candidate fitted alone (the price of testing every candidate
#: against all others); past it the Lasso selection has more power
JOINT_FIT_MAX_INFLATION = 1.1
#: ... and when the list has at most this many usable candidates (its covariance is dense)
JOINT_FIT_MAX_CANDIDATES = 3_000


@dataclasses.dataclass(frozen=True)
class WhitenedSystem:
    """``y = X theta + e`` with every equation (cohort, bit) divided by its noise's standard
    deviation, so the known variance of the mechanism weighs the least squares.

    ``weight`` is that inverse standard deviation (0 for cohorts without reports);
    ``norms`` are the whitened columns' norms; ``background``, when used, is the column
    of a share spread over every bit (values missing from the candidate list).
    ``noise`` is the variance of each whitened equation's noise: 1 when the weights are
    every bit's own variance, the ratio of its own variance to the weighting one when
    the weights use one pooled rate (0 for equations without reports). The fits' standard
    errors use it (a sandwich covariance), so weights chosen for unbiased estimates do not
    make their standard errors wrong.
    """

    design: sp.csc_matrix
    y: np.ndarray
    weight: np.ndarray
    norms: np.ndarray
    background: np.ndarray | None
    noise: np.ndarray

    @classmethod
    def build(
        cls, share: np.ndarray, variance: np.ndarray, candidate_map: sp.csc_matrix,
        background: bool, bit_variance: np.ndarray | None = None,
    ) -> WhitenedSystem:
        """The system of unbiased bit shares weighted by ``variance``, over a float CSC map;
        ``bit_variance``, when given, is every share's own variance (else ``variance``)."""
        weight = np.where(np.isfinite(variance), 1.0 / np.sqrt(variance), 0.0).ravel()
        noise = np.where(weight > 0, 1.0, 0.0)
        if bit_variance is not None:
            own = np.asarray(bit_variance, dtype=float).ravel()
            noise = np.where(weight > 0, np.where(np.isfinite(own), own, 0.0) * weight**2, 0.0)
        # new values over the map's own index arrays: at 100,000 candidates a copy of those
        # (and of the squared matrix for the norms) was a third of the peak memory
        data = weight[candidate_map.indices]
        data *= candidate_map.data
        design = sp.csc_matrix(
            (data, candidate_map.indices, candidate_map.indptr), shape=candidate_map.shape
        )
        return cls(
            design, share.ravel() * weight, weight, _column_norms(design),
            weight.copy() if background else None, noise,
        )

    def without(self, rows: np.ndarray) -> WhitenedSystem:
        """The same system with the equations ``rows`` (a boolean mask) left out: their
        weight, whitened share and design entries become 0, as a cohort without reports."""
        keep = np.where(rows, 0.0, 1.0)
        design = self.design.copy()
        design.data *= keep[design.indices]
        weight = self.weight * keep
        return WhitenedSystem(
            design, self.y * keep, weight, _column_norms(design),
            None if self.background is None else weight.copy(), self.noise * keep,
        )

    def standardized(self, residual: np.ndarray) -> np.ndarray:
        """Whitened residuals divided by their own noise's standard deviation (0 where an
        equation carries no information)."""
        scale = np.sqrt(self.noise)
        out: np.ndarray = np.where(scale > 0, residual / np.where(scale > 0, scale, 1.0), 0.0)
        return out

    def chi2(self, residual: np.ndarray) -> float:
        """The residual chi-square with every equation's own variance (Pearson's)."""
        return float(np.sum(self.standardized(residual) ** 2))

    @property
    def equations(self) -> int:
        """Equations that carry information (cohorts with reports)."""
        return int(np.count_nonzero(self.weight))

    def fitted(self, solution: LeastSquares) -> np.ndarray:
        """The whitened equations' fitted values under ``solution``."""
        columns = solution.columns
        fitted: np.ndarray = (
            self.design[:, columns] @ solution.theta if columns.size else np.zeros(self.y.size)
        )
        if self.background is not None:
            fitted = fitted + solution.background_share * self.background
        return fitted

    @functools.cached_property
    def lone_norms(self) -> np.ndarray:
        """Each column's norm once the background is partialled out: 1 / the standard error
        of a string's share when it is the only one in the list."""
        lone = self.norms**2
        if self.background is not None:
            back = self.background
            lone = lone - (self.design.T @ back) ** 2 / float(back @ back)
        norms: np.ndarray = np.sqrt(np.clip(lone, 0.0, None))
        return norms


def _column_norms(matrix: sp.csc_matrix, block: int = 1 << 20) -> np.ndarray:
    """Euclidean norms of a CSC matrix's columns, squaring ``block`` entries at a time."""
    squares = np.zeros(matrix.shape[1])
    for start in range(0, matrix.data.size, block):
        values = matrix.data[start : start + block]
        positions = np.arange(start, start + values.size)
        columns = np.searchsorted(matrix.indptr, positions, side="right") - 1
        squares += np.bincount(columns, weights=values * values, minlength=squares.size)
    norms: np.ndarray = np.sqrt(squares)
    return norms


@dataclasses.dataclass(frozen=True)
class LeastSquares:
    """Shares of the fitted ``columns`` (``theta``) with their ``covariance``, and the
    background share with its variance (0 without a background column), both scaled by
    the :attr:`dispersion`; the residual chi-square (every equation with its own
    variance) and its degrees of freedom. ``method`` is ``"joint"`` (every usable
    candidate, unconstrained) or ``"lasso"`` (a selection, non-negative)."""

    columns: np.ndarray
    theta: np.ndarray
    covariance: np.ndarray
    background_share: float
    background_variance: float
    residual_ss: float
    dof: int
    method: str = "lasso"
    #: per fitted column, the covariance of its share with the background share
    #: (scaled by the dispersion); ``None`` without a background column
    background_covariance: np.ndarray | None = None

    @property
    def dispersion(self) -> float:
        """The residual chi-square per degree of freedom, never below 1 (the known noise)."""
        return _dispersion(self.residual_ss, self.dof)


def _dispersion(residual_ss: float, dof: int) -> float:
    return max(1.0, residual_ss / dof) if dof > 0 else 1.0


def joint_fit(
    system: WhitenedSystem, max_inflation: float = JOINT_FIT_MAX_INFLATION
) -> LeastSquares | None:
    """Least squares of every usable candidate at once (shares may come out negative, so
    each is unbiased), or ``None`` when that is not the better test: too many candidates,
    fewer than two equations per candidate, a singular system (candidates with identical
    bits), or a median standard error more than ``max_inflation`` times the lone one.

    The choice depends on the map and the cohort sizes only, never on the counts, so the
    p-values of the joint fit are exact: no candidate is chosen before it is tested.
    """
    usable = np.flatnonzero(system.norms > 0)
    background = system.background
    free = background is not None and bool(np.any(background))
    dof = system.equations - usable.size - (1 if free else 0)
    if usable.size == 0 or usable.size > JOINT_FIT_MAX_CANDIDATES or dof < usable.size:
        return None
    design = system.design[:, usable]
    noise = sp.diags(system.noise)
    gram = np.asarray((design.T @ design).toarray())
    meat = np.asarray((design.T @ noise @ design).toarray())
    rhs = np.asarray(design.T @ system.y)
    loading = np.zeros(usable.size)
    back_norm2 = 0.0
    if free:
        assert background is not None
        back_norm2 = float(background @ background)
        cross = np.asarray(design.T @ background)
        loading = cross / back_norm2
        gram = gram - np.outer(cross, loading)
        rhs = rhs - loading * float(background @ system.y)
        # X_p = X - b loading' (the background partialled out): X_p' S X_p
        noisy_cross = np.asarray(design.T @ (system.noise * background))
        meat = (meat - np.outer(noisy_cross, loading) - np.outer(loading, noisy_cross)
                + float(background @ (system.noise * background)) * np.outer(loading, loading))
    try:
        inverse = np.linalg.inv(gram)
    except np.linalg.LinAlgError:  # exactly singular; a nearly singular one fails below
        return None
    model_variances = np.diag(inverse)
    lone = system.lone_norms[usable]
    if not np.all(model_variances > 0) or np.median(np.sqrt(model_variances) * lone) > max_inflation:
        return None
    # theta = G^-1 X_p' y, so Var(theta) = G^-1 X_p' S X_p G^-1 with S the equations' own
    # noise variances (the identity when the weights are every bit's own variance)
    covariance = inverse @ meat @ inverse
    theta = inverse @ rhs
    explained = design @ theta
    back = back_var = 0.0
    back_cov = None
    if free:
        assert background is not None
        back = float(background @ (system.y - explained)) / back_norm2
        # back = u' y with u = b / b'b - X_p G^-1 loading
        direction = inverse @ loading
        u = background / back_norm2 - (design @ direction - background * float(loading @ direction))
        back_var = float(u @ (system.noise * u))
        back_cov = inverse @ (design.T @ (system.noise * u) - loading * float(background @ (system.noise * u)))
        explained = explained + back * background
    residual = system.y - explained
    residual_ss = system.chi2(residual)
    dispersion = _dispersion(residual_ss, dof)
    return LeastSquares(
        usable, theta, covariance * dispersion, back, back_var * dispersion, residual_ss, dof,
        "joint", None if back_cov is None else back_cov * dispersion,
    )


def lasso_select(system: WhitenedSystem, z_select: float) -> np.ndarray:
    """Candidates the non-negative Lasso keeps at penalty ``z_select`` (unit-norm columns).

    Solved on a working set (candidates whose marginal score passes half the penalty
    once the background is removed), grown until the Karush-Kuhn-Tucker conditions
    hold for every candidate: the Lasso over all candidates at a fraction of the cost.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    design, norms, y, background = system.design, system.norms, system.y, system.background
    rows = design.shape[0]
    usable = np.flatnonzero(norms > 0)
    if usable.size == 0:
        return usable
    scale = np.zeros_like(norms)
    scale[usable] = 1.0 / norms[usable]
    # unit-norm columns are formed for the working set only; scores over all candidates
    # are the raw design's scaled afterwards (no second copy of a 100,000-column map)
    base = y
    back_unit = None
    if background is not None and np.any(background):
        back_unit = background / np.linalg.norm(background)
        coef = max(float(back_unit @ y), 0.0)
        base = y - coef * back_unit
    score = (design.T @ base) * scale
    working: np.ndarray = usable[score[usable] > z_select / 2]
    model = Lasso(
        alpha=z_select / rows, fit_intercept=False, positive=True, max_iter=10_000, tol=1e-6,
        selection="cyclic",
    )
    # the background column is scaled up so that its penalty is negligible
    back_column = None if back_unit is None else sp.csc_matrix((back_unit * 1e3)[:, None])
    for _ in range(_MAX_WORKING_SET_ROUNDS):
        blocks = [design[:, working] @ sp.diags(scale[working])] if working.size else []
        if back_column is not None:
            blocks.append(back_column)
        if not blocks:
            return working
        matrix = sp.hstack(blocks, format="csc")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(matrix, y)
        residual = y - matrix @ model.coef_
        gradient = (design.T @ residual) * scale
        outside = np.setdiff1d(usable, working, assume_unique=True)
        violators = outside[gradient[outside] > z_select * (1 + 1e-6)]
        if violators.size == 0:
            break
        working = np.union1d(working, violators)
    coef = model.coef_[: working.size]
    selected: np.ndarray = working[coef > 0]
    return selected


def refit_with_additions(
    system: WhitenedSystem,
    selected: np.ndarray,
    z_select: float,
    alpha: float,
    correction: str,
    n_candidates: int,
) -> LeastSquares:
    """:func:`refit`, then add candidates whose score on the refit's residual passes
    ``z_select`` and refit again (each candidate is added at most once).

    The Lasso shrinks the strings it keeps, so a string whose bits overlap theirs
    can stay below the penalty; once the kept strings are refitted without
    shrinkage, its score shows.
    """
    design = system.design
    tried = np.zeros(design.shape[1], dtype=bool)
    tried[selected] = True
    usable = system.norms > 0
    safe_norms = np.where(usable, system.norms, 1.0)
    for _ in range(MAX_REFITS):
        solution = refit(system, selected, alpha, correction, n_candidates)
        score = (design.T @ (system.y - system.fitted(solution))) / safe_norms
        new = np.flatnonzero(usable & ~tried & (score > z_select))
        if new.size == 0:
            break
        tried[new] = True
        selected = np.union1d(solution.columns, new)
    return solution


def refit(
    system: WhitenedSystem,
    selected: np.ndarray,
    alpha: float,
    correction: str,
    n_candidates: int,
) -> LeastSquares:
    """Non-negative least squares on the selection, dropping non-significant strings
    until every kept string passes the ``correction`` at level ``alpha``."""
    from scipy import optimize  # only this path needs it: a fifth of a short decode's start-up

    design, y = system.design, system.y
    columns = np.asarray(selected, dtype=np.int64)
    background = system.background
    back_norm2 = float(background @ background) if background is not None else 0.0
    free = background if background is not None and back_norm2 > 0 else None
    for _ in range(MAX_REFITS):
        dense = design[:, columns].toarray() if columns.size else np.zeros((design.shape[0], 0))
        target, partial = y, dense
        loading = np.zeros(columns.size)
        if free is not None:
            # the background share is free (not constrained to be >= 0), so a list that
            # misses nothing gives unbiased estimates; partial it out (Frisch-Waugh)
            loading = (free @ dense) / back_norm2
            target = y - free * (free @ y) / back_norm2
            partial = dense - np.outer(free, loading)
        if columns.size:
            theta, _ = optimize.nnls(partial, target, maxiter=50 * columns.size + 100)
            inverse = np.linalg.pinv(partial.T @ partial, hermitian=True)
        else:
            theta, inverse = np.zeros(0), np.zeros((0, 0))
        # the sandwich G^-1 X_p' S X_p G^-1 (S: the equations' own noise variances)
        cov = inverse @ (partial.T @ (system.noise[:, None] * partial)) @ inverse
        residual = target - partial @ theta
        residual_ss = system.chi2(residual)
        dof = system.equations - columns.size - (1 if free is not None else 0)
        dispersion = _dispersion(residual_ss, dof)
        cov = cov * dispersion
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        p_values = one_sided_p_values(theta, se)
        adjusted = adjust_p_values(p_values, correction, n_candidates)
        keep = (theta > 0) & (adjusted < alpha)
        if keep.all():
            back = back_var = 0.0
            if free is not None:
                back = float(free @ (y - dense @ theta)) / back_norm2
                # back = u' y with u = b / b'b - X_p G^-1 loading
                u = free / back_norm2 - partial @ (inverse @ loading)
                back_var = dispersion * float(u @ (system.noise * u))
            return LeastSquares(columns, theta, cov, back, back_var, residual_ss, dof)
        columns = columns[keep]
    raise ParameterError("fit", "the selection did not settle; check the counts and map")
