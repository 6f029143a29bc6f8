"""What an analyst reads in a result's table: interval columns named for the confidence
asked (``confidence=0.9`` used to write ``low_95``), ``--confidence`` on the command line,
by-day results from :func:`decode_metric` (``by="day"`` used to raise a TypeError), ``day``
typed as a date, and a number's ``mean`` row without the share and p-value columns that
mean nothing for a mean.

The database is a real collector SQLite file written by ``tests/analysis/test_by_day.py``'s
helpers (SDK-encoded, seeded reports on three days).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.stats import norm

from tests.analysis.test_by_day import METRIC, boolean_days, read_csv, write_days
from veil.server.analysis import decode_metric
from veil.server.analysis.daily import DailyResult
from veil.server.cli import main
from veil.shared.errors import ParameterError
from veil.shared.kinds import NumberParams


def test_interval_columns_are_named_for_the_confidence_asked(tmp_path: Path) -> None:
    db = boolean_days(tmp_path)
    wide = decode_metric(db=db, metric=METRIC, force=True)
    narrow = decode_metric(db=db, metric=METRIC, force=True, confidence=0.9)
    assert {"low_95", "prop_high_95"} <= set(wide.columns)
    assert {"low_90", "high_90", "prop_low_90", "prop_high_90"} <= set(narrow.columns)
    assert not any(name.endswith("_95") for name in narrow.columns)
    frame = narrow.to_pandas()
    row, reference = frame.iloc[0], wide.rows[0]
    # the same estimate and standard error; the half-width scales with the normal quantile
    ratio = norm.ppf(0.95) / norm.ppf(0.975)
    half = (row["prop_high_90"] - row["prop_low_90"]) / 2
    assert half == pytest.approx(ratio * (reference["prop_high_95"] - reference["prop_low_95"])
                                 / 2, rel=1e-9)
    assert "90% interval" in narrow._repr_html_()
    by_day = decode_metric(db=db, metric=METRIC, force=True, confidence=0.999, by="day")
    assert "low_99_9" in by_day.columns and "low_95" not in by_day.columns


def test_veil_decode_takes_confidence(tmp_path: Path) -> None:
    db = boolean_days(tmp_path)
    out = tmp_path / "out"
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--force", "--confidence",
                 "0.9", "--out", str(out)]) == 0
    columns, _ = read_csv(out / "results.csv")
    assert "low_90" in columns and "high_90" in columns and "low_95" not in columns
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--confidence", "1.5",
                 "--out", str(out)]) == 2


def test_decode_metric_by_day_from_python_with_days_as_dates(tmp_path: Path) -> None:
    db = boolean_days(tmp_path)
    daily = decode_metric(db=db, metric=METRIC, by="day")
    assert isinstance(daily, DailyResult)
    frame = daily.to_pandas()
    assert str(frame["day"].dtype).startswith("datetime64")
    assert [day.date().isoformat() for day in frame["day"].drop_duplicates()] == [
        "2024-03-01", "2024-03-02", "2024-03-04"]
    with pytest.raises(ParameterError, match="by must be 'day'"):
        decode_metric(db=db, metric=METRIC, by="week")


def test_a_number_mean_row_leaves_share_and_p_value_empty(tmp_path: Path) -> None:
    params = NumberParams(low=0, high=120, epsilon=2.0)
    db = write_days(tmp_path / "veil.db", params, {"2024-03-01": {30.0: 0.5, 90.0: 0.5}})
    result = decode_metric(db=db, metric=METRIC)
    (row,) = result.rows
    assert row["value"] == "mean" and 40 < row["estimate"] < 80
    for name in ("proportion", "prop_std_error", "prop_low_95", "prop_high_95", "p_value",
                 "log10_p_value"):
        assert row[name] is None, name
        assert math.isnan(result.to_pandas()[name].iloc[0])
    out = tmp_path / "out"
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--out", str(out)]) == 0
    _, rows = read_csv(out / "results.csv")
    assert rows[0]["proportion"] == "" and rows[0]["p_value"] == ""
    assert rows[0]["low_95"] != ""
