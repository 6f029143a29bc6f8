"""The heatmap of a decoded joint table: the joint shares and the conditional shares; and
the pairwise heatmaps of decoded marginals (:func:`draw_pair_heatmaps`).

Two panels over the same grid, conditions (each combination of the first variables)
down and the last variable's values across. Left: each cell's consistent share
(colour) with its unbiased estimate and the half-width of its interval written in
the cell. Right: ``P(last | condition)`` with its interval, so that a row that
differs from the others (the dependence the independence test weighs) stands out.
Past :data:`ANNOTATED_CELLS` cells the numbers are left out; past ``top`` conditions
only those of largest share are drawn, as the title says.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from veil.server.analysis.charts import Charted, _figure, _level, _title
from veil.server.analysis.stats import z_quantile

if TYPE_CHECKING:
    from matplotlib.axes import Axes


class JointResult(Charted, Protocol):
    """What the heatmap reads of a decoded joint table
    (:class:`veil.server.analysis.joint.JointResult`): the charts import no result class."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def conditional_rows(self) -> list[dict[str, Any]]: ...


class MarginalsResult(Charted, Protocol):
    """What the pairwise heatmaps read of decoded marginals
    (:class:`veil.server.analysis.joint_marginals.MarginalsResult`)."""

    def pair_table(self, *args: Any, **kwargs: Any) -> Any: ...

#: most cells per panel whose numbers are written in them
ANNOTATED_CELLS = 400
#: most cells of a pairwise panel whose numbers are written in them
PAIR_ANNOTATED_CELLS = 16


def _grid(result: JointResult, top: int) -> tuple[list[str], list[str], dict[str, Any], str]:
    """The conditions drawn (the ``top`` of largest share, in their order), the last
    variable's values, the panels' arrays and a note on conditions left out."""
    columns = result.shape[-1]
    rows = len(result.rows) // columns
    given = [result.conditional_rows[r * columns]["given"] for r in range(rows)]
    shares = np.array([result.conditional_rows[r * columns]["given_share"] for r in range(rows)])
    keep = np.sort(np.argsort(-shares, kind="stable")[:top])
    values = [row["value"] for row in result.conditional_rows[:columns]]

    def table(rows_of: list[dict[str, Any]], key: str) -> np.ndarray:
        return np.array([row[key] for row in rows_of], dtype=float).reshape(rows, columns)[keep]

    z = z_quantile(float(result.summary.get("confidence", 0.95)))
    panels = {
        "consistent": table(result.rows, "consistent"),
        "joint": table(result.rows, "proportion"),
        "joint_half": z * table(result.rows, "prop_std_error"),
        "conditional": table(result.conditional_rows, "conditional"),
        "conditional_low": table(result.conditional_rows, "low_95"),
        "conditional_high": table(result.conditional_rows, "high_95"),
    }
    note = f" ({len(keep)} of {rows} conditions, largest first kept)" if len(keep) < rows else ""
    return [given[i] for i in keep], values, panels, note


def _panel(ax: Axes, data: np.ndarray, texts: list[list[str]] | None, given: list[str],
           values: list[str], title: str, cmap: str) -> Any:
    image = ax.imshow(np.nan_to_num(data), cmap=cmap, aspect="auto", vmin=0.0,
                      vmax=max(float(np.nanmax(data)) if np.isfinite(data).any() else 0.0, 1e-9))
    ax.set_xticks(range(len(values)), values, rotation=45 if len(values) > 6 else 0,
                  ha="right" if len(values) > 6 else "center", fontsize=7)
    ax.set_yticks(range(len(given)), given, fontsize=7)
    ax.set_title(title, fontsize=8)
    if texts is not None:
        top = float(np.nanmax(data)) if np.isfinite(data).any() else 0.0
        for i, line in enumerate(texts):
            for j, text in enumerate(line):
                dark = np.isfinite(data[i, j]) and data[i, j] > 0.6 * top
                ax.text(j, i, text, ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")
    return image


def draw_heatmap(result: JointResult, ax: Axes | None = None, top: int = 30) -> Axes:
    """Draw both panels (on ``ax``'s figure when given, beside it) and return the left
    axes."""
    given, values, panels, note = _grid(result, top)
    width = min(3.0 + 1.4 * len(values), 24.0)
    height = min(2.2 + 0.5 * len(given), 18.0)
    if ax is None:
        import matplotlib.pyplot as plt

        figure = plt.figure(figsize=(width, height), layout="constrained")
    else:
        figure = ax.figure  # type: ignore[assignment]
        figure.clear()
    left, right = figure.subplots(1, 2, sharey=True)
    annotate = panels["joint"].size <= ANNOTATED_CELLS
    joint_texts = [[f"{share:.1%}\n\u00b1{half:.1%}" for share, half in zip(row, halves,
                                                                           strict=True)]
                   for row, halves in zip(panels["joint"], panels["joint_half"], strict=True)]
    conditional_texts = [
        [f"{share:.0%}\n[{low:.0%}, {high:.0%}]" if np.isfinite(share) else "n/a"
         for share, low, high in zip(row, lows, highs, strict=True)]
        for row, lows, highs in zip(panels["conditional"], panels["conditional_low"],
                                    panels["conditional_high"], strict=True)]
    level = _level(result.summary)
    image = _panel(left, panels["consistent"], joint_texts if annotate else None, given,
                   values, f"joint share (colour: consistent; text: unbiased \u00b1 {level})",
                   "Blues")
    figure.colorbar(image, ax=left, format="{x:.0%}", shrink=0.8)
    image = _panel(right, panels["conditional"], conditional_texts if annotate else None,
                   given, values, f"P(value | condition) [{level} interval]", "Oranges")
    figure.colorbar(image, ax=right, format="{x:.0%}", shrink=0.8)
    independence = result.summary.get("independence", {})
    figure.suptitle(f"{_title(result)}\nindependence of {independence.get('of')}: Wald "
                    f"\u03c7\u00b2 = {independence.get('statistic', float('nan')):.3g} on "
                    f"{independence.get('dof')} df, p = "
                    f"{independence.get('p_value', float('nan')):.3g}{note}", fontsize=8)
    axes: Axes = left
    return axes


def save_heatmap(result: JointResult, path: str | Path, top: int = 30) -> None:
    """Save :func:`draw_heatmap`'s chart as a PNG at ``path``."""
    given, values, _, _ = _grid(result, top)
    width = min(3.0 + 1.4 * len(values), 24.0)
    height = min(2.2 + 0.5 * len(given), 18.0)
    figure = _figure(width, height)
    draw_heatmap(result, figure.add_subplot(), top)
    figure.savefig(path)


def _pair_grid(result: MarginalsResult) -> tuple[list[str], int]:
    """The variables and the side of the grid of pairwise panels (first variable down, the
    second across: an upper triangle)."""
    variables = list(result.summary["variables"])
    return variables, len(variables) - 1


def draw_pair_heatmaps(result: MarginalsResult, ax: Axes | None = None) -> Axes:
    """Every pairwise table of decoded marginals as a heatmap of its consistent shares (one
    colour scale for all), each titled with its independence test's p-value; the shares and
    the half-widths of their intervals are written in the cells of small tables. Drawn on
    ``ax``'s figure when given; returns the first panel."""
    variables, side = _pair_grid(result)
    if ax is None:
        import matplotlib.pyplot as plt

        figure = plt.figure(figsize=(2.4 * side + 1.0, 2.2 * side + 0.8), layout="constrained")
    else:
        figure = ax.figure  # type: ignore[assignment]
        figure.clear()
    panels = figure.subplots(side, side, squeeze=False)
    tables = {pair: result.pair_table(pair) for pair in result.summary["independence"]}
    top = max(max(float(t.max()) for t in tables.values()), 1e-9)
    z = z_quantile(float(result.summary.get("confidence", 0.95)))
    image = None
    for i, j in itertools.product(range(side), repeat=2):
        panel = panels[i][j]
        if j < i:
            panel.axis("off")
            continue
        first, second = variables[i], variables[j + 1]
        pair = f"{first} x {second}"
        table = tables[pair]
        image = panel.imshow(table, cmap="Blues", vmin=0.0, vmax=top, aspect="auto")
        labels = result.summary["variables"]
        panel.set_yticks(range(table.shape[0]), labels[first], fontsize=5)
        panel.set_xticks(range(table.shape[1]), labels[second], fontsize=5, rotation=90)
        panel.set_ylabel(first, fontsize=6)
        panel.set_xlabel(second, fontsize=6)
        p_value = result.summary["independence"][pair]["p_value"]
        panel.set_title(f"independence p = {p_value:.2g}", fontsize=6)
        if table.size <= PAIR_ANNOTATED_CELLS:
            halves = z * result.pair_table(pair, "prop_std_error")
            for (r, c), share in np.ndenumerate(table):
                panel.text(c, r, f"{max(share, 0.0):.1%}\n\u00b1{halves[r, c]:.1%}", ha="center",
                           va="center", fontsize=5,
                           color="white" if share > 0.6 * top else "black")
    if image is not None:
        figure.colorbar(image, ax=panels, format="{x:.0%}", shrink=0.6)
    figure.suptitle(f"{_title(result)}\nevery pair of {len(variables)} variables (colour: "
                    f"consistent shares; text: share \u00b1 half-width of its "
                    f"{_level(result.summary)} interval)", fontsize=8)
    axes: Axes = panels[0][0]
    return axes


def save_pair_heatmaps(result: MarginalsResult, path: str | Path) -> None:
    """Save :func:`draw_pair_heatmaps`'s chart as a PNG at ``path``."""
    _, side = _pair_grid(result)
    figure = _figure(2.4 * side + 1.0, 2.2 * side + 0.8)
    draw_pair_heatmaps(result, figure.add_subplot())
    figure.savefig(path, dpi=120)
