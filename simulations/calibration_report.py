"""``veil experiment calibration``: runs the grid of :mod:`veil.simulations.calibration`
and writes its markdown table (every cell flagged in band, documented or out of band) and
the SE ratio and coverage figure."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from veil.simulations.calibration import (
    ALLOWANCE,
    CASES,
    CATEGORY_SHARES,
    COVERAGE_BAND,
    EPSILONS,
    GRID_SHARE,
    NUMBER_RANGE,
    QUICK_EPSILONS,
    QUICK_REPORTS,
    QUICK_RUNS,
    REPORTS,
    RUNS,
    SE_BAND,
    STRING_RUNS,
    STRING_TOP,
    TRUE_SHARE,
    Z95,
    Cell,
    calibrate,
)
from veil.simulations.calibration_strings import FDR, MISSING_SHARE, STRING_CASES
from veil.simulations.report import Results, new_figure


def _span(values: Sequence[float], digits: int) -> str:
    """``low-high`` of ``values`` to ``digits`` decimals (one number when they agree)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def _own_points(cells: Sequence[Cell], own: Collection[str] | None) -> set[str]:
    """The cases among ``cells`` that run at their own points (default: as registered)."""
    if own is None:
        own = {case.name for case in CASES.values() if case.points}
    return {cell.case for cell in cells} & set(own)


def _flag(cell: Cell) -> str:
    """The cell's status as a table shows it, a documented departure linked to its text."""
    status = cell.status()
    if status == "documented":
        return f"[documented]({cell.documented})"
    return "in band" if status == "in band" else "**out of band**"


def _entry(cell: Cell) -> str:
    """One quantity of a case at its own point: SE ratio / coverage (the missing share's
    bias first), or the achieved rate of a ceiling, with the cell's flag."""
    if cell.kind == "ceiling":
        figure = f"{cell.mean:.3f} ± {cell.mean_mc:.3f} (level {cell.truth:g})"
    elif cell.quantity == MISSING_SHARE:
        figure = (f"bias {cell.mean - cell.truth:+.3f} ± {cell.mean_mc:.3f} / "
                  f"{100 * cell.coverage:.1f}")
    else:
        figure = f"{cell.se_ratio:.2f} / {100 * cell.coverage:.1f}"
    return f"{figure}, {_flag(cell)}"


def markdown_table(cells: Sequence[Cell], own: Collection[str] | None = None) -> str:
    """The grid's table, one row per (case, N) and one column per epsilon holding the SE
    ratios and coverages (in %) of the case's quantities as the range from lowest to
    highest; then, for the cases at their own points (``own``, default: as registered:
    the string population shapes), one row per case and one column per quantity, each
    entry flagged in band, documented (a departure docs/analysis.md states, linked) or
    out of band."""
    fixed = _own_points(cells, own)
    parts = []
    grid = [cell for cell in cells if cell.case not in fixed]
    if grid:
        epsilons = sorted({cell.epsilon for cell in grid})
        keys = list(dict.fromkeys((cell.case, cell.reports) for cell in grid))
        lines = ["| case | N | " + " | ".join(f"ε = {eps:g}" for eps in epsilons) + " |",
                 "|---|---|" + "---|" * len(epsilons)]
        for case, reports in keys:
            entries = []
            for eps in epsilons:
                chosen = [c for c in grid
                          if (c.case, c.reports, c.epsilon) == (case, reports, eps)
                          and not c.exact]
                entries.append(f"{_span([c.se_ratio for c in chosen], 2)} / "
                               f"{_span([100 * c.coverage for c in chosen], 1)}"
                               if chosen else "")
            lines.append(f"| {case} | {reports:,} | " + " | ".join(entries) + " |")
        parts.append("\n".join(lines))
    points = [cell for cell in cells if cell.case in fixed]
    if points:
        quantities = list(dict.fromkeys(cell.quantity for cell in points))
        lines = ["| case | N | ε | runs | " + " | ".join(quantities) + " |",
                 "|---|---|---|---|" + "---|" * len(quantities)]
        for case, reports, eps in dict.fromkeys((c.case, c.reports, c.epsilon)
                                                 for c in points):
            row = {c.quantity: c for c in points
                   if (c.case, c.reports, c.epsilon) == (case, reports, eps)}
            runs = next(iter(row.values())).runs
            lines.append(f"| {case} | {reports:,} | {eps:.2f} | {runs:,} | "
                         + " | ".join(_entry(row[q]) if q in row else ""
                                      for q in quantities) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def calibration_figure(cells: Sequence[Cell], own: Collection[str] | None = None) -> Any:
    """SE ratio (top) and coverage (middle) against epsilon, one panel per N, one colour
    per case, every quantity a dot (a diamond for a case at its own point: a string
    population shape at its parameters' epsilon); the bands shaded. Bottom: the coverage
    of quantities documented to leave their band (the missing share), and the achieved
    rates against their level (the false discovery rate), one line per case."""
    import matplotlib
    from matplotlib.lines import Line2D

    fixed = _own_points(cells, own)
    banded = [c for c in cells if c.kind == "interval" and not c.exact and not c.documented]
    reports = sorted({cell.reports for cell in banded})
    epsilons = sorted({c.epsilon for c in banded if c.case not in fixed})
    cases = list(dict.fromkeys(cell.case for cell in cells))
    grid_cases = [case for case in cases if case not in fixed]
    own_cases = [case for case in cases if case in fixed]
    color = {case: matplotlib.colormaps["tab20"](i % 20) for i, case in enumerate(grid_cases)}
    color.update({case: matplotlib.colormaps["Dark2"](i % 8) for i, case in enumerate(own_cases)})
    marker = {case: "D" if case in fixed else "o" for case in cases}
    figure = new_figure(10.5, 9.0)
    layout = figure.add_gridspec(3, len(reports), height_ratios=(1.0, 1.0, 1.15))
    first = figure.add_subplot(layout[0, 0])
    tops = [first] + [figure.add_subplot(layout[0, i], sharey=first)
                      for i in range(1, len(reports))]
    middle_first = figure.add_subplot(layout[1, 0], sharex=first)
    middles = [middle_first] + [figure.add_subplot(layout[1, i], sharey=middle_first,
                                                   sharex=tops[i])
                                for i in range(1, len(reports))]
    for column, n in enumerate(reports):
        top, middle = tops[column], middles[column]
        top.axhspan(1 - SE_BAND, 1 + SE_BAND, color="0.9")
        middle.axhspan(100 * COVERAGE_BAND[0], 100 * COVERAGE_BAND[1], color="0.9")
        for i, case in enumerate(cases):
            chosen = [c for c in banded if c.case == case and c.reports == n]
            offset = (i - len(cases) / 2) * 0.012
            x = [c.epsilon * math.exp(offset) for c in chosen]
            size = 4 if case in fixed else 2.5
            top.semilogx(x, [c.se_ratio for c in chosen], marker[case], ms=size,
                         color=color[case])
            middle.semilogx(x, [100 * c.coverage for c in chosen], marker[case], ms=size,
                            color=color[case])
        top.set_title(f"N = {n:,}", fontsize=9)
        middle.set_xlabel("ε (privacy parameter)", fontsize=8)
        for axis in (top, middle):
            axis.set_xticks(epsilons, labels=[f"{e:g}" for e in epsilons])
            axis.minorticks_off()
            axis.tick_params(labelsize=7)
        if column:
            top.tick_params(labelleft=False)
            middle.tick_params(labelleft=False)
        top.tick_params(labelbottom=False)
    tops[0].set_ylabel("stated SE ÷ observed SD", fontsize=8)
    middles[0].set_ylabel("95% interval coverage (%)", fontsize=8)
    _departure_panels(figure, layout, cells, len(reports), color, marker)
    handles = [Line2D([], [], ls="", marker=marker[case], ms=5, color=color[case], label=case)
               for case in cases]
    figure.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    return figure




def _departure_panels(figure: Any, layout: Any, cells: Sequence[Cell], columns: int,
                      color: dict[str, Any], marker: dict[str, str]) -> None:
    """The figure's bottom row: the coverage of quantities documented to leave their band
    (left) and the achieved rates of ceilings against their level (right), a line per case."""
    documented = [c for c in cells if c.kind == "interval" and c.documented]
    ceilings = [c for c in cells if c.kind == "ceiling"]
    rows = list(dict.fromkeys(c.case for c in [*documented, *ceilings]))
    if rows:
        half = max(1, columns // 2)
        left = figure.add_subplot(layout[2, :half])
        right = figure.add_subplot(layout[2, half:], sharey=left)
        position = {case: len(rows) - 1 - i for i, case in enumerate(rows)}
        left.axvspan(100 * COVERAGE_BAND[0], 100 * COVERAGE_BAND[1], color="0.9")
        for c in documented:
            left.errorbar(100 * c.coverage, position[c.case], xerr=196 * c.coverage_mc,
                          fmt=marker[c.case], ms=4, color=color[c.case])
        names = sorted({c.quantity for c in documented})
        left.set_title(f"{', '.join(names)} (may leave its band, docs say where)", fontsize=9)
        left.set_xlabel("95% interval coverage of its truth (%; shaded: 93-97)", fontsize=8)
        levels = sorted({c.truth for c in ceilings})
        for level in levels:
            right.axvline(level, color="0.4", lw=0.8, ls="--")
        for c in ceilings:
            right.errorbar(c.mean, position[c.case], xerr=Z95 * c.mean_mc,
                           fmt=marker[c.case], ms=4, color=color[c.case])
        names = sorted({c.quantity for c in ceilings})
        right.set_title(f"achieved {', '.join(names)} (dashed: level "
                        f"{', '.join(f'{v:g}' for v in levels)})", fontsize=9)
        right.set_xlabel("mean share of detected strings that are false", fontsize=8)
        right.set_xlim(left=-0.002)
        left.set_yticks(list(position.values()), labels=list(position))
        right.tick_params(labelleft=False)
        for axis in (left, right):
            axis.tick_params(labelsize=7)
            axis.set_ylim(-0.6, len(rows) - 0.4)


def calibration(quick: bool = False, seed: int = 1) -> Results:
    """The calibration grid (:data:`REPORTS` x :data:`EPSILONS`, :data:`RUNS` collections a
    cell, and the string population shapes at their own points, :data:`STRING_RUNS`
    collections each; with ``quick`` the test suite's reduced grid) over every registered
    case."""
    runs = QUICK_RUNS if quick else RUNS
    cells = calibrate(reports=QUICK_REPORTS if quick else REPORTS,
                      epsilons=QUICK_EPSILONS if quick else EPSILONS, runs=runs, seed=seed,
                      quick=quick)
    outside = [problem for cell in cells if cell.status() == "out of band"
               for problem in cell.problems()]
    documented = [problem for cell in cells if cell.status() == "documented"
                  for problem in cell.problems()]
    notes = [
        f"{runs:,} collections per cell, each of N installations drawing their value from "
        "the population (category shares "
        f"{', '.join(f'{s:g}' for s in CATEGORY_SHARES)}; booleans true with {TRUE_SHARE:g}; "
        f"numbers on [{NUMBER_RANGE[0]:g}, {NUMBER_RANGE[1]:g}], grid points "
        f"Binomial(64, {GRID_SHARE:g})) and sending one report, decoded with decode_counts. "
        "se_ratio is the root mean square stated standard error over the observed standard "
        "deviation; coverage the share of 95% intervals holding the population value. "
        "'sum of shares' is allocated_proportion_unbiased (truth 1); GRR's is exactly 1 "
        "(exact = True).",
        f"String population shapes ({STRING_RUNS:,} collections each, drawn from the RAPPOR "
        "model, decoded with StringDecoder at its defaults): "
        + "; ".join(f"{case.name}: {case.description}, {case.reports:,} reports"
                    for case in STRING_CASES)
        + f". Rows 'rank 1..{STRING_TOP}' are the most common listed values' shares; "
        f"'{MISSING_SHARE}' is missing_proportion against 1 less the true shares of the "
        f"strings each collection detects (mean = its mean estimate); '{FDR}' (kind "
        "'ceiling') is the mean share of detected strings that are decoys, against the "
        "decoder's level (truth).",
        f"Cells outside their band by more than {ALLOWANCE:g} Monte Carlo errors: "
        + ("; ".join(outside) if outside else "none") + ".",
        "Outside their band where docs/analysis.md says so (documented): "
        + ("; ".join(documented) if documented else "none") + ".",
    ]
    return Results("calibration", "Calibration of standard errors and 95% intervals",
                   [cell.as_row() for cell in cells],
                   {"calibration": calibration_figure(cells)}, notes)
