"""google/rappor's files that cannot be right are refused by line and column, never read.

Each reader names the file, the line (as an editor counts it: blank lines and quoted
line breaks included) and the field of the first thing wrong, and ``veil decode`` turns it
into exit status 2 with that one line: a count no 64-bit integer holds, counts adding up
past one, a bit set in more reports than its row has, a map line missing a cohort or
listing more than ``h`` bits in one, a quote never closed, an empty candidate. A UTF-8
byte order mark (Excel's "CSV UTF-8") is read as such, not as part of the first field.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from veil.server.analysis import (
    counts_arrays,
    counts_document,
    read_candidates,
    read_counts,
    read_map,
    read_params,
    read_rappor_files,
    write_counts,
    write_map,
    write_params,
)
from veil.server.cli import main
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams

#: small parameters: cohort c holds indices c*4+1 .. c*4+4
PARAMS = StringParams(k=4, h=2, m=3)


def write_counts_text(path: Path, rows: list[list[object]]) -> Path:
    path.write_text("".join(",".join(map(str, row)) + "\n" for row in rows), encoding="utf-8")
    return path


def good_rows() -> list[list[object]]:
    """Three cohorts of 100 reports, k=4 bits each."""
    return [[100, 10, 20, 30, 40], [100, 11, 21, 31, 41], [100, 12, 22, 32, 42]]


def decode_files(tmp_path: Path, counts: Path, map_path: Path | None = None,
                 *options: str) -> list[str]:
    """``veil decode`` arguments for PARAMS, ``counts`` and a map (written if not given)."""
    write_params(PARAMS, tmp_path / "params.csv")
    if map_path is None:
        map_path = tmp_path / "map.csv"
        write_map(PARAMS, ["a", "b", "c"], map_path)
    return ["decode", "--params", str(tmp_path / "params.csv"), "--counts", str(counts),
            "--map", str(map_path), "--out", str(tmp_path / "out"), *options]


# counts.csv ---------------------------------------------------------------------------


def test_count_too_large_for_64_bits_names_line_and_column(tmp_path: Path) -> None:
    rows = good_rows()
    rows[1][0] = 10**25
    path = write_counts_text(tmp_path / "counts.csv", rows)
    with pytest.raises(ParameterError, match=r"counts\.csv line 2, column 1 \(reports\): "
                                             r"10000000000000000000000000 is more than any count"):
        read_counts(path, PARAMS)


def test_a_negative_count_too_large_for_64_bits_is_named(tmp_path: Path) -> None:
    """It slipped past the check for counts above the limit into an 'unreachable' assertion
    (a traceback)."""
    rows = good_rows()
    rows[1][0] = -(10**20)
    path = write_counts_text(tmp_path / "counts.csv", rows)
    with pytest.raises(ParameterError, match=r"counts\.csv line 2, column 1 \(reports\): "
                                             r"counts must not be negative"):
        read_counts(path, PARAMS)


def test_counts_adding_up_past_64_bits_are_refused(tmp_path: Path) -> None:
    """Each fits in 64 bits, their sum does not: refused where the sum passes the limit,
    not wrapped around into a negative total."""
    rows = good_rows()
    for row in rows:
        row[0] = 4 * 10**18
    path = write_counts_text(tmp_path / "counts.csv", rows)
    with pytest.raises(ParameterError, match=r"counts\.csv line 3, column 1 \(reports\): the "
                                             r"reports of lines 1\.\.3 add up to 120{18}"):
        read_counts(path, PARAMS)


def test_counts_document_adding_up_past_64_bits_is_refused() -> None:
    document = counts_document(PARAMS, np.array([100, 100, 100]), np.zeros((3, 4)))
    for entry in document["cohorts"]:
        entry["reports"] = 4 * 10**18
    document["reports"] = 12 * 10**18
    with pytest.raises(ParameterError, match=r"cohorts: the cohorts' reports add up to "
                                             r"12000000000000000000, more than any count"):
        counts_arrays(document)
    document["cohorts"][0]["reports"] = 10**25
    with pytest.raises(ParameterError, match=r"cohorts\[0\]\.reports: 10{25} is more than any"):
        counts_arrays(document)


@pytest.mark.parametrize(
    ("line", "column", "value", "message"),
    [
        (2, 3, "abc", r"line 2, column 4 \(bit 2\): 'abc' is not a whole number"),
        (3, 1, "", r"line 3, column 2 \(bit 0\): an empty field is not a whole number"),
        (1, 0, "1.5", r"line 1, column 1 \(reports\): '1\.5' is not a whole number"),
        (3, 4, -5, r"line 3, column 5 \(bit 3\): counts must not be negative; got -5"),
        (2, 2, 101, r"line 2, column 3 \(bit 1\): 101 reports set this bit but the row has "
                    r"only 100 reports"),
    ],
)
def test_bad_count_names_line_and_column(tmp_path: Path, line: int, column: int,
                                         value: object, message: str) -> None:
    rows = good_rows()
    rows[line - 1][column] = value
    path = write_counts_text(tmp_path / "counts.csv", rows)
    with pytest.raises(ParameterError, match=r"counts\.csv " + message) as caught:
        read_counts(path, PARAMS)
    assert "invalid literal" not in str(caught.value)


def test_count_lines_are_counted_past_blank_lines(tmp_path: Path) -> None:
    rows = good_rows()
    rows[2][1] = "x"
    path = tmp_path / "counts.csv"
    path.write_text("\n".join(",".join(map(str, row)) for row in [rows[0], [], rows[1], rows[2]])
                    + "\n", encoding="utf-8")
    with pytest.raises(ParameterError, match=r"counts\.csv line 4, column 2 \(bit 0\)"):
        read_counts(path, PARAMS)


def test_decode_names_the_counts_line_not_the_document_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bit set in more reports than its cohort has: the CSV's line and column, not the
    counts document's ``cohorts[2].ones`` the files are turned into."""
    rows = good_rows()
    rows[2][1] = 500
    counts = write_counts_text(tmp_path / "counts.csv", rows)
    assert main(decode_files(tmp_path, counts)) == 2
    err = capsys.readouterr().err
    assert "counts.csv line 3, column 2 (bit 0): 500 reports set this bit" in err
    assert "cohorts[" not in err and "Traceback" not in err


def test_decode_refuses_a_count_too_large(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = good_rows()
    rows[0][0] = 10**25
    counts = write_counts_text(tmp_path / "counts.csv", rows)
    assert main(decode_files(tmp_path, counts)) == 2
    err = capsys.readouterr().err
    assert "counts.csv line 1, column 1 (reports)" in err and "Traceback" not in err


# map.csv ------------------------------------------------------------------------------


def write_map_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="")
    return path


#: a good map line for PARAMS: two indices in each of the three cohorts
GOOD = "1,2,5,6,9,10"


@pytest.fixture(params=["plain", "quoted"])
def quote(request: pytest.FixtureRequest) -> str:
    """Candidates written bare (NumPy's bulk path) or quoted (the CSV reader's path)."""
    return "" if request.param == "plain" else '"'


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("", r"line 2 \(candidate 'b'\) lists no index: a candidate sets 1 to h=2 bits in "
             r"each of the m=3 cohorts"),
        (",,,", r"line 2 \(candidate 'b'\) lists no index:"),
        (",1,2,9,10", r"line 2 \(candidate 'b'\) lists no index in cohort 1 "
                      r"\(indices 5\.\.8\)"),
        (",1,5,6", r"line 2 \(candidate 'b'\) lists no index in cohort 2 \(indices 9\.\.12\).*"
                   r"its indices stop at 6: was the map made for fewer cohorts than m=3\?"),
        (",1,2,3,5,9", r"line 2 \(candidate 'b'\) lists 3 different indices in cohort 0 "
                       r"\(indices 1\.\.4\), but a candidate sets 1 to h=2 bits"),
    ],
)
def test_map_line_that_cannot_be_hashes_is_refused(tmp_path: Path, quote: str, second: str,
                                                   message: str) -> None:
    path = write_map_text(tmp_path / "map.csv",
                          f"{quote}a{quote},{GOOD}\n{quote}b{quote}{second}\nc,{GOOD}\n")
    with pytest.raises(ParameterError, match=r"map\.csv " + message):
        read_map(path, PARAMS)


@pytest.mark.parametrize("text", ["a\n", "a,,\n", '"a"\n'])
def test_map_whose_only_line_lists_no_index_is_refused(tmp_path: Path, text: str) -> None:
    path = write_map_text(tmp_path / "map.csv", text)
    with pytest.raises(ParameterError, match=r"map\.csv line 1 \(candidate 'a'\) lists no index:"):
        read_map(path, PARAMS)


def test_map_made_for_fewer_cohorts_is_refused(tmp_path: Path) -> None:
    write_map(StringParams(k=4, h=2, m=2), ["a", "b"], tmp_path / "map.csv")
    with pytest.raises(ParameterError, match=r"map\.csv line 1 \(candidate 'a'\) lists no index "
                                             r"in cohort 2 \(indices 9\.\.12\)"):
        read_map(tmp_path / "map.csv", PARAMS)


def test_map_with_repeats_written_once_is_read(tmp_path: Path, quote: str) -> None:
    """google/rappor's R simulation writes a bit set twice once, and leaves the field empty."""
    path = write_map_text(tmp_path / "map.csv", f"{quote}a{quote},1,5,6,9,,\nb,{GOOD}\n")
    names, matrix = read_map(path, PARAMS)
    assert names == ["a", "b"]
    assert sorted(matrix[:, 0].nonzero()[0]) == [0, 4, 5, 8]


def test_map_lines_are_counted_past_blank_lines(tmp_path: Path, quote: str) -> None:
    path = write_map_text(tmp_path / "map.csv", f"a,{GOOD}\n\n,,\n{quote}b{quote}\n")
    with pytest.raises(ParameterError, match=r"map\.csv line 4 \(candidate 'b'\) lists no index"):
        read_map(path, PARAMS)


@pytest.mark.parametrize(("text", "message"), [
    # lines are counted past quoted line breaks
    (f'"a\nb",{GOOD}\nc,1,2\n', r"line 3 \(candidate 'c'\) lists no index in cohort 1"),
    # before, the CSV reader read the rest of the file as one candidate's name
    (f'a,{GOOD}\n"b,{GOOD}\nc,{GOOD}\n', r"line 2: a quote is never closed"),
    (f'a,{GOOD}\n"b"c,{GOOD}\n', r"line 2: a closing quote must be followed"),
    (f"a,{GOOD}\n,{GOOD}\n", r"line 2: the candidate is empty"),
    (f'a,{GOOD}\n"",{GOOD}\n', r"line 2: the candidate is empty"),
    (f'"a",{GOOD}\n"b",1,x,5,9\n', r"line 2 \(candidate 'b'\), field 3: 'x' is not an index"),
    (f"a,{GOOD}\nb,{GOOD}\n\na,{GOOD}\n",
     r"line 4: candidate 'a' is listed twice \(first on line 1\)"),
])
def test_a_map_line_veil_cannot_read_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = write_map_text(tmp_path / "map.csv", text)
    with pytest.raises(ParameterError, match=r"map\.csv " + message):
        read_map(path, PARAMS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"a,{GOOD}\n\"b,{GOOD}\n", "map.csv line 2: a quote is never closed"),
        (f"a,{GOOD}\nb\n", "map.csv line 2 (candidate 'b') lists no index"),
        (f"a,{GOOD}\nb,1,5\n", "map.csv line 2 (candidate 'b') lists no index in cohort 2 "
                               "(indices 9..12)"),
    ],
)
def test_decode_refuses_a_bad_map(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  text: str, message: str) -> None:
    counts = write_counts_text(tmp_path / "counts.csv", good_rows())
    map_path = write_map_text(tmp_path / "map.csv", text)
    assert main(decode_files(tmp_path, counts, map_path)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# byte order marks ---------------------------------------------------------------------


BOM = "\ufeff"


def test_files_starting_with_a_byte_order_mark_are_read(tmp_path: Path, quote: str) -> None:
    """Excel's "CSV UTF-8" starts each file with a byte order mark; it is no part of the
    header, the first count or the first candidate."""
    write_params(PARAMS, tmp_path / "params.csv")
    write_counts(np.array([100, 100, 100]), np.full((3, 4), 10), tmp_path / "counts.csv")
    for name in ("params.csv", "counts.csv"):
        path = tmp_path / name
        path.write_text(BOM + path.read_text(encoding="utf-8"), encoding="utf-8")
    map_path = write_map_text(tmp_path / "map.csv", f"{BOM}{quote}a{quote},{GOOD}\nb,{GOOD}\n")
    files = read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv", map_path)
    assert files.params == PARAMS
    assert files.reports.tolist() == [100, 100, 100]
    assert files.candidates == ["a", "b"]


def test_open_text_files_with_a_byte_order_mark_are_read() -> None:
    """A file opened as ``utf-8`` (not ``utf-8-sig``) keeps the mark as its first character."""
    params = read_params(io.StringIO(f"{BOM}k,h,m,p,q,f\n4,2,3,0.5,0.75,0.5\n"))
    assert (params.k, params.h, params.m) == (4, 2, 3)
    reports, _ = read_counts(io.StringIO(f"{BOM}100,1,2,3,4\n"))
    assert reports.tolist() == [100]
    names, _ = read_map(io.StringIO(f'{BOM}"a",{GOOD}\n'), PARAMS)
    assert names == ["a"]


def test_candidates_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "candidates.txt"
    path.write_text(f"{BOM}apple\nbanana\n", encoding="utf-8")
    assert read_candidates(path) == ["apple", "banana"]


# options google/rappor files cannot honour ---------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--start", "2024-03-01"], "--start needs collected data (--server or --db): "
                                    "google/rappor files hold no days"),
        (["--end", "2024-03-01"], "--end needs collected data (--server or --db): "
                                  "google/rappor files hold no days"),
        (["--metric", "homepage"], "--metric needs collected data (--server or --db): "
                                   "google/rappor files name no metric"),
        (["--force"], "--force needs collected data (--server or --db): "
                      "google/rappor files name no metric"),
    ],
)
def test_decode_of_files_refuses_options_it_would_ignore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    counts = write_counts_text(tmp_path / "counts.csv", good_rows())
    assert main(decode_files(tmp_path, counts, None, *options)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
