"""``veil assoc`` from the outside: google/rappor's option names and output columns, any
pair of string and boolean variables, and clear errors (no traceback) for bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.analysis.test_assoc_em import BOOLEAN, PARAMS, STRING, Variable, write_case

COLUMNS = ["proportion", "prop_std_error", "prop_low_95", "prop_high_95"]


def _veil(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``veil`` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=120)


def _options(folder: Path, first: Variable, second: Variable, out: Path) -> list[str]:
    """google/rappor's ``decode_assoc.R`` options for a generated case."""
    options = ["assoc", "--metric-name", "m", "--schema", str(folder / "rappor-vars.csv"),
               "--params-dir", str(folder), "--reports", str(folder / "reports.csv"),
               "--var1", first.name, "--var2", second.name, "--output-dir", str(out)]
    for option, variable in (("--map1", first), ("--map2", second)):
        if variable.candidates is not None:
            options += [option, str(folder / f"{variable.name}_map.csv")]
    return options


@pytest.mark.parametrize("first, second", [
    (STRING, BOOLEAN),
    (STRING, Variable("z", ["red", "green", "blue"])),
    (Variable("a", None), Variable("b", None)),
], ids=["string-boolean", "string-string", "boolean-boolean"])
def test_assoc_writes_googles_columns_for_any_pair(tmp_path: Path, first: Variable,
                                                   second: Variable) -> None:
    """assoc-results.csv has google/rappor's columns (the two variables, proportion) then
    the standard error and 95% interval, one row per cell, booleans as TRUE/FALSE; the
    proportions sum to 1 and each interval holds its estimate."""
    rows_x = len(first.candidates or [0, 0])
    cols_y = len(second.candidates or [0, 0])
    table = np.random.default_rng(5).dirichlet(np.ones(rows_x * cols_y)).reshape(rows_x, cols_y)
    write_case(tmp_path / "in", PARAMS, first, second, table, 4_000, seed=8)
    done = _veil(*_options(tmp_path / "in", first, second, tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "out" / "assoc-results.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == [first.name, second.name, *COLUMNS]
    assert len(rows) == rows_x * cols_y
    for variable, column in ((first, first.name), (second, second.name)):
        assert [r[column] for r in rows][:: 1 if variable is second else cols_y][:2] == (
            variable.candidates or ["TRUE", "FALSE"])[:2]
    shares = np.array([float(r["proportion"]) for r in rows])
    assert shares.sum() == pytest.approx(1.0)
    for row in rows:
        low, share, high = (float(row[c]) for c in ("prop_low_95", "proportion", "prop_high_95"))
        assert 0.0 <= low <= share <= high <= 1.0
    metrics = json.loads((tmp_path / "out" / "assoc-metrics.json").read_text())
    assert metrics["num_reports"] == 4_000 and metrics["converged"] is True


def test_assoc_refuses_bad_input_by_name(tmp_path: Path) -> None:
    """A string without its map, a map for a boolean, an unknown variable and a malformed
    report each exit non-zero with a message naming the fix, never a traceback."""
    write_case(tmp_path / "in", PARAMS, STRING, BOOLEAN, np.full((4, 2), 0.125), 500, seed=1)
    options = _options(tmp_path / "in", STRING, BOOLEAN, tmp_path / "out")
    cases = {
        "--map1": [o for o in options if "x_map" not in o and o != "--map1"],
        "needs no map": [*options, "--map2", options[options.index("--map1") + 1]],
        "no variable 'w'": [("w" if i and options[i - 1] == "--var2" else o)
                            for i, o in enumerate(options)],
    }
    for expected, argv in cases.items():
        done = _veil(*argv)
        assert done.returncode != 0 and expected in done.stderr, (expected, done.stderr)
        assert "Traceback" not in done.stderr
    reports = tmp_path / "in" / "reports.csv"
    lines = reports.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 2)[0] + ",01x,1"
    reports.write_text("\n".join(lines) + "\n")
    done = _veil(*options)
    assert done.returncode != 0 and "row 4" in done.stderr and "x must be 16" in done.stderr
    assert "Traceback" not in done.stderr
