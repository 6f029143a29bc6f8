"""The joint decoder's case of the calibration grid (:mod:`veil.simulations.calibration`).

A 4 x 3 table with dependence (:data:`ROWS`, :data:`CONDITIONALS`) declared as a joint
metric at the grid's epsilon (``report_epsilon`` its default, ``epsilon / 2``; the cell
oracle chosen by ``auto``: OLH or OUE at small epsilon, GRR at large). Each collection
draws the composition ``Multinomial(N, table)`` and the cell oracle's statistic with its
exact sampler (:func:`~veil.simulations.oracle_encoding.simulate_oracle_counts`), and is
decoded by :func:`~veil.server.analysis.joint.decode_joint`. Calibrated: the twelve cells,
the seven marginal shares (their variance rests on the cells' covariance,
:mod:`veil.server.analysis.joint_tests`) and the twelve conditionals ``P(y | x)`` (the
delta method). A conditional's interval is honest only once its condition's share is
estimated well: where a condition's share is below :data:`CONDITION_SDS` standard errors,
or its estimate was not positive in some collection (its conditionals undefined there),
its conditionals are flagged ``documented`` (docs/association.md says why).

The marginals case (:func:`draw_marginals`): four dependent variables of 3, 2, 3 and 2
values (:func:`latent_population`: two latent classes), declared with ``marginals =
k`` at the grid's epsilon, decoded by
:func:`~veil.server.analysis.joint_marginals.decode_marginals`. Each collection
assigns its installations to the marginals uniformly, draws each marginal's
composition from the population and its cell oracle's statistic. Calibrated: every
pairwise cell and one-way share of the consistent (linear) estimate, whose stated
errors are derived through the projection.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.joint import JointResult
from veil.server.analysis.joint_marginals import MarginalsResult
from veil.server.counts import counts_document
from veil.shared.kinds.joint import JointParams
from veil.shared.statistics import statistic_for
from veil.simulations.oracle_encoding import simulate_oracle_counts

ROWS = np.array([0.4, 0.3, 0.2, 0.1])
CONDITIONALS = np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
#: a condition's share below this many of its standard errors leaves the delta method's
#: range: its conditionals are flagged documented
CONDITION_SDS = 10.0
#: where docs/association.md says a conditional leaves its band
CONDITIONAL_LIMITS = "association.md#conditionals"


def draw_joint(reports: int, epsilon: float, runs: int, rng: np.random.Generator,
               ) -> dict[str, Any]:
    """The fields of a :class:`~veil.simulations.calibration.Draws`: ``runs`` decoded
    collections of ``reports`` reports at ``epsilon``."""
    params = JointParams(of=("x", "y"), domains=(("x0", "x1", "x2", "x3"), ("y0", "y1", "y2")),
                         epsilon=epsilon)
    table = (ROWS[:, None] * CONDITIONALS).reshape(-1)
    field = statistic_for(params).fields[0].name
    labels = [params.cell_label(i) for i in range(params.cells)]
    labels += [f"P({v.name}={label})" for v in params.variables for label in v.labels]
    labels += [f"P(y={y} | x={x})" for x in params.variables[0].labels
               for y in params.variables[1].labels]
    truth = np.concatenate([table, ROWS, table.reshape(4, 3).sum(axis=0),
                            CONDITIONALS.reshape(-1)])
    estimates, errors = np.zeros((runs, len(labels))), np.zeros((runs, len(labels)))
    for run in range(runs):
        counts = simulate_oracle_counts(params.cell_oracle, rng.multinomial(reports, table), rng)
        result = decode_counts(counts_document(params, np.array([reports]), counts, "m", field))
        assert isinstance(result, JointResult)
        marginals = result.marginal_rows
        estimates[run] = [*result.column("proportion"), *(m["proportion"] for m in marginals),
                          *(c["conditional"] for c in result.conditional_rows)]
        errors[run] = [*result.column("prop_std_error"), *(m["prop_std_error"] for m in marginals),
                       *(c["std_error"] for c in result.conditional_rows)]
    row_se = np.sqrt(np.mean(errors[:, params.cells:params.cells + 4] ** 2, axis=0))
    undefined = np.asarray(np.isnan(estimates[:, -12:]).reshape(runs, 4, 3).any(axis=(0, 2)))
    weak = [x for x in range(4) if ROWS[x] < CONDITION_SDS * row_se[x] or undefined[x]]
    documented = {labels[-12 + 3 * x + y]: CONDITIONAL_LIMITS for x in weak for y in range(3)}
    return {"labels": tuple(labels), "truth": truth, "estimates": estimates,
            "std_errors": errors, "documented": documented}


#: the marginals case: each variable's number of values, the latent classes' shares and
#: the seed of their conditional distributions
MARGINAL_SIZES = (3, 2, 3, 2)
LATENT_SHARES = np.array([0.6, 0.4])
LATENT_SEED = 3


def latent_population(sizes: tuple[int, ...] = MARGINAL_SIZES) -> np.ndarray:
    """The population's joint table over ``sizes``: two latent classes
    (:data:`LATENT_SHARES`), each variable drawn from a Dirichlet(1) distribution of its
    class (seed :data:`LATENT_SEED`), so every pair of variables is associated."""
    rng = np.random.default_rng(LATENT_SEED)
    table = np.zeros(sizes)
    for share in LATENT_SHARES:
        factors = [rng.dirichlet(np.ones(size)) for size in sizes]
        term = np.asarray(share)
        for factor in factors:
            term = np.multiply.outer(term, factor)
        table += term
    return table


def marginals_document(params: JointParams, population: np.ndarray, reports: int,
                       rng: np.random.Generator) -> dict[str, Any]:
    """One collection's counts document: ``reports`` installations assigned to the marginals
    uniformly, each marginal's composition drawn from ``population`` (a joint table over
    every variable) and its cell oracle's statistic with the exact sampler."""
    assigned = rng.multinomial(reports, np.full(params.cohorts, 1.0 / params.cohorts))
    rows = []
    for j, variables in enumerate(params.marginal_sets):
        others = tuple(a for a in range(population.ndim) if a not in variables)
        shares = population.sum(axis=others).reshape(-1)
        true_counts = np.zeros(params.oracle_cells, dtype=np.int64)
        true_counts[: shares.size] = rng.multinomial(assigned[j], shares / shares.sum())
        rows.append(simulate_oracle_counts(params.cell_oracle, true_counts, rng))
    field = statistic_for(params).fields[0].name
    return counts_document(params, assigned, np.array(rows), "m", field)


def marginals_params(epsilon: float, marginals: int = 2,
                     sizes: tuple[int, ...] = MARGINAL_SIZES) -> JointParams:
    """A joint metric of variables ``v0, v1, ...`` of ``sizes`` values, reported as assigned
    marginals of ``marginals`` variables at ``epsilon`` (``report_epsilon`` its default)."""
    return JointParams(of=tuple(f"v{i}" for i in range(len(sizes))),
                       domains=tuple(tuple(f"x{j}" for j in range(size)) for size in sizes),
                       epsilon=epsilon, marginals=marginals)


def draw_marginals(reports: int, epsilon: float, runs: int, rng: np.random.Generator,
                   marginals: int = 2) -> dict[str, Any]:
    """The fields of a :class:`~veil.simulations.calibration.Draws`: ``runs`` decoded
    collections of the marginals case (see the module docstring)."""
    params = marginals_params(epsilon, marginals)
    population = latent_population()
    labels: list[str] = []
    truth: list[float] = []
    for a, b in itertools.combinations(range(population.ndim), 2):
        others = tuple(c for c in range(population.ndim) if c not in (a, b))
        pair = population.sum(axis=others)
        for (x, y), share in np.ndenumerate(pair):
            labels.append(f"v{a}=x{x}, v{b}=x{y}")
            truth.append(float(share))
    for a in range(population.ndim):
        one = population.sum(axis=tuple(c for c in range(population.ndim) if c != a))
        labels += [f"P(v{a}=x{x})" for x in range(one.size)]
        truth += one.tolist()
    estimates, errors = np.zeros((runs, len(labels))), np.zeros((runs, len(labels)))
    for run in range(runs):
        result = decode_counts(marginals_document(params, population, reports, rng))
        assert isinstance(result, MarginalsResult)
        estimates[run] = [*result.column("proportion"),
                          *(m["proportion"] for m in result.marginal_rows)]
        errors[run] = [*result.column("prop_std_error"),
                       *(m["prop_std_error"] for m in result.marginal_rows)]
    return {"labels": tuple(labels), "truth": np.array(truth), "estimates": estimates,
            "std_errors": errors}
