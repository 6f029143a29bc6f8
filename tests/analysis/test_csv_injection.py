"""Strings come from clients (candidates that were reported, strings discovery rebuilt from
reports), and analysts open the CSV files in spreadsheets: a cell must never run as a
formula (OWASP, CSV injection), and a string holding a carriage return must not end its
row. The JSON twins and the Python API keep every string as it was reported."""

from __future__ import annotations

import csv

import pytest

from tests.analysis.test_cli_small_populations import METRIC, write_database
from tests.test_common_checks import population
from veil.server.analysis import decode_metric
from veil.server.analysis.files import write_outputs
from veil.server.analysis.tables import spreadsheet_safe
from veil.shared.kinds import StringParams

HOSTILE = ['=HYPERLINK("http://evil.test","x")', "+cmd|' /C calc'!A0", "-2+3+cmd|x",
           "@SUM(1+1)", "\tx=1+1", "q\r=cmd|' /C calc'!A0", "plain.example"]


@pytest.mark.parametrize(("value", "written"), [
    ("=1+1", "'=1+1"), ("+1", "+1"), ("-5", "-5"), ("-1.5e-05", "-1.5e-05"), ("1,000.5", "1,000.5"),
    ("-2+3", "'-2+3"), ("@A1", "'@A1"), ("\t=1", "'\t=1"), ("\r=1", "'\r=1"),
    ("a=1", "a=1"), ("", ""), (-5.0, -5.0), (None, None),
])
def test_a_cell_that_would_run_gets_an_apostrophe(value, written) -> None:
    assert spreadsheet_safe(value) == written


def test_results_csv_neither_runs_nor_breaks_on_client_strings(tmp_path) -> None:
    shares = dict.fromkeys(HOSTILE, 1 / len(HOSTILE))
    db = write_database(tmp_path / "veil.db", StringParams(k=32, h=2, m=8),
                        population(shares, 700, seed=5), seed=6)
    result = decode_metric(db=db, metric=METRIC, candidates=HOSTILE, force=True,
                           all_candidates=True)
    assert {row["value"] for row in result.rows} >= set(HOSTILE)  # the API: as reported
    write_outputs(result, tmp_path / "out")
    with open(tmp_path / "out" / "results.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(result.rows)  # the carriage return ended no row
    written = {row["value"] for row in rows}
    assert written == {spreadsheet_safe(value) for value in HOSTILE}
    for row in rows:
        for cell in row.values():
            assert cell[:1] not in ("=", "+", "@", "\t", "\r") or cell == spreadsheet_safe(cell)


def test_the_dashboards_csv_twin_neither_runs_nor_breaks(tmp_path) -> None:
    """The review's case: 'q\\r=cmd...' was written unquoted under a \\n line end, and read
    back as two rows, the second beginning with a formula."""
    import io

    from veil.server.dashboard.model import Table

    table = Table("strings", "Strings", {"value": "Value", "proportion": "Share"},
                  [{"value": value, "proportion": -0.01 * i} for i, value in enumerate(HOSTILE)])
    rows = list(csv.DictReader(io.StringIO(table.to_csv(), newline="")))
    assert [row["value"] for row in rows] == [spreadsheet_safe(value) for value in HOSTILE]
    assert [float(row["proportion"]) for row in rows] == [-0.01 * i for i in range(len(HOSTILE))]
    assert table.to_json()["rows"][0]["value"] == HOSTILE[0]  # the JSON twin: as reported


def test_numbers_are_written_as_numbers_whatever_their_sign(tmp_path) -> None:
    """Floats reach the writer as numbers: '-inf' or '-1.5e-05' are never taken for text."""
    from veil.server.analysis.tables import write_rows

    write_rows(tmp_path / "t.csv", ("value", "log10_p_value", "estimate"),
               [{"value": "-x", "log10_p_value": float("-inf"), "estimate": -1.5e-05}])
    with open(tmp_path / "t.csv", newline="", encoding="utf-8") as handle:
        assert list(csv.DictReader(handle)) == [
            {"value": "'-x", "log10_p_value": "-inf", "estimate": "-1.5e-05"}]


def test_veil_decode_writes_client_strings_so_that_no_cell_runs(tmp_path) -> None:
    """The same through the command an analyst runs: ``veil decode --db --all``, its
    results.csv read back by a CSV reader as a spreadsheet would import it."""
    import subprocess
    import sys

    hostile = [value for value in HOSTILE if "\r" not in value]  # a candidates file is lines
    db = write_database(tmp_path / "veil.db", StringParams(k=32, h=2, m=8),
                        population(dict.fromkeys(hostile, 1 / len(hostile)), 700, seed=5),
                        seed=6)
    (tmp_path / "candidates.txt").write_text("".join(f"{v}\n" for v in hostile),
                                            encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "veil.server.cli", "decode", "--db", str(db),
                          "--metric", METRIC, "--candidates", str(tmp_path / "candidates.txt"),
                          "--out", str(tmp_path / "out"), "--all", "--force"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "out" / "results.csv", newline="", encoding="utf-8") as handle:
        written = [row["value"] for row in csv.DictReader(handle)]
    assert sorted(written) == sorted(spreadsheet_safe(value) for value in hostile)
    assert not any(value.startswith(("=", "+", "-", "@", "\t")) for value in written)
