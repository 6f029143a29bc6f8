"""``veil assoc``'s files when they are not what they should be: every fault is refused with
exit status 2 and a message naming the file, the row (the file's line) and what to fix,
never a traceback, and nothing is silently read wrong (a shifted column, a dropped field,
a first-wins schema row). Parameters that make reports deterministic (p* = 0, q* = 1) are
decoded; f = 1, which makes them noise, is refused as ``veil decode`` refuses it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.analysis.test_assoc_em import (
    BOOLEAN,
    PARAMS,
    STRING,
    TABLE,
    Variable,
    read_case,
    write_case,
)
from veil.server.analysis.assoc_em import JointEM
from veil.server.counts import write_params
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams


def _veil(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``veil`` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=120)


def _assoc(folder: Path, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """``veil assoc`` on a string (x) x boolean (y) case."""
    return _veil("assoc", "--metric-name", "m", "--schema", str(folder / "rappor-vars.csv"),
                 "--params-dir", str(folder), "--reports", str(folder / "reports.csv"),
                 "--var1", "x", "--var2", "y", "--map1", str(folder / "x_map.csv"),
                 "--output-dir", str(out), *more)


@pytest.fixture
def case(tmp_path: Path) -> Path:
    """A small string x boolean case (k = 16, m = 8) of 300 clients."""
    write_case(tmp_path / "in", PARAMS, STRING, BOOLEAN, TABLE, 300, seed=4)
    return tmp_path / "in"


def _edit_reports(folder: Path, edit: Callable[[list[str]], list[str] | None]) -> None:
    """Rewrite reports.csv's lines (header first) through ``edit``, which may change the
    list in place."""
    path = folder / "reports.csv"
    lines = path.read_text().splitlines()
    lines = edit(lines) or lines
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _set_field(line: str, column: int, value: str) -> str:
    """``line`` (client,cohort,x,y) with field ``column`` replaced."""
    fields = line.split(",")
    fields[column] = value
    return ",".join(fields)


def _refused(folder: Path, *expected: str) -> str:
    """The message read_assoc_files refuses the case with; it must hold each ``expected``."""
    with pytest.raises(ParameterError) as caught:
        read_case(folder, STRING, BOOLEAN)
    message = str(caught.value)
    for text in expected:
        assert text in message, (text, message)
    return message


def _same_groups(first: Path, second: Path) -> None:
    """Both cases' reports group identically (the same likelihood rows and weights)."""
    a, b = read_case(first, STRING, BOOLEAN), read_case(second, STRING, BOOLEAN)
    assert a.reports == b.reports
    for field in ("first", "second", "rows", "cols", "weights"):
        assert np.array_equal(getattr(a.groups, field), getattr(b.groups, field)), field


def test_cohorts_of_any_size_are_taken_modulo_m(case: Path, tmp_path: Path) -> None:
    """A cohort too large for 64 bits (20 digits, 2^63, or hundreds of digits) is read
    modulo m like any other, so adding multiples of m changes nothing."""
    big = tmp_path / "big"
    write_case(big, PARAMS, STRING, BOOLEAN, TABLE, 300, seed=4)
    offsets = [10**20, 2**63 - 2**63 % PARAMS.m, 10**400, 0]

    def inflate(lines: list[str]) -> None:
        for i in range(1, len(lines)):
            cohort = int(lines[i].split(",")[1])
            lines[i] = _set_field(lines[i], 1, str(cohort + PARAMS.m * offsets[i % 4]))

    _edit_reports(big, inflate)
    _same_groups(case, big)
    _edit_reports(big, lambda lines: [lines[0], _set_field(lines[1], 1, "99999999999999999999"),
                                      *lines[2:]])
    assert read_case(big, STRING, BOOLEAN).reports == 300


@pytest.mark.parametrize("column, value, rule", [
    (2, "010101010101010é", "x must be 16 characters of 0 and 1"),
    (2, "０１" * 8, "x must be 16 characters of 0 and 1"),
    (2, "٠١" * 8, "x must be 16 characters of 0 and 1"),
    (3, "١", "y must be 1 character of 0 and 1"),
    (1, "٤", "cohort must be a whole number"),
    (1, "４", "cohort must be a whole number"),
    (1, "3\x00", "cohort must be a whole number"),
    (2, "0101010101010101\x00", "x must be 16 characters"),
], ids=["accent", "full-width", "arabic-indic", "y-arabic-indic", "cohort-arabic-indic",
        "cohort-full-width", "cohort-nul", "x-nul"])
def test_characters_beyond_ascii_are_refused_by_row(case: Path, column: int, value: str,
                                                    rule: str) -> None:
    """Digits of other scripts, accents and NUL characters in a report or cohort are refused
    naming the row and the rule, not encoded (UnicodeEncodeError) nor read as digits."""
    _edit_reports(case, lambda lines: lines.__setitem__(5, _set_field(lines[5], column, value)))
    _refused(case, "reports.csv row 6:", rule, repr(value))


@pytest.mark.parametrize("where", [1, 3, 3_000])
def test_reports_that_are_not_utf8_name_the_byte_and_row(tmp_path: Path, where: int) -> None:
    """A byte that is not UTF-8 in the header, an early row, or a row far past the first
    chunk read is refused with its offset in the file and its row."""
    write_case(tmp_path / "in", PARAMS, STRING, BOOLEAN, TABLE, 4_000, seed=2)
    path = tmp_path / "in" / "reports.csv"
    lines = path.read_bytes().split(b"\n")
    lines[where - 1] = lines[where - 1][:3] + b"\xff" + lines[where - 1][3:]
    path.write_bytes(b"\n".join(lines))
    offset = sum(len(line) + 1 for line in lines[:where - 1]) + 3
    _refused(tmp_path / "in", f"not UTF-8 text (byte {offset}) in row {where}")


def test_utf16_and_binary_reports_are_refused(case: Path) -> None:
    """A report file saved as UTF-16, or binary, is refused as not UTF-8."""
    path = case / "reports.csv"
    path.write_bytes(path.read_text().encode("utf-16"))
    _refused(case, "not UTF-8 text (byte 0) in row 1", "UTF-16")
    path.write_bytes(bytes(range(256)) * 4)
    _refused(case, "not UTF-8 text (byte 128) in row 2")  # byte 10 ends row 1


@pytest.mark.parametrize("row", [2, 150])
def test_a_quote_never_closed_is_refused_naming_its_row(case: Path, row: int) -> None:
    """An unterminated quote would swallow the rest of the file: refused at its row."""
    _edit_reports(case, lambda lines: lines.__setitem__(row - 1, 'c,"1,1110011011100110,1'))
    _refused(case, f"reports.csv row {row}: a quote is never closed")


def test_quoted_fields_are_read(case: Path, tmp_path: Path) -> None:
    """Quotes that are closed are CSV, as R's write.csv writes them: read as plain fields."""
    quoted = tmp_path / "quoted"
    write_case(quoted, PARAMS, STRING, BOOLEAN, TABLE, 300, seed=4)
    _edit_reports(quoted, lambda lines: [",".join(f'"{f}"' for f in line.split(","))
                                         for line in lines])
    _same_groups(case, quoted)


def test_rows_need_one_field_per_column(case: Path) -> None:
    """A row with an extra or a missing field is refused at its row, wherever it is (an
    extra field on the first row made pandas shift every column; later it was dropped)."""
    original = (case / "reports.csv").read_text()
    for row, edit, fields in [(2, lambda line: line + ",extra", 5),
                              (120, lambda line: line + ",extra", 5),
                              (120, lambda line: line.rsplit(",", 1)[0], 3)]:
        (case / "reports.csv").write_text(original)
        _edit_reports(case, lambda lines, row=row, edit=edit: lines.__setitem__(
            row - 1, edit(lines[row - 1])))
        _refused(case, f"reports.csv row {row} has {fields} field(s) but the header has 4")


def test_a_column_named_twice_is_refused(case: Path) -> None:
    """Two columns named x: refused, rather than silently reading the first."""
    _edit_reports(case, lambda lines: [line + (",x" if i == 0 else ",0000000000000000")
                                       for i, line in enumerate(lines)])
    _refused(case, "names the column 'x' more than once")


def test_rows_are_counted_as_the_files_lines(case: Path) -> None:
    """Blank lines (skipped) still count: the row named is the line an editor shows."""
    def edit(lines: list[str]) -> list[str]:
        lines[6] = _set_field(lines[6], 2, "01x")
        return [lines[0], "", *lines[1:4], "", "  ", *lines[4:]]

    _edit_reports(case, edit)
    _refused(case, "reports.csv row 10: x must be 16 characters of 0 and 1; got '01x'")


def test_a_byte_order_mark_is_not_part_of_the_first_column(case: Path, tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a byte order mark: the schema's header and a reports
    file whose first column is the cohort are read as without it."""
    marked = tmp_path / "marked"
    write_case(marked, PARAMS, STRING, BOOLEAN, TABLE, 300, seed=4)
    for folder in (case, marked):
        _edit_reports(folder, lambda lines: [line.split(",", 1)[1] for line in lines])
    for name in ("reports.csv", "rappor-vars.csv"):
        (marked / name).write_bytes(b"\xef\xbb\xbf" + (marked / name).read_bytes())
    _same_groups(case, marked)


def _schema(folder: Path, *rows: str) -> None:
    (folder / "rappor-vars.csv").write_text("\n".join(["metric,var,var_type,params", *rows])
                                            + "\n")


def test_schema_rows_are_checked_trimmed_and_unambiguous(case: Path) -> None:
    """A schema row with fewer fields than its header names its line; metric and var are
    trimmed as var_type and params are; two rows that describe a variable differently
    are refused (not first-wins), two identical ones are one."""
    _schema(case, "m,x", "m,y,boolean,m_params")
    _refused(case, "rappor-vars.csv line 2 has 2 field(s)", "metric,var,var_type,params has 4")
    _schema(case, " m , x , string , m_params ", "m,y,boolean,m_params")
    assert read_case(case, STRING, BOOLEAN).reports == 300
    _schema(case, "m,x,string,m_params", "m,y,boolean,m_params", "m,x,string,m_params")
    assert read_case(case, STRING, BOOLEAN).reports == 300
    _schema(case, "m,x,string,m_params", "m,y,boolean,m_params", "m,x,boolean,m_params")
    _refused(case, "lines 2 and 4 describe variable x of metric m differently")
    _schema(case, 'm,x,"string,m_params', "m,y,boolean,m_params")
    _refused(case, "rappor-vars.csv line 2: a quote is never closed")


@pytest.mark.parametrize("p, q", [(0.0, 0.75), (0.25, 1.0), (0.0, 1.0)],
                         ids=["p*=0", "q*=1", "both"])
def test_deterministic_parameters_are_decoded(tmp_path: Path, p: float, q: float) -> None:
    """p* = 0 or q* = 1 makes a bit rule candidates out: their likelihood is 0 (no log of
    0, no division by 0), every report keeps a candidate that explains it, and the fit
    recovers the table within its standard errors; the command prints no warning."""
    params = StringParams(k=16, h=2, m=8, p=p, q=q, f=0.0, hashing="md5-google")
    write_case(tmp_path / "in", params, STRING, BOOLEAN, TABLE, 6_000, seed=9)
    inputs = read_case(tmp_path / "in", STRING, BOOLEAN)
    assert inputs.groups.first.min() == 0.0 and np.all(inputs.groups.first.max(axis=1) == 1)
    fit = JointEM(prior_reports=0).fit(inputs.groups)
    assert np.abs((fit.table_ - TABLE) / np.maximum(fit.std_errors_, 1e-3)).max() < 4.5
    done = _assoc(tmp_path / "in", tmp_path / "out")
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_zero_likelihoods_leave_the_fit_quiet_and_finite(tmp_path: Path) -> None:
    """On this case (q* = 1, ten candidates, no prior) an extrapolated EM step empties every
    cell some reports allow: that step is refused, and NumPy's log(0) is not shown."""
    params = StringParams(k=8, h=2, m=4, p=0.25, q=1.0, f=0.0, hashing="md5-google")
    table = np.random.default_rng(10).dirichlet(np.ones(20)).reshape(10, 2)
    candidates = Variable("x", [f"v{i}" for i in range(10)])
    write_case(tmp_path / "in", params, candidates, BOOLEAN, table, 300, seed=10)
    done = _assoc(tmp_path / "in", tmp_path / "out", "--prior-reports", "0")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    shares = np.loadtxt(tmp_path / "out" / "assoc-results.csv", delimiter=",", skiprows=1,
                        usecols=(2, 3))
    assert np.all(np.isfinite(shares)) and shares[:, 0].sum() == pytest.approx(1.0)


def test_a_report_no_candidate_explains_is_refused(tmp_path: Path) -> None:
    """With p* = 0 a report with a 1 that no candidate sets (a value missing from the map)
    has likelihood 0 under every candidate: refused naming its row, not fitted as NaN."""
    params = StringParams(k=16, h=2, m=8, p=0.0, q=0.75, f=0.0, hashing="md5-google")
    write_case(tmp_path / "in", params, STRING, BOOLEAN, TABLE, 500, seed=9)
    _edit_reports(tmp_path / "in", lambda lines: lines.__setitem__(
        40, _set_field(lines[40], 2, "1" * 16)))
    _refused(tmp_path / "in", "reports.csv row 41: no candidate of x's map could have sent",
             "with p* = 0")


def test_f_one_is_refused_as_decode_refuses_it(case: Path) -> None:
    """With f = 1 every bit is a coin flip: refused (exit 2), not fitted to the prior."""
    write_params(StringParams(k=16, h=2, m=8, p=0.25, q=0.75, f=1.0, hashing="md5-google"),
                 case / "m_params.csv")
    _refused(case, "m_params.csv: with f=1.0 every reported bit is a coin flip", "use f < 1")


@pytest.mark.parametrize("edit, expected", [
    (lambda lines: lines.__setitem__(3, _set_field(lines[3], 1, "٤")),
     "row 4: cohort must be a whole number"),
    (lambda lines: lines.__setitem__(3, _set_field(lines[3], 2, "0101010101010é01")),
     "row 4: x must be 16 characters"),
    (lambda lines: lines.__setitem__(1, 'c,"1,1110011011100110,1'),
     "row 2: a quote is never closed"),
    (lambda lines: lines.__setitem__(1, lines[1] + ",1"), "row 2 has 5 field(s)"),
], ids=["cohort", "non-ascii", "quote", "fields"])
def test_the_command_exits_2_without_a_traceback(case: Path, tmp_path: Path, edit,
                                                 expected: str) -> None:
    """The command turns each refusal into exit status 2 and one line on stderr."""
    _edit_reports(case, edit)
    done = _assoc(case, tmp_path / "out")
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_variables_and_columns_are_not_confused() -> None:
    """A variable named after the cohort column is refused before any file is read."""
    with pytest.raises(ParameterError, match="cannot be named 'cohort'"):
        read_case(Path("nowhere"), STRING, Variable("cohort", None))
