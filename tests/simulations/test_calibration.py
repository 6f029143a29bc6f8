"""The calibration grid: every closed-form decoder and oracle, reduced to N = 1,000 and
100,000 and epsilon = 0.5 and 4, states standard errors and 95% intervals that hold
for the population share (or mean), within the Monte Carlo error of 2,000 seeded
collections per cell.

Bands (docs/analysis.md): stated SE within 10% of the observed spread, coverage 93-97%.
A cell may stray beyond a band by :data:`~veil.simulations.calibration.ALLOWANCE` (3)
Monte Carlo errors: the relative standard error of a sample standard deviation,
``1 / sqrt(2 (runs - 1))`` = 1.6% (chi distribution), and the binomial standard error
of a coverage at 95%, ``sqrt(0.95 * 0.05 / runs)`` = 0.49%. A calibrated cell sits at
the band's centre, 6.3 and 4.1 such errors from the edges, so it fails only past 9.3
and 7.1 of them.
"""

from __future__ import annotations

import csv
import math

import pytest

from veil.server.cli import main
from veil.simulations.calibration import (
    ALLOCATED,
    CASES,
    QUICK_RUNS,
    CalibrationCase,
    Cell,
    Draws,
    calibration,
    register,
)


@pytest.fixture(scope="module")
def quick_results():
    return calibration(quick=True, seed=2026)


def test_every_cell_of_the_reduced_grid_is_calibrated(quick_results) -> None:
    cells = [Cell(**row) for row in quick_results.rows]
    assert {cell.case for cell in cells} == set(CASES)
    assert {(cell.reports, cell.epsilon) for cell in cells} == {
        (n, eps) for n in (1_000, 100_000) for eps in (0.5, 4.0)}
    assert all(cell.runs == QUICK_RUNS for cell in cells)
    problems = [problem for cell in cells for problem in cell.problems()]
    assert not problems, "\n".join(problems)


def test_grr_shares_add_up_to_exactly_one(quick_results) -> None:
    sums = [Cell(**row) for row in quick_results.rows if row["quantity"] == ALLOCATED]
    exact = {cell.case for cell in sums if cell.exact}
    assert exact == {"grr (one-shot)", "grr (default)"}
    # the other oracles' sums vary, and their stated errors hold (the grid test above)
    assert all(not math.isnan(cell.se_ratio) for cell in sums if cell.case not in exact)


def test_a_miscalibrated_case_is_caught() -> None:
    """A decoder stating 0.8 of its true standard error leaves both bands (coverage 88%)."""
    import numpy as np

    def draw(reports: int, epsilon: float, runs: int, rng: np.random.Generator) -> Draws:
        estimates = rng.normal(0.5, 0.01, size=(runs, 1))
        return Draws(("share",), np.array([0.5]), estimates, np.full((runs, 1), 0.008))

    case = CalibrationCase("too narrow", draw)
    from veil.simulations.calibration import calibrate

    cells = calibrate([case], reports=(1_000,), epsilons=(1.0,), runs=QUICK_RUNS, seed=1)
    problems = cells[0].problems()
    assert len(problems) == 2 and "SE ratio" in problems[0] and "coverage" in problems[1], problems
    with pytest.raises(ValueError, match="registered twice"):
        register(CASES["boolean"])


def test_experiment_command_writes_the_table(tmp_path, monkeypatch) -> None:
    """``veil experiment calibration`` writes metrics.csv and the plot (one small case)."""
    from veil.simulations import calibration as module

    monkeypatch.setattr(module, "CASES", {"boolean": CASES["boolean"]})
    monkeypatch.setattr(module, "QUICK_RUNS", 200)
    out = tmp_path / "calibration"
    assert main(["experiment", "calibration", "--quick", "--out", str(out)]) == 0
    with open(out / "metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and {row["case"] for row in rows} == {"boolean"}
    assert {"se_ratio", "se_ratio_mc", "coverage", "coverage_mc"} <= set(rows[0])
    assert (out / "calibration.png").stat().st_size > 0
