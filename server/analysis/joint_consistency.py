"""Consistent low-order marginals: the weighted least-squares projection, its variances and
the non-negative version (CALM's consistency step, Zhang et al., CCS 2018).

Notation: marginal ``j`` is a table ``T_j`` over the variables ``S_j`` (sorted
positions in ``of``), estimated without bias as ``T^_j`` from its own reports, with
weight ``w_j`` (the inverse of its cells' mean variance) and, per cell, the covariance
model ``diag(s_j) - u_j u_j^T / n_j`` of :class:`~veil.server.analysis.joint_tests.CellCovariance`.
Different marginals come from different installations, so their estimates are
independent. ``d_a`` is variable ``a``'s number of values and ``|A|`` the cells of a
set ``A`` of variables.

**Components.** A table over ``S`` splits orthogonally into components ``c_U``,
``U`` a subset of ``S``, each a function of ``x_U`` alone with zero sum over any one
of ``U``'s variables (the ANOVA decomposition). Summing the table over ``S \\ A`` to
the marginal on ``A`` keeps the components with ``U`` in ``A``: ``sum_{U in A}
h_U / |A \\ U|`` with ``h_U = |S \\ U| c_U`` on ``dom(U)``, and ``h_U(y) = sum_x
T(x) phi_U(y, x_U)``, ``phi_U(y, z) = prod_{a in U} (1[y_a = z_a] - 1 / d_a)``.

**Consistency.** Tables agree on every shared marginal exactly when, for every set
``U`` held by two or more of them (*shared*), their ``h_U`` agree, and all sum to 1
(``U`` empty). Minimizing ``sum_j w_j ||T_j - T^_j||^2`` under these constraints
separates by component (they are orthogonal, and the weight is one number per
table): ``h_U`` becomes ``g_U = sum_{j holds U} a_jU h^_jU`` with ``a_jU``
proportional to ``w_j / |S_j \\ U|`` (the inverse variance of ``h^_jU``, up to
a factor common to the tables), every other component stays. So
``T~_j = T^_j + sum_{U shared} (g_U - h^_jU) / |S_j \\ U|`` spread over ``S_j``,
plus ``(1 - sum T^_j) / |S_j|``; this is the order-free form of CALM's and PriView's
update, and the tests check it against the constrained least squares it solves.

**Variances.** The marginal on ``P`` (a subset of a host table ``S_j``) of the
consistent tables is linear in the estimates, ``sum_{j'} sum_x L_j'(x) T^_j'(x)``
with ``L_j'(x) = 1[j' = j] 1[x_P = y] + sum_{U} b_U phi_U(y_U, x_U)`` over
``U`` shared (or empty) in ``P`` and ``S_j'``, ``b_U = (a_j'U - 1[j' = j]) / |P \\ U|``
(``a`` is 0 for the empty set, whose ``g`` is the constant 1). Expanding each ``phi``,
``L_j'(x) = sum_V c_V 1[x_V = y_V]`` with scalar ``c_V``, so its variance
``sum_x s_x L(x)^2 - (sum_x u_x L(x))^2 / n`` is
``sum_{V, V'} c_V c_V' S_{V u V'}(y) - (sum_V c_V U_V(y))^2 / n`` with ``S_W``, ``U_W``
the sums of ``s`` and ``u`` over the cells of each ``y_W``: a few marginal sums per
pair of tables, whatever the tables' size.

**Non-negativity.** The projection is unbiased but may leave cells below 0. As CALM
does, projections alternate: each table onto the simplex (non-negative, summing to 1),
then onto the consistent set, until no cell is below ``-NEGATIVE_TOLERANCE``
or after ``MAX_ROUNDS``; the last step is the consistent projection, so shared
marginals agree exactly. Both are projections in the same weighted metric (the simplex
constraint is per table, the weight one number per table), so the alternation
converges to a point of their intersection. The stated errors are the linear
projection's; the non-negative table is reported beside it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from veil.server.analysis.joint_tests import project_to_simplex

#: the non-negative tables stop once no cell is below minus this
NEGATIVE_TOLERANCE = 1e-9
#: most rounds of simplex and consistent projections
MAX_ROUNDS = 2000

Subset = tuple[int, ...]


def subsets(variables: Subset) -> list[Subset]:
    """Every subset of ``variables`` (sorted tuples), the empty one first."""
    return [combo for size in range(len(variables) + 1)
            for combo in itertools.combinations(variables, size)]


@dataclasses.dataclass(frozen=True)
class NonNegative:
    """The non-negative consistent tables, the rounds taken and their lowest cell."""

    tables: list[np.ndarray]
    rounds: int
    lowest: float


class Consistency:
    """The weighted least-squares projection of tables over ``sets`` (variables of
    ``sizes`` values) onto consistent tables, with weights ``weights`` (module
    docstring)."""

    def __init__(self, sets: Sequence[Subset], sizes: Sequence[int],
                 weights: Sequence[float] | np.ndarray) -> None:
        self.sets = [tuple(s) for s in sets]
        self.sizes = tuple(sizes)
        self.weights = np.asarray(weights, dtype=float)
        holders: dict[Subset, list[int]] = {}
        for j, variables in enumerate(self.sets):
            for u in subsets(variables)[1:]:
                holders.setdefault(u, []).append(j)
        #: every non-empty set of variables two or more tables hold, and its holders
        self.shared = {u: tables for u, tables in holders.items() if len(tables) > 1}
        #: ``a_jU`` of each shared ``U`` by holder ``j``
        self.alpha: dict[tuple[int, Subset], float] = {}
        for u, tables in self.shared.items():
            raw = np.array([self.weights[j] / self.cells(self.sets[j], u) for j in tables])
            for j, a in zip(tables, raw / raw.sum(), strict=True):
                self.alpha[(j, u)] = float(a)

    def cells(self, variables: Subset, without: Subset = ()) -> int:
        """``|variables \\ without|``: the cells of the variables not in ``without``."""
        return math.prod(self.sizes[a] for a in variables if a not in without)

    def host(self, target: Subset) -> int:
        """The first table that holds the variables ``target``."""
        return next(j for j, s in enumerate(self.sets) if set(target) <= set(s))

    def holders(self, target: Subset) -> list[int]:
        """Every table that holds the variables ``target``."""
        return [j for j, s in enumerate(self.sets) if set(target) <= set(s)]

    def marginal(self, table: np.ndarray, variables: Subset, target: Subset) -> np.ndarray:
        """The sum of ``table`` (over ``variables``) over the variables not in ``target``,
        its axes those of ``target``."""
        drop = tuple(i for i, a in enumerate(variables) if a not in target)
        out: np.ndarray = table.sum(axis=drop) if drop else table
        return out

    def spread(self, values: np.ndarray, of: Subset, onto: Subset) -> np.ndarray:
        """``values`` over the variables ``of`` as an array that broadcasts over ``onto``."""
        return values.reshape([self.sizes[a] if a in of else 1 for a in onto])

    def component(self, table: np.ndarray, variables: Subset, u: Subset) -> np.ndarray:
        """``h_U``: the ``U`` component of the table's marginal on ``U`` (over ``dom(U)``)."""
        out = self.marginal(table, variables, u)
        for axis in range(len(u)):
            out = out - out.mean(axis=axis, keepdims=True)
        return out

    def project(self, tables: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The consistent tables nearest ``tables`` in the weighted metric."""
        h = {(j, u): self.component(tables[j], self.sets[j], u)
             for u, holders in self.shared.items() for j in holders}
        g = {u: sum(self.alpha[(j, u)] * h[(j, u)] for j in holders)
             for u, holders in self.shared.items()}
        out = []
        for j, (table, variables) in enumerate(zip(tables, self.sets, strict=True)):
            new = table + (1.0 - table.sum()) / table.size
            for u in subsets(variables)[1:]:
                if u in self.shared:
                    new = new + self.spread((g[u] - h[(j, u)]) / self.cells(variables, u),
                                            u, variables)
            out.append(new)
        return out

    def nonnegative(self, consistent: Sequence[np.ndarray]) -> NonNegative:
        """Alternate simplex and consistent projections from the ``consistent`` tables
        (module docstring)."""
        current = list(consistent)
        rounds = 0
        while rounds < MAX_ROUNDS and min(float(t.min()) for t in current) < -NEGATIVE_TOLERANCE:
            current = self.project([project_to_simplex(t).reshape(t.shape) for t in current])
            rounds += 1
        return NonNegative(current, rounds, min(float(t.min()) for t in current))

    def estimate(self, consistent: Sequence[np.ndarray], target: Subset) -> np.ndarray:
        """The marginal on ``target`` of consistent tables (the same from every holder)."""
        j = self.host(target)
        return self.marginal(consistent[j], self.sets[j], target)

    def coefficients(self, target: Subset, host: int, other: int) -> dict[Subset, float]:
        """``c_V`` of ``L_other`` for the marginal on ``target`` hosted by ``host``."""
        common = tuple(a for a in target if a in self.sets[other])
        coefficients: dict[Subset, float] = {}
        for u in subsets(common):
            own = 1.0 if other == host else 0.0
            if u and u not in self.shared:
                continue
            b = (self.alpha.get((other, u), 0.0) - own) / self.cells(target, u)
            if b == 0.0:
                continue
            for v in subsets(u):
                scale = math.prod(-1.0 / self.sizes[a] for a in u if a not in v)
                coefficients[v] = coefficients.get(v, 0.0) + b * scale
        if other == host:
            coefficients[target] = coefficients.get(target, 0.0) + 1.0
        return coefficients

    def variance(self, target: Subset, s: Sequence[np.ndarray], u: Sequence[np.ndarray],
                 reports: Sequence[float] | np.ndarray) -> np.ndarray:
        """The variance of each cell of :meth:`estimate` on ``target`` (of the linear
        projection), from each table's covariance model ``diag(s_j) - u_j u_j^T / n_j``
        (module docstring)."""
        host = self.host(target)
        shape = tuple(self.sizes[a] for a in target)
        total = np.zeros(shape)
        for other, variables in enumerate(self.sets):
            c = self.coefficients(target, host, other)
            if not c:
                continue

            def summed(values: np.ndarray, over: Subset, variables: Subset = variables,
                       ) -> np.ndarray:
                return self.spread(self.marginal(values, variables, over), over, target)

            quadratic = sum(cv * cw * summed(s[other], tuple(sorted(set(v) | set(w))))
                            for (v, cv), (w, cw) in itertools.product(c.items(), repeat=2))
            linear = sum(cv * summed(u[other], v) for v, cv in c.items())
            total = total + quadratic - np.square(linear) / reports[other]
        return total
