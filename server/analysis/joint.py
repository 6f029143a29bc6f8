"""The decoder of joint metrics: the joint table, its marginals, conditionals and a test of
independence.

A joint metric's reports are its cell oracle's (:mod:`veil.shared.kinds.joint`), so
the cells' unbiased shares, standard errors and p-values are that oracle's decoder's
(:mod:`veil.server.analysis.oracles`), for the population estimand of
docs/analysis.md. On top of them (:mod:`veil.server.analysis.joint_tests`):

* **consistent shares**: the Euclidean projection of the unbiased shares onto the
  simplex (non-negative, summing to 1; the ``consistent`` column). The intervals stay
  those of the unbiased shares, which cover as stated; the projection has lower error
  (docs/association.md measures both);
* **marginals** of each variable: sums of unbiased cells, their variance from the
  cells' covariance;
* **conditionals** ``P(last variable | the others)``: ratios of unbiased sums, their
  errors by the delta method (``nan`` where the condition's estimated share is not
  positive);
* the **independence test** of the last variable against the others (a Wald test with
  the randomization's covariance).

:class:`JointResult` is a :class:`~veil.server.analysis.results.DecodeResult` with one
row per cell (a column per variable), and also writes ``conditional.csv``,
``marginals.csv`` and ``heatmap.png`` (:mod:`veil.server.analysis.joint_charts`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from veil.server.analysis.closed_form import base_summary, require_reports, start_decode
from veil.server.analysis.decoders import DECODERS, DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.joint_tables import JointTablesResult, one_way_rows
from veil.server.analysis.joint_tests import (
    CellCovariance,
    conditionals,
    independence_test,
    project_to_simplex,
)
from veil.server.analysis.stats import z_quantile
from veil.server.analysis.tables import RESULT_COLUMNS, frequency_rows
from veil.server.counts import CountsArrays
from veil.shared.kinds import GrrParams
from veil.shared.kinds.joint import JointParams

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes

#: columns of ``conditional.csv``
CONDITIONAL_COLUMNS = ("metric", "given", "value", "conditional", "std_error", "low_95",
                       "high_95", "given_share", "given_std_error")
def variable_columns(params: JointParams) -> tuple[str, ...]:
    """The results table's column of each variable: its name, or ``var_NAME`` where the
    name is one of the table's other columns."""
    return tuple(f"var_{name}" if name in (*RESULT_COLUMNS, "consistent") else name
                 for name in params.of)


@dataclasses.dataclass
class JointResult(JointTablesResult):
    """A decoded joint table: ``rows`` one per cell, ``conditional_rows`` the conditional
    shares of the last variable, ``marginal_rows`` each variable's marginal shares."""

    conditional_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def conditional_to_pandas(self) -> pandas.DataFrame:
        """``conditional.csv`` as a DataFrame."""
        return self.side_frame(CONDITIONAL_COLUMNS, self.conditional_rows)

    def plot(self, ax: Axes | None = None, top: int = 30) -> Axes:
        """The heatmap of the joint shares (the ``top`` conditions of largest share)."""
        from veil.server.analysis.joint_charts import draw_heatmap

        return draw_heatmap(self, ax, top)

    def side_tables(self) -> dict[str, tuple[tuple[str, ...], list[dict[str, Any]]]]:
        """``conditional.csv`` and ``marginals.csv``."""
        return {"conditional": (CONDITIONAL_COLUMNS, self.conditional_rows),
                **super().side_tables()}

    def save_heatmap(self, path: Path) -> None:
        from veil.server.analysis.joint_charts import save_heatmap

        save_heatmap(self, path)


def _cell_estimates(counts: CountsArrays, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The unbiased cell shares and their standard errors: the cell oracle's decoder on
    the same counts (the cell oracle's category ``str(i)`` is cell ``i``)."""
    params = counts.params
    assert isinstance(params, JointParams)
    oracle = params.cell_oracle
    inner = dataclasses.replace(counts, params=oracle)
    decoded = DECODERS.lookup(oracle.mechanism_name)(inner, DecodeOptions(confidence=confidence))
    by_cell = {row["value"]: row for row in decoded.rows}
    rows = [by_cell[str(i)] for i in range(params.cells)]
    return (np.array([row["proportion"] for row in rows]),
            np.array([row["prop_std_error"] for row in rows]))


def _marginals(params: JointParams, metric: str, theta: np.ndarray, cov: CellCovariance,
               confidence: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each variable's marginal shares: rows for ``marginals.csv`` and the summary's."""
    index = np.indices(params.shape).reshape(len(params.shape), -1)
    estimates = [(np.bincount(index[axis], theta, minlength=len(variable.labels)),
                  np.sqrt(np.maximum(cov.group_variance(index[axis]), 0.0)))
                 for axis, variable in enumerate(params.variables)]
    return one_way_rows(metric, [(v.name, v.labels) for v in params.variables], estimates,
                        confidence)


def _conditional_rows(params: JointParams, metric: str, theta: np.ndarray,
                      cov: CellCovariance, z: float) -> list[dict[str, Any]]:
    """``P(last variable | the others)`` for every cell (``conditional.csv``)."""
    columns = params.shape[-1]
    groups = np.arange(params.cells) // columns
    ratios = conditionals(theta, cov, groups)
    given = np.bincount(groups, theta)
    given_se = np.sqrt(np.maximum(cov.group_variance(groups), 0.0))
    last = params.variables[-1]
    rows = []
    for cell in range(params.cells):
        row_of = cell // columns
        label = params.cell_label(cell)
        share, se = float(ratios.estimate[cell]), float(ratios.std_error[cell])
        defined = bool(np.isfinite(share))
        rows.append({
            "metric": metric, "given": label.rsplit(", ", 1)[0],
            "value": last.labels[cell % columns],
            "conditional": share, "std_error": se if defined else float("nan"),
            "low_95": min(max(share - z * se, 0.0), 1.0) if defined else float("nan"),
            "high_95": max(min(share + z * se, 1.0), 0.0) if defined else float("nan"),
            "given_share": float(given[row_of]), "given_std_error": float(given_se[row_of]),
        })
    return rows


@decodes(JointParams)
def decode_joint(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS,
                 ) -> JointTablesResult:
    """The joint table of a joint metric: each cell with its standard error, p-value and
    interval, the consistent (projected) shares, marginals, conditionals and the test of
    independence (see the module docstring). A metric of assigned marginals is decoded by
    :func:`~veil.server.analysis.joint_marginals.decode_marginals`."""
    if isinstance(counts.params, JointParams) and counts.params.marginals is not None:
        from veil.server.analysis.joint_marginals import decode_marginals

        return decode_marginals(counts, options)
    started, confidence, params = start_decode(counts, options, JointParams, "decode_joint",
                                               ("unbiased",))
    total = require_reports(counts)
    z = z_quantile(confidence)
    theta, se = _cell_estimates(counts, confidence)
    consistent = project_to_simplex(theta)
    p, q = params.support_probs
    # GRR supports one cell per report (joint_tests: the covariance's offset k)
    offset = q / (p - q) if isinstance(params.cell_oracle, GrrParams) else 0.0
    cov = CellCovariance.of(se, consistent, offset, total)
    rows = frequency_rows(counts.metric, "joint", [params.cell_label(i) for i in
                                                   range(params.cells)],
                          theta, se, total, z)
    names = variable_columns(params)
    for cell, row in enumerate(rows):
        indices = params.cell_indices(cell)
        for name, variable, index in zip(names, params.variables, indices, strict=True):
            row[name] = variable.labels[index]
        row["consistent"] = float(consistent[cell])
    columns = (*RESULT_COLUMNS[:2], *names, *RESULT_COLUMNS[2:], "consistent")
    marginal_rows, marginals = _marginals(params, counts.metric, theta, cov, confidence)
    condition_rows = _conditional_rows(params, counts.metric, theta, cov, z)
    test = independence_test(theta, cov, (params.cells // params.shape[-1], params.shape[-1]))
    summary = base_summary(counts, started, confidence)
    summary.update({
        "variables": {v.name: list(v.labels) for v in params.variables},
        "shape": list(params.shape),
        "oracle": params.encoding,
        "support_probs": [p, q],
        "share_variance_per_report": params.share_variance(),
        "independence": {**test.to_dict(), "of": params.of[-1],
                         "against": list(params.of[:-1])},
        "marginals": marginals,
        "consistent": {"method": "euclidean projection onto the simplex",
                       "total_variation_from_unbiased": float(np.abs(consistent - theta).sum() / 2)},
        "negative_cells": int(np.count_nonzero(theta < 0)),
        "elapsed_seconds": time.perf_counter() - started,
    })
    if summary["negative_cells"]:
        summary["note"] = (f"{summary['negative_cells']} unbiased cell share(s) below 0 by "
                           "sampling noise: the table keeps them unbiased (intervals clipped to "
                           "[0, 1]); the consistent column is non-negative and sums to 1")
    headline = (f"{' x '.join(map(str, params.shape))} joint table of "
                f"{' x '.join(params.of)}; independence of {params.of[-1]}: "
                f"p = {test.p_value:.3g}")
    return JointResult("joint", columns, rows, summary, headline, "shares",
                       conditional_rows=condition_rows, marginal_rows=marginal_rows,
                       shape=params.shape, text_columns=("metric", "kind", "value", *names))
