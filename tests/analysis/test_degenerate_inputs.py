"""Degenerate and malformed inputs give clear errors or sensible fits, never crashes."""

from __future__ import annotations

import numpy as np
import pytest

from veil.server.analysis import (
    StringDecoder,
    build_map,
    counts_document,
    decode_counts,
    simulate_string_counts,
)
from veil.shared.errors import ParameterError
from veil.shared.kinds import StringParams


def _simulate(params: StringParams, shares: list[float], reports: int, seed: int, names: list[str]):
    true_map = build_map(params, names)
    return simulate_string_counts(params, true_map, np.array(shares), reports, np.random.default_rng(seed))


def test_zero_reports_is_a_clear_error() -> None:
    params = StringParams(k=8, h=2, m=2)
    with pytest.raises(ParameterError, match="no reports to decode"):
        StringDecoder(params).fit(np.zeros(2, int), np.zeros((2, 8), int), ["a"])


def test_f_equal_one_carries_no_information() -> None:
    params = StringParams(k=8, h=2, m=2, f=1.0)
    with pytest.raises(ParameterError, match=r"f=1\.0 .*no information"):
        StringDecoder(params).fit(np.array([10, 10]), np.full((2, 8), 5), ["a"])


@pytest.mark.parametrize(
    ("reports", "ones", "message"),
    [
        (np.array([10, 10, 10]), np.zeros((3, 8), int), "3 cohort row.* m=2"),
        (np.array([10, 10]), np.zeros((2, 7), int), r"shape \(2, 7\).*\(2, 8\)"),
        (np.array([10, 10]), np.full((2, 8), 11), "cohort 0 bit 0 has 11 ones but only 10 reports"),
        (np.array([10, -1]), np.zeros((2, 8), int), "must not be negative"),
    ],
)
def test_mismatched_or_impossible_counts(reports: np.ndarray, ones: np.ndarray, message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        StringDecoder(StringParams(k=8, h=2, m=2)).fit(reports, ones, ["a"], source="counts.csv")


def test_map_of_the_wrong_shape_is_named() -> None:
    params = StringParams(k=8, h=2, m=2)
    wrong = build_map(StringParams(k=8, h=2, m=3), ["a", "b"])
    with pytest.raises(ParameterError, match=r"shape \(24, 2\); expected .* \(16, 2\)"):
        StringDecoder(params).fit(np.array([10, 10]), np.zeros((2, 8), int), ["a", "b"], wrong)


def test_one_cohort() -> None:
    params = StringParams(k=64, h=2, m=1)
    reports, ones = _simulate(params, [0.6, 0.4], 100_000, 1, ["x", "y"])
    decoder = StringDecoder(params).fit(reports, ones, ["x", "y", "z", "w"])
    assert list(decoder.detected_) == [True, True, False, False]
    assert np.all(np.abs(decoder.proportions_[:2] - [0.6, 0.4]) < 4 * decoder.std_errors_[:2] / 100_000)


def test_empty_cohorts_contribute_no_equations() -> None:
    params = StringParams(k=32, h=2, m=8)
    reports, ones = _simulate(params, [0.7, 0.3], 100_000, 2, ["x", "y"])
    reports[[1, 5]] = 0
    ones[[1, 5]] = 0
    decoder = StringDecoder(params).fit(reports, ones, ["x", "y", "z"])
    assert decoder.summary_["cohorts_with_reports"] == 6
    assert decoder.summary_["equations"] == 6 * 32
    assert list(decoder.detected_) == [True, True, False]
    assert np.all(np.isinf(decoder.bit_variances_[[1, 5]]))


def test_more_candidates_than_equations() -> None:
    params = StringParams(k=8, h=2, m=4)  # 32 equations
    names = [f"c{i}" for i in range(500)]
    reports, ones = _simulate(params, [0.8, 0.2], 400_000, 3, names[:2])
    decoder = StringDecoder(params).fit(reports, ones, names)
    assert decoder.summary_["equations"] == 32
    assert decoder.summary_["candidates"] == 500
    assert decoder.detected_[0]
    assert np.all(np.isfinite(decoder.std_errors_))
    assert decoder.summary_["detected"] <= 32


def test_no_string_detected_gives_an_empty_table() -> None:
    params = StringParams(k=16, h=2, m=4)
    reports, ones = _simulate(params, [1.0], 2_000, 4, ["hidden"])
    decoder = StringDecoder(params).fit(reports, ones, ["a", "b", "c"])
    assert decoder.result_.rows == []
    assert decoder.summary_["detected"] == 0
    assert decoder.result_.to_records().shape == (0,)


def test_identical_candidates_in_a_map_do_not_crash() -> None:
    params = StringParams(k=16, h=2, m=4)
    reports, ones = _simulate(params, [1.0], 50_000, 5, ["x"])
    twin = build_map(params, ["x", "x"])
    decoder = StringDecoder(params).fit(reports, ones, ["x", "x-copy"], twin)
    assert decoder.proportions_.sum() == pytest.approx(1.0, abs=0.05)


def test_strings_need_candidates() -> None:
    params = StringParams(k=8, h=2, m=2)
    document = counts_document(params, np.array([10, 10]), np.full((2, 8), 5))
    with pytest.raises(ParameterError, match="give the candidate strings"):
        decode_counts(document)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["cohorts"].pop(), "has 1 entries but the string parameters have 2"),
        (lambda d: d["cohorts"][0]["ones"].pop(), r"cohorts\[0\]\.ones: must list k=8 counts; got 7"),
        (lambda d: d.update(reports=3), "says 3 but the cohorts add up to 20"),
        (lambda d: d["params"].update(k="eight"), r"params\.k"),
        (lambda d: d["cohorts"][1].update(reports=-4), r"cohorts\[1\]\.reports: must be a non-negative"),
    ],
)
def test_bad_counts_documents(change, message: str) -> None:
    params = StringParams(k=8, h=2, m=2)
    document = counts_document(params, np.array([10, 10]), np.full((2, 8), 5))
    change(document)
    with pytest.raises(ParameterError, match=message):
        decode_counts(document, ["a"], source="homepage.json")
