"""The joint metric page: the joint table as a heatmap (its cells' 95% intervals in their
titles and in the table), the conditional view ``P(last variable | the others)`` and the
independence test, all from the joint decoder's result
(:mod:`veil.server.analysis.joint`). A metric of assigned marginals
(:mod:`veil.server.analysis.joint_marginals`) shows every pair's test, ranked, the heatmap
of the pair of strongest evidence, and every pair's cells."""

from __future__ import annotations

from typing import Any

from veil.server.dashboard.decodes import Decodes
from veil.server.dashboard.model import Chart, Page, Table, share_columns
from veil.server.dashboard.pages import try_decode
from veil.server.dashboard.state import PageState

#: shades of the heatmap, darkest for the largest share
HEAT_LEVELS = 10


def joint_page(decodes: Decodes, name: str, state: PageState) -> Page:
    """The joint table of metric ``name`` over the range (see the module docstring)."""
    metric = decodes.source.registry()[name]
    page = Page("joint", f"Joint metric {name}", subject=name,
                related={f"Metric {name} day by day": ("metric", name)})
    page.facts = {"Mechanism": metric.params.mechanism_name,
                  "ε one report": metric.params.epsilon_1,
                  "ε one value": metric.params.epsilon_inf}
    result, why = try_decode(decodes, metric, state.start, state.end)
    if result is None:
        page.notes.append(f"No estimates for {state.start} to {state.end}: {why}.")
        return page
    if getattr(result, "independence_rows", None) is not None:
        _marginals(page, result, name)
        return page
    conditional_rows = getattr(result, "conditional_rows", None)
    shape = getattr(result, "shape", ())
    if conditional_rows is None or len(shape) < 2:
        page.notes.append(f"{name} is not a joint metric: its estimates are on its metric page.")
        return page
    summary = result.summary
    variables = list(summary.get("variables", {}))
    test = summary.get("independence", {})
    page.facts.update({
        "Reports (N)": summary.get("reports"), "Cells": len(result.rows),
        "Independence test": f"{test.get('of')} against {', '.join(test.get('against', []))}",
        "Statistic": test.get("statistic"), "Degrees of freedom": test.get("dof"),
        "p-value": test.get("p_value"),
    })
    page.notes += [note for note in (summary.get("note"),) if note]
    page.notes.append(f"Test: {test.get('method')}. A small p-value says {test.get('of')} "
                      f"depends on {', '.join(test.get('against', []))}.")
    page.tables += [
        Table("cells", "Joint shares with 95% intervals",
              {"given": "Given", "column": variables[-1], **share_columns(),
               "consistent": "Consistent share"},
              _cells(result.rows, result.columns, shape, variables),
              caption="Unbiased shares and their intervals; the consistent share is their "
                      "projection onto the simplex (non-negative, summing to 1)."),
        Table("conditional", f"P({variables[-1]} | {', '.join(variables[:-1])})",
              {"label": "Outcome | condition", "given": "Given", "value": variables[-1],
               "conditional": "Conditional share",
               "std_error": "Std. error", "low_95": "95% low", "high_95": "95% high",
               "given_share": "Share given"},
              [{**row, "label": f"{row['value']} | {row['given']}"} for row in conditional_rows]),
        Table("marginals", "Marginal shares",
              {"variable": "Variable", "value": "Value", **share_columns()},
              list(getattr(result, "marginal_rows", []))),
    ]
    page.charts.append(Chart("conditional", f"{name}: P({variables[-1]} | "
                                            f"{', '.join(variables[:-1])})", "conditional",
                             "bars", "label", "conditional", "conditional share", "low_95",
                             "high_95"))
    return page


def _marginals(page: Page, result: Any, name: str) -> None:
    """The page of a metric of assigned marginals (see the module docstring)."""
    summary = result.summary
    tests = sorted(result.independence_rows, key=lambda test: test["p_value"])
    page.facts.update({"Reports (N)": summary.get("reports"),
                       "Variables": len(summary.get("variables", {})),
                       "Marginals assigned": f"{summary.get('marginals')} variables each",
                       "Pairs": len(tests)})
    page.notes += [note for note in (summary.get("note"),) if note]
    if not tests:
        return
    strongest = tests[0]
    first, second = strongest["first"], strongest["second"]
    top = max((row["proportion"] for row in result.rows
               if row["pair"] == strongest["pair"]), default=0.0) or 1.0
    cells = [{**row, "given": f"{first}={row['first_value']}", "column": row["second_value"],
              "heat": int(max(row["proportion"], 0.0) / top * (HEAT_LEVELS - 1) + 0.5)}
             for row in result.rows if row["pair"] == strongest["pair"]]
    page.notes.append(f"The heatmap is {strongest['pair']}, the pair whose independence test "
                      "has the smallest p-value; the tables give every pair. Test: "
                      f"{strongest['method']}.")
    page.tables += [
        Table("cells", f"{strongest['pair']} with 95% intervals",
              {"given": first, "column": second, **share_columns(),
               "consistent": "Consistent share"}, cells,
              caption="Unbiased shares and their intervals; the consistent share agrees with "
                      "every other pair on the shared variables' shares."),
        Table("independence", "Independence of each pair (smallest p-value first)",
              {"pair": "Pair", "statistic": "Statistic", "dof": "Degrees of freedom",
               "p_value": "p-value"}, tests),
        Table("pairs", "Every pair's shares",
              {"pair": "Pair", "first_value": "First", "second_value": "Second",
               **share_columns(), "consistent": "Consistent share"}, list(result.rows)),
        Table("marginals", "Marginal shares",
              {"variable": "Variable", "value": "Value", **share_columns()},
              list(result.marginal_rows)),
    ]


def _cells(rows: list[dict[str, Any]], columns: tuple[str, ...], shape: tuple[int, ...],
           variables: list[str]) -> list[dict[str, Any]]:
    """The cells in row-major order, each with its condition (``given``: the values of all
    variables but the last), its ``column`` (the last variable's value) and its shade."""
    last = [column for column in columns if column in variables or column.startswith("var_")][-1]
    top = max((row["proportion"] for row in rows), default=0.0) or 1.0
    cells = []
    for row in rows:
        given = str(row["value"]).rsplit(", ", 1)[0]
        level = int(max(row["proportion"], 0.0) / top * (HEAT_LEVELS - 1) + 0.5)
        cells.append({**row, "given": given, "column": str(row[last]), "heat": level})
    return cells
