"""The string decoder's regression: whitened equations, Lasso selection, least squares.

:class:`WhitenedSystem` is ``y = X theta + e`` with unit-variance noise (step 2 of
:mod:`veil.server.analysis.strings`); :func:`lasso_select` picks candidates with a
non-negative Lasso solved on a growing working set (step 3); :func:`refit` and
:func:`refit_with_additions` estimate the shares of a selection by non-negative least
squares with their covariance, dropping strings that are not significant (step 4).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import scipy.sparse as sp
from scipy import optimize

from veil.server.analysis.stats import adjust_p_values, one_sided_p_values
from veil.shared.errors import ParameterError

#: rounds of refitting (and of Benjamini-Hochberg's selection) before giving up
MAX_REFITS = 20
_MAX_WORKING_SET_ROUNDS = 20


@dataclasses.dataclass(frozen=True)
class WhitenedSystem:
    """``y = X theta + e`` with every equation (cohort, bit) divided by its noise's standard
    deviation, so the known variance of the mechanism weighs the least squares.

    ``weight`` is that inverse standard deviation (0 for cohorts without reports);
    ``norms`` are the whitened columns' norms; ``background``, when used, is the column
    of a share spread over every bit (values missing from the candidate list).
    """

    design: sp.csc_matrix
    y: np.ndarray
    weight: np.ndarray
    norms: np.ndarray
    background: np.ndarray | None

    @classmethod
    def build(
        cls, share: np.ndarray, variance: np.ndarray, candidate_map: sp.csc_matrix, background: bool
    ) -> WhitenedSystem:
        """The system of unbiased bit shares with their variances, over a float CSC map."""
        weight = np.where(np.isfinite(variance), 1.0 / np.sqrt(variance), 0.0).ravel()
        design = candidate_map.copy()
        design.data = design.data * weight[design.indices]
        norms = np.sqrt(np.asarray(design.multiply(design).sum(axis=0)).ravel())
        return cls(design, share.ravel() * weight, weight, norms, weight.copy() if background else None)

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

    def lone_norms(self) -> np.ndarray:
        """Each column's norm once the background is partialled out: 1 / the standard error
        of a string's share when it is the only one in the list."""
        lone = self.norms**2
        if self.background is not None:
            back = self.background
            lone = lone - (self.design.T @ back) ** 2 / float(back @ back)
        norms: np.ndarray = np.sqrt(np.clip(lone, 0.0, None))
        return norms


@dataclasses.dataclass(frozen=True)
class LeastSquares:
    """Shares of the kept ``columns`` (``theta``) with their ``covariance``, and the
    background share with its variance (0 without a background column)."""

    columns: np.ndarray
    theta: np.ndarray
    covariance: np.ndarray
    background_share: float
    background_variance: float


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
    unit = sp.csc_matrix(design @ sp.diags(scale))
    base = y
    back_unit = None
    if background is not None and np.any(background):
        back_unit = background / np.linalg.norm(background)
        coef = max(float(back_unit @ y), 0.0)
        base = y - coef * back_unit
    score = unit.T @ base
    working: np.ndarray = usable[score[usable] > z_select / 2]
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
            cov = np.linalg.pinv(partial.T @ partial, hermitian=True)
        else:
            theta, cov = np.zeros(0), np.zeros((0, 0))
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        p_values = one_sided_p_values(theta, se)
        adjusted = adjust_p_values(p_values, correction, n_candidates)
        keep = (theta > 0) & (adjusted < alpha)
        if keep.all():
            back = back_var = 0.0
            if free is not None:
                back = float(free @ (y - dense @ theta)) / back_norm2
                back_var = 1.0 / back_norm2 + float(loading @ cov @ loading)
            return LeastSquares(columns, theta, cov, back, back_var)
        columns = columns[keep]
    raise ParameterError("fit", "the selection did not settle; check the counts and map")
