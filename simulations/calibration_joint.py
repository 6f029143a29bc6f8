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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.joint import JointResult
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
