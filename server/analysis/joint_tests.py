"""The joint table's statistics: the covariance of the cell estimates, the simplex
projection, marginals and conditionals with their errors, and the independence test.

Notation: ``theta`` the unbiased cell shares of a joint metric (its cell oracle's
estimator, :mod:`veil.server.analysis.oracles`), ``pi`` the population's cell
shares, ``N`` the reports, ``(p, q)`` the oracle's support probabilities and
``Z`` the support vector of one report (1 for each cell it supports).

**Covariance.** ``theta_x = (mean(Z_x) - q) / (p - q)`` over independent reports,
so ``Cov(theta) = Cov(Z) / (N (p - q)^2)``. Off the diagonal,
``Cov(Z_x, Z_y) = P(Z_x = Z_y = 1) - rho_x rho_y`` with ``rho = q + (p - q) pi``:

* GRR supports exactly one cell per report, so ``P(Z_x = Z_y = 1) = 0`` and
  ``Cov(Z_x, Z_y) = -rho_x rho_y = -(p - q)^2 (pi_x + k)(pi_y + k)``, ``k = q / (p - q)``;
* OUE sets its bits independently given the value: ``P(Z_x = Z_y = 1) = (pi_x + pi_y) p q
  + (1 - pi_x - pi_y) q^2``, hence ``Cov(Z_x, Z_y) = -(p - q)^2 pi_x pi_y`` (``k = 0``);
* OLH and Hadamard support two cells together as OUE does when their hashes are pairwise
  independent, which the linear families are for all but a few pairs (cells whose digit
  vectors are multiples of each other; rows whose XOR is a third row): the same ``k = 0``
  model, checked by the calibration grid.

So ``Cov(theta) = diag(s) - w w^T / N`` with ``w = pi + k`` and ``s = se^2 + w^2 / N``
(``se`` each cell's stated standard error, so the diagonal is the oracle's variance).
``pi`` is read from the projected shares. Every quantity below needs only ``s`` and
``w``: ``O(cells)`` memory, whatever the table's size.

**Independence test.** With the table as ``R x C`` (the last variable against the
others), independence is ``g_ij = pi_ij - pi_i+ pi_+j = 0`` for ``i < R - 1``,
``j < C - 1`` (the other cells follow from the margins). The Wald statistic
``W = g^T (J Sigma J^T)^{-1} g`` with ``J`` the Jacobian of ``g`` at the estimated
margins is chi-square with ``(R - 1)(C - 1)`` degrees of freedom under independence
(the delta method; Gaboardi and Rogers, ICML 2018, test the same hypothesis by a
projected chi-square over GRR's reports). The covariance ``Sigma`` is the
randomization's, not a multinomial's: an ordinary chi-square on the estimated
counts would reject far too often. ``J`` and ``J^T`` are applied without forming
them (``O(cells)`` each); the system is solved directly up to
:data:`DENSE_CONTRASTS` contrasts and by conjugate gradients beyond.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.sparse.linalg as sla

from veil.server.analysis.stats import chi2_sf

#: most interaction contrasts whose matrix the test builds (about 32 MB); more are solved
#: by conjugate gradients
DENSE_CONTRASTS = 2000


def project_to_simplex(values: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``values`` onto the probability simplex (non-negative,
    summing to 1): ``max(v - tau, 0)`` with ``tau`` found by sorting (Held, Wolfe and
    Crowder 1974)."""
    v = np.asarray(values, dtype=float).reshape(-1)
    ordered = np.sort(v)[::-1]
    cumulative = np.cumsum(ordered) - 1.0
    ranks = np.arange(1, v.size + 1)
    last = np.flatnonzero(ordered - cumulative / ranks > 0)[-1]
    tau = cumulative[last] / (last + 1)
    out: np.ndarray = np.maximum(v - tau, 0.0)
    return out


@dataclasses.dataclass(frozen=True)
class CellCovariance:
    """``Cov(theta) = diag(s) - w w^T / n`` (see the module docstring)."""

    s: np.ndarray
    w: np.ndarray
    n: float

    @classmethod
    def of(cls, std_errors: np.ndarray, shares: np.ndarray, offset: float, reports: int,
           ) -> CellCovariance:
        """The model from the cells' standard errors, the non-negative shares ``pi`` and
        ``k`` (``offset``: ``q / (p - q)`` for an oracle that supports one cell per report,
        else 0)."""
        w = np.asarray(shares, dtype=float).reshape(-1) + offset
        se = np.asarray(std_errors, dtype=float).reshape(-1)
        return cls(se**2 + w**2 / reports, w, float(reports))

    def group_variance(self, groups: np.ndarray) -> np.ndarray:
        """Variance of each group's sum of cells (``groups``: each cell's group number)."""
        size = int(groups.max()) + 1
        s = np.bincount(groups, self.s, minlength=size)
        w = np.bincount(groups, self.w, minlength=size)
        out: np.ndarray = s - w**2 / self.n
        return out


@dataclasses.dataclass(frozen=True)
class Ratios:
    """Estimates of ``a / b`` per cell (``b`` the cell's group sum) and their standard errors
    by the delta method; ``nan`` where the group's estimated sum is not positive."""

    estimate: np.ndarray
    std_error: np.ndarray


def conditionals(theta: np.ndarray, cov: CellCovariance, groups: np.ndarray) -> Ratios:
    """``theta_x / theta_G(x)`` for each cell ``x`` in group ``G(x)`` (a conditional share:
    the cell's row), with ``Var(a/b) ~ (Var a - 2 r Cov(a, b) + r^2 Var b) / b^2``,
    ``Cov(a, b) = s_x - w_x sum_G w / n`` (the cell is one of its group's)."""
    theta = np.asarray(theta, dtype=float).reshape(-1)
    size = int(groups.max()) + 1
    totals = np.bincount(groups, theta, minlength=size)[groups]
    w_totals = np.bincount(groups, cov.w, minlength=size)[groups]
    var_a = cov.s - cov.w**2 / cov.n
    cov_ab = cov.s - cov.w * w_totals / cov.n
    var_b = cov.group_variance(groups)[groups]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(totals > 0, theta / totals, np.nan)
        variance = (var_a - 2 * ratio * cov_ab + ratio**2 * var_b) / totals**2
    return Ratios(ratio, np.sqrt(np.maximum(variance, 0.0)))


def _jacobian(rows: np.ndarray, cols: np.ndarray) -> tuple[Any, Any]:
    """``J u`` and ``J^T v`` for ``g_ij = pi_ij - pi_i+ pi_+j`` (``i < R - 1``,
    ``j < C - 1``) at margins ``rows`` (``pi_i+``) and ``cols`` (``pi_+j``); ``u`` is
    ``(R, C, k)``, ``v`` is ``((R - 1)(C - 1), k)``."""
    r, c = rows.size, cols.size

    def apply(u: np.ndarray) -> np.ndarray:
        row_sums, col_sums = u.sum(axis=1), u.sum(axis=0)
        out: np.ndarray = u - cols[None, :, None] * row_sums[:, None, :] \
            - rows[:, None, None] * col_sums[None, :, :]
        kept: np.ndarray = out[: r - 1, : c - 1].reshape((r - 1) * (c - 1), -1)
        return kept

    def apply_transposed(v: np.ndarray) -> np.ndarray:
        padded = np.zeros((r, c, v.shape[-1]))
        padded[: r - 1, : c - 1] = v.reshape(r - 1, c - 1, -1)
        by_row = np.einsum("ijk,j->ik", padded, cols)
        by_col = np.einsum("ijk,i->jk", padded, rows)
        out: np.ndarray = padded - by_row[:, None, :] - by_col[None, :, :]
        return out

    return apply, apply_transposed


@dataclasses.dataclass(frozen=True)
class IndependenceTest:
    """The Wald test of independence of the table's rows and columns."""

    statistic: float
    dof: int
    p_value: float
    method: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def independence_test(theta: np.ndarray, cov: CellCovariance, shape: tuple[int, int],
                      ) -> IndependenceTest:
    """The Wald test that the ``shape = (R, C)`` table's rows and columns are independent
    (see the module docstring)."""
    r, c = shape
    table = np.asarray(theta, dtype=float).reshape(r, c)
    rows, cols = table.sum(axis=1), table.sum(axis=0)
    g = (table - np.outer(rows, cols))[: r - 1, : c - 1].reshape(-1)
    apply, apply_transposed = _jacobian(rows, cols)
    s = cov.s.reshape(r, c, 1)
    jw = apply(cov.w.reshape(r, c, 1))[:, 0]
    dof = (r - 1) * (c - 1)

    def matrix_product(v: np.ndarray) -> np.ndarray:
        v = v.reshape(dof, -1)
        out: np.ndarray = apply(s * apply_transposed(v)) - np.outer(jw, jw @ v) / cov.n
        return out

    if dof <= DENSE_CONTRASTS:
        matrix = matrix_product(np.eye(dof))
        solution = np.linalg.solve((matrix + matrix.T) / 2, g)
        method = "wald (delta method, exact solve)"
    else:
        operator = sla.LinearOperator((dof, dof), matvec=lambda v: matrix_product(v)[:, 0],
                                      dtype=float)
        solution, _ = sla.cg(operator, g, rtol=1e-8, maxiter=2000)
        method = "wald (delta method, conjugate gradients)"
    statistic = float(np.dot(g, solution))
    return IndependenceTest(statistic, dof, float(chi2_sf(statistic, dof)), method)
