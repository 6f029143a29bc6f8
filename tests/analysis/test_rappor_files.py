"""google/rappor's interchange files: round trips, its published map vector, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from veil.server.analysis import (
    StringDecoder,
    build_map,
    counts_arrays,
    read_counts,
    read_map,
    read_params,
    read_rappor_files,
    simulate_string_counts,
    write_counts,
    write_map,
    write_params,
)
from veil.shared.errors import ParameterError
from veil.shared.hashing import bloom_indices
from veil.shared.kinds import StringParams

# google/rappor analysis/tools/hash_candidates_test.py: k=16, h=2, m=4 (its own MD5 hashing)
GOOGLE_MAP_VECTOR = """\
apple,2,16,19,32,37,47,52,55\r
banana,4,16,26,23,45,34,56,62\r
carrot,16,8,24,30,42,33,64,62\r
"""
GOOGLE_PARAMS = StringParams(k=16, h=2, m=4, p=0.5, q=0.75, f=0.5)


def test_params_round_trip(tmp_path: Path) -> None:
    params = StringParams(k=64, h=3, m=8, p=0.25, q=0.8, f=0.3)
    write_params(params, tmp_path / "params.csv")
    assert (tmp_path / "params.csv").read_text() == "k,h,m,p,q,f\n64,3,8,0.25,0.8,0.3\n"
    assert read_params(tmp_path / "params.csv") == params


def test_params_with_quoted_header_as_r_writes_it(tmp_path: Path) -> None:
    (tmp_path / "params.csv").write_text('"k","h","m","p","q","f"\n128,2,8,0.5,0.75,0\n')
    assert read_params(tmp_path / "params.csv") == StringParams(k=128, h=2, m=8, f=0.0)


def test_counts_round_trip_and_document(tmp_path: Path) -> None:
    params = StringParams(k=8, h=2, m=3)
    rng = np.random.default_rng(1)
    reports = rng.integers(50, 100, size=3)
    ones = rng.integers(0, 50, size=(3, 8))
    write_counts(reports, ones, tmp_path / "counts.csv")
    first = (tmp_path / "counts.csv").read_text().splitlines()[0].split(",")
    assert [int(v) for v in first] == [reports[0], *ones[0]]
    back_reports, back_ones = read_counts(tmp_path / "counts.csv", params)
    np.testing.assert_array_equal(back_reports, reports)
    np.testing.assert_array_equal(back_ones, ones)
    write_params(params, tmp_path / "params.csv")
    files = read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv")
    arrays = counts_arrays(files.counts)
    assert arrays.params == params
    np.testing.assert_array_equal(arrays.ones, ones)
    assert files.counts["reports"] == reports.sum()


def test_map_round_trip_equals_our_hashing(tmp_path: Path) -> None:
    params = StringParams(k=16, h=2, m=4)
    candidates = ["apple", "banana", "carrot", "caf\u00e9", "with,comma", 'with "quotes"']
    write_map(params, candidates, tmp_path / "map.csv")
    lines = (tmp_path / "map.csv").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(candidates)
    first = lines[0].split(",")
    expected = [
        cohort * params.k + bit + 1
        for cohort in range(params.m)
        for bit in bloom_indices(b"apple", cohort, params.k, params.h)
    ]
    assert first == ["apple", *map(str, expected)]
    names, matrix = read_map(tmp_path / "map.csv", params)
    assert names == candidates
    assert (matrix != build_map(params, candidates)).nnz == 0


def test_google_map_vector_is_read_as_published(tmp_path: Path) -> None:
    (tmp_path / "map.csv").write_text(GOOGLE_MAP_VECTOR, newline="")
    names, matrix = read_map(tmp_path / "map.csv", GOOGLE_PARAMS)
    assert names == ["apple", "banana", "carrot"]
    assert matrix.shape == (64, 3)
    # 1-based c*k + bit + 1: apple's first cohort sets bits 1 and 15
    assert sorted(matrix[:, 0].nonzero()[0][:2]) == [1, 15]
    assert matrix[:, 0].nnz == 8
    # carrot's 62 and banana's 62 are the same bit (cohort 3, bit 13)
    assert matrix[61, 1] == 1 and matrix[61, 2] == 1


def test_google_map_vector_decodes(tmp_path: Path) -> None:
    (tmp_path / "map.csv").write_text(GOOGLE_MAP_VECTOR, newline="")
    write_params(GOOGLE_PARAMS, tmp_path / "params.csv")
    _, matrix = read_map(tmp_path / "map.csv", GOOGLE_PARAMS)
    shares = np.array([0.5, 0.3, 0.2])
    reports, ones = simulate_string_counts(
        GOOGLE_PARAMS, matrix, shares, 400_000, np.random.default_rng(5)
    )
    write_counts(reports, ones, tmp_path / "counts.csv")
    files = read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv", tmp_path / "map.csv")
    decoder = StringDecoder(files.params).fit(
        files.reports, files.ones, files.candidates, files.candidate_map
    )
    assert decoder.detected_.all()
    z = (decoder.proportions_ - shares) / (decoder.std_errors_ / reports.sum())
    # each estimate within 4 of its own standard errors of the truth
    assert np.all(np.abs(z) < 4), z


def test_map_with_empty_fields_and_quotes(tmp_path: Path) -> None:
    params = StringParams(k=8, h=2, m=2)
    (tmp_path / "map.csv").write_text('"V_1",1,3,9,\n"V 2",2,5,12,16\n')
    names, matrix = read_map(tmp_path / "map.csv", params)
    assert names == ["V_1", "V 2"]
    assert matrix[:, 0].nnz == 3 and matrix[:, 1].nnz == 4


def test_counts_with_wrong_rows_names_the_files_and_sizes(tmp_path: Path) -> None:
    write_params(StringParams(k=4, h=2, m=3), tmp_path / "params.csv")
    write_counts(np.array([10, 10]), np.ones((2, 4), dtype=int), tmp_path / "counts.csv")
    with pytest.raises(ParameterError, match=r"counts\.csv has 2 rows but .*params\.csv says m=3"):
        read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv")


def test_counts_with_wrong_columns_names_the_files_and_sizes(tmp_path: Path) -> None:
    write_params(StringParams(k=4, h=2, m=2), tmp_path / "params.csv")
    write_counts(np.array([10, 10]), np.ones((2, 5), dtype=int), tmp_path / "counts.csv")
    with pytest.raises(ParameterError, match=r"counts\.csv has 6 columns but .*says k=4"):
        read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv")


def test_map_index_out_of_range_is_named(tmp_path: Path) -> None:
    write_params(StringParams(k=4, h=1, m=2), tmp_path / "params.csv")
    write_counts(np.array([10, 10]), np.ones((2, 4), dtype=int), tmp_path / "counts.csv")
    (tmp_path / "map.csv").write_text("a,1,9\n")
    with pytest.raises(ParameterError, match=r"map\.csv line 1 \(candidate 'a'\): index 9 is "
                                             r"outside 1\.\.m\*k = 1\.\.8"):
        read_rappor_files(tmp_path / "params.csv", tmp_path / "counts.csv", tmp_path / "map.csv")


def test_map_with_too_many_indices_is_named(tmp_path: Path) -> None:
    (tmp_path / "map.csv").write_text("a,1,2,3\n")
    with pytest.raises(ParameterError, match=r"3 indices but params says m\*h = 2\*1 = 2"):
        read_map(tmp_path / "map.csv", StringParams(k=4, h=1, m=2))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k,h,m,p,q\n1,2,3,4,5\n", "header must be k,h,m,p,q,f"),
        ("k,h,m,p,q,f\n16,2,4,0.5,0.75\n", "5 fields; expected 6"),
        ("k,h,m,p,q,f\nsixteen,2,4,0.5,0.75,0.5\n", "k must be an integer"),
        ("k,h,m,p,q,f\n16,2,4,0.8,0.75,0.5\n", "'q' parameter of StringParams must be greater"),
    ],
)
def test_bad_params_files(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "params.csv").write_text(text)
    with pytest.raises(ParameterError, match=message):
        read_params(tmp_path / "params.csv")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match=r"cannot read params file .*nope\.csv"):
        read_params(tmp_path / "nope.csv")


def test_build_map_is_binary_with_h_or_fewer_ones_per_cohort() -> None:
    params = StringParams(k=4, h=3, m=5)
    candidates = [f"v{i}" for i in range(200)]
    matrix = build_map(params, candidates)
    assert sp.isspmatrix_csc(matrix)
    assert set(np.unique(matrix.data)) == {1.0}
    for s, candidate in enumerate(candidates):
        for cohort in range(params.m):
            expected = set(bloom_indices(candidate.encode(), cohort, params.k, params.h))
            block = matrix[cohort * params.k : (cohort + 1) * params.k, s].nonzero()[0]
            assert set(block) == expected


def test_candidates_file_keeps_values_verbatim(tmp_path: Path) -> None:
    from veil.server.analysis import read_candidates

    path = tmp_path / "candidates.txt"
    path.write_bytes(" padded \r\nform\x0cfeed\nline\u2028sep\ncarriage\rreturn\n\n padded \r\n".encode())
    assert read_candidates(path) == [" padded ", "form\x0cfeed", "line\u2028sep", "carriage\rreturn"]
    path.write_bytes(b"\n\n")
    with pytest.raises(ParameterError, match="lists no candidate strings"):
        read_candidates(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ParameterError, match="not UTF-8"):
        read_candidates(path)
