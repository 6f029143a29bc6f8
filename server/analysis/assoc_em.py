"""The joint table of two variables from per-report likelihoods, by an accelerated EM.

Each report carries one randomized report of each variable. For report ``r`` and
variable 1's value ``i``, ``L1[r, i]`` is the probability of what the report says about
variable 1 had the client held ``i`` (likewise ``L2[r, j]``); the two reports are
randomized independently given the pair, so the likelihood of the table ``P`` is

    log L(P) = sum_r log( sum_ij L1[r, i] P[i, j] L2[r, j] ),

a mixture likelihood whose maximum over the simplex the EM algorithm climbs (Fanti,
Pihur and Erlingsson, PoPETs 2016, use the same model). Reports with the same pair of
likelihood rows contribute the same term, so they are grouped
(:class:`GroupedLikelihoods`: distinct rows of each variable and a weight per distinct
pair): memory and time grow with the number of distinct groups, never with the number of
reports times the number of cells.

What the fit converges to: the maximizer of ``log L(P) + sum_ij a_ij log P[i, j]``, the
mode of the posterior under a Dirichlet prior of ``prior_reports`` pseudo-reports spread
evenly over the cells (``a_ij = prior_reports / cells``); with ``prior_reports=0`` the
maximum-likelihood estimate. The objective is concave in ``P``, so the fixed point the
iterations reach is its maximum (unique when the prior is positive). Each report carries
little information about the pair, so the maximum-likelihood table sits on the boundary
with spikes and holes; a few tens of pseudo-reports damp those and weigh nothing against
a million reports (docs/association.md gives the measurements).

When it stops: each cycle is one SQUAREM step (Varadhan and Roland, Scand. J. Stat.
2008: two EM steps, an extrapolation along them, and one EM step from there, kept only
if the objective did not fall); it stops when a cycle raises the objective by less than
``tol`` (nats) and moves no cell by more than ``cell_tol``, or after ``max_iter`` cycles,
which the fit reports (``converged_`` False).

Standard errors come from the observed information of the objective at the fit, on the
simplex (the plane where cells sum to one): ``Cov = Z (Z' I Z)^+ Z'`` with ``Z`` an
orthonormal basis of that plane and ``I = sum_g w_g l_g l_g' / (l_g' P)^2 +
diag(a / P^2)``, ``l_g`` the outer product of a group's two likelihood rows.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.squarem import extrapolate
from veil.shared.errors import ParameterError

#: entries of scratch arrays in the E-step and the information (bounds their memory)
CHUNK_ENTRIES = 1 << 22


@dataclasses.dataclass(frozen=True)
class GroupedLikelihoods:
    """Per-report likelihoods, grouped: ``first[u]`` (shape ``(U1, C1)``) and ``second[v]``
    (``(U2, C2)``) are the distinct likelihood rows of the two variables (any positive
    scale per row: it cancels), and group ``g`` holds ``weights[g]`` reports whose rows
    are ``first[rows[g]]`` and ``second[cols[g]]``. Groups are distinct pairs, sorted by
    ``(rows, cols)`` (:meth:`of` builds them so)."""

    first: np.ndarray
    second: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(cls, first: np.ndarray, second: np.ndarray, rows: np.ndarray, cols: np.ndarray,
           weights: np.ndarray | None = None) -> GroupedLikelihoods:
        """Groups from one entry per report (or per partial group, with ``weights``):
        identical ``(rows, cols)`` pairs are merged and their weights added."""
        first = np.asarray(first, dtype=float)
        second = np.asarray(second, dtype=float)
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        weights = np.ones(rows.size) if weights is None else np.asarray(weights, dtype=float)
        if not (rows.shape == cols.shape == weights.shape):
            raise ParameterError("groups", "rows, cols and weights need one entry per group")
        key = rows * second.shape[0] + cols
        distinct, inverse = np.unique(key, return_inverse=True)
        merged = np.bincount(inverse.reshape(-1), weights=weights, minlength=distinct.size)
        keep = merged > 0
        distinct = distinct[keep]
        return cls(first, second, distinct // second.shape[0], distinct % second.shape[0],
                   merged[keep])

    @property
    def shape(self) -> tuple[int, int]:
        """The table's shape: values of variable 1, values of variable 2."""
        return self.first.shape[1], self.second.shape[1]

    @property
    def reports(self) -> float:
        """The number of reports (the sum of the weights)."""
        return float(self.weights.sum())


@dataclasses.dataclass
class JointEM:
    """Fit the joint table of :class:`GroupedLikelihoods` (see the module's docstring).

    Parameters are stored as given and checked in :meth:`fit`. After it: ``table_``
    (``C1 x C2``, summing to one), ``std_errors_`` and ``covariance_`` (of the flattened
    table, row-major), ``objective_`` (the log-likelihood plus the log-prior, up to a
    constant that does not depend on the table, after each cycle), ``iterations_``
    (cycles), ``evaluations_`` (EM steps), ``converged_``, ``seconds_``.
    """

    prior_reports: float = 30.0
    tol: float = 1e-4
    cell_tol: float = 1e-6
    max_iter: int = 1000

    def fit(self, data: GroupedLikelihoods) -> JointEM:
        """Run the accelerated EM from the uniform table, then the standard errors.

        BLAS runs on one thread: the products are thin (a few columns), and threads
        only wait on each other (thirty times slower on a busy two-core machine)."""
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(data)

    def _fit(self, data: GroupedLikelihoods) -> JointEM:
        started = time.perf_counter()
        self._check(data)
        steps = _EmSteps(data, self.prior_reports)
        table = np.full(data.shape, 1.0 / (data.shape[0] * data.shape[1]))
        once, objective = steps(table)
        self.objective_ = [objective]
        self.converged_ = False
        self.iterations_ = 0
        for cycle in range(1, self.max_iter + 1):
            self.iterations_ = cycle
            twice, objective_once = steps(once)
            proposal = extrapolate(table.reshape(1, -1), once.reshape(1, -1),
                                   twice.reshape(1, -1)).reshape(table.shape)
            proposal_once, proposal_objective = steps(proposal)
            if proposal_objective < objective_once:  # keep the monotone EM path
                proposal, (proposal_once, proposal_objective) = twice, steps(twice)
            gain = proposal_objective - objective
            moved = float(np.abs(proposal - table).max())
            table, once, objective = proposal, proposal_once, proposal_objective
            self.objective_.append(objective)
            if gain < self.tol and moved < self.cell_tol:
                self.converged_ = True
                break
        self.evaluations_ = steps.evaluations
        self.table_ = table
        self.covariance_ = simplex_covariance(observed_information(data, table,
                                                                   steps.prior))
        self.std_errors_ = np.sqrt(np.clip(np.diag(self.covariance_), 0.0, None)).reshape(
            table.shape)
        self.seconds_ = time.perf_counter() - started
        return self

    def _check(self, data: GroupedLikelihoods) -> None:
        """Validation of the settings and the data, naming the field at fault."""
        if not (np.isfinite(self.prior_reports) and self.prior_reports >= 0):
            raise ParameterError("prior_reports", "prior_reports must be a number >= 0 (0 is "
                                 f"the maximum-likelihood table); got {self.prior_reports}")
        if not (self.tol > 0 and self.cell_tol > 0):
            raise ParameterError("tol", "tol and cell_tol must be positive")
        if not (isinstance(self.max_iter, int) and self.max_iter >= 1):
            raise ParameterError("max_iter", f"max_iter must be an integer >= 1; got "
                                 f"{self.max_iter!r}")
        if data.weights.size == 0 or data.reports <= 0:
            raise ParameterError("reports", "there are no reports to fit")
        for name, rows in (("first", data.first), ("second", data.second)):
            if rows.ndim != 2 or rows.shape[1] == 0 or not np.all(np.isfinite(rows)):
                raise ParameterError(name, f"the {name} variable's likelihoods must be a "
                                           "finite 2-D array with a column per value")
            if np.any(rows < 0) or np.any(rows.max(axis=1) <= 0):
                raise ParameterError(name, f"the {name} variable's likelihoods must be "
                                           "non-negative, each row with a positive entry")


class _EmSteps:
    """One EM step of the MAP objective and the objective at its starting point.

    The E-step's per-group denominators ``d_g = l_g' P`` come from ``(L1 P)[rows]`` and
    ``L2[cols]`` in chunks of :data:`CHUNK_ENTRIES` entries; the M-step's sums
    ``L1' diag-weights L2`` go through a sparse ``U1 x U2`` matrix whose values are
    ``w_g / d_g``, built once and refilled each step.
    """

    def __init__(self, data: GroupedLikelihoods, prior_reports: float) -> None:
        self.data = data
        cells = data.shape[0] * data.shape[1]
        self.prior = np.full(data.shape, prior_reports / cells)
        self.total = data.reports + prior_reports
        self.ratios = sp.csr_matrix(
            (data.weights.copy(), (data.rows, data.cols)),
            shape=(data.first.shape[0], data.second.shape[0]),
        )
        self.ratios.sort_indices()  # groups are sorted by (rows, cols): data in group order
        self.evaluations = 0

    def __call__(self, table: np.ndarray) -> tuple[np.ndarray, float]:
        data = self.data
        denominators = group_denominators(data, table)
        if not np.all(denominators > 0):  # a table that rules out a report: no EM step from it
            self.evaluations += 1
            return table, -np.inf
        objective = float(data.weights @ np.log(denominators))
        if self.prior.any():
            objective += float((self.prior * np.log(np.maximum(table, 1e-300))).sum())
        self.ratios.data = data.weights / denominators
        sums = data.first.T @ (self.ratios @ data.second)
        self.evaluations += 1
        return (table * sums + self.prior) / self.total, objective


def group_denominators(data: GroupedLikelihoods, table: np.ndarray) -> np.ndarray:
    """``d_g = L1[rows[g]] P L2[cols[g]]'`` for every group: each group's likelihood."""
    projected = data.first @ table
    out = np.empty(data.rows.size)
    step = max(1, CHUNK_ENTRIES // table.shape[1])
    for start in range(0, data.rows.size, step):
        part = slice(start, start + step)
        out[part] = np.einsum("gj,gj->g", projected[data.rows[part]], data.second[data.cols[part]])
    return out


def observed_information(data: GroupedLikelihoods, table: np.ndarray,
                         prior: np.ndarray) -> np.ndarray:
    """The observed information of the objective at ``table``, ``cells x cells`` (cells in
    row-major order): ``sum_g w_g l_g l_g' / d_g^2`` plus the prior's ``a / P^2``.

    Computed without forming ``l_g``: the sum is ``K1' S K2`` with ``K1[u] = vec(L1[u]
    L1[u]')`` and ``K2[v] = vec(L2[v] L2[v]')`` and ``S`` the sparse ``w_g / d_g^2``."""
    c1, c2 = table.shape
    weights = data.weights / group_denominators(data, table) ** 2
    pairs = sp.csr_matrix((weights, (data.rows, data.cols)),
                          shape=(data.first.shape[0], data.second.shape[0]))
    second_pairs = np.einsum("vj,vl->vjl", data.second, data.second).reshape(-1, c2 * c2)
    inner = pairs @ second_pairs  # (U1, c2*c2)
    info = np.zeros((c1 * c1, c2 * c2))
    step = max(1, CHUNK_ENTRIES // (c1 * c1))
    for start in range(0, data.first.shape[0], step):
        part = slice(start, start + step)
        first_pairs = np.einsum("ui,uk->uik", data.first[part], data.first[part])
        info += first_pairs.reshape(-1, c1 * c1).T @ inner[part]
    info = info.reshape(c1, c1, c2, c2).transpose(0, 2, 1, 3).reshape(c1 * c2, c1 * c2)
    positive = table.reshape(-1) > 0
    diagonal = np.zeros(c1 * c2)
    diagonal[positive] = prior.reshape(-1)[positive] / table.reshape(-1)[positive] ** 2
    information: np.ndarray = info + np.diag(diagonal)
    return information


def simplex_covariance(information: np.ndarray) -> np.ndarray:
    """``Z (Z' I Z)^+ Z'``: the inverse information on the plane of tables summing to one
    (``Z`` an orthonormal basis of the vectors whose entries sum to zero). Directions the
    reports do not inform (a singular ``Z' I Z``) get no variance from the pseudo-inverse
    rather than an infinite one; the standard errors then understate those cells'
    uncertainty, which happens only where the data cannot tell cells apart at all."""
    cells = information.shape[0]
    if cells == 1:
        return np.zeros((1, 1))
    basis, _ = np.linalg.qr(np.eye(cells)[:, :-1] - 1.0 / cells)
    reduced = basis.T @ information @ basis
    inverse = np.linalg.pinv((reduced + reduced.T) / 2.0, hermitian=True)
    covariance: np.ndarray = basis @ inverse @ basis.T
    return covariance
