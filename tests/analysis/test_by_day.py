"""Days: ``start``/``end`` are the days the counts cover, and ``veil decode --by day`` (and
:func:`veil.server.analysis.decode_metric_by_day`) decodes each day on its own.

The database is a real collector SQLite file: reports encoded by the SDK encoders (seeded),
validated as the collector validates them and stored with :meth:`Storage.insert` under the
day they were received. Each day has its own truth, so a day-by-day decode must follow it.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.test_common_checks import population, sdk_reports
from veil.server.analysis import RESULT_COLUMNS, candidate_map, decode_metric, decode_metric_by_day
from veil.server.analysis.candidate_map import read_candidates
from veil.server.cli import main
from veil.server.storage import open_storage
from veil.shared.kinds import BooleanParams, MechanismParams, NumberParams, StringParams
from veil.shared.registry import Metric, Registry
from veil.shared.wire import make_batch, validate_batch

METRIC = "m"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: the share answering true on each day with reports (2024-03-03 has none)
TRUE_SHARES = {"2024-03-01": 0.2, "2024-03-02": 0.5, "2024-03-04": 0.8}
REPORTS_PER_DAY = 2000
#: a day with fewer reports than the metric's min_reports
SMALL_DAY = "2024-03-05"
MIN_REPORTS = 100


def write_days(path: Path, params: MechanismParams, days: dict[str, dict[Any, float]],
               sizes: dict[str, int] | None = None) -> Path:
    """A collector database with ``params`` as :data:`METRIC` (``min_reports`` 100) and, on
    each day, SDK-encoded reports of a population with that day's shares."""
    registry = Registry([Metric(METRIC, params, description="minutes per session",
                                min_reports=MIN_REPORTS)])
    with open_storage(path, registry, create=True) as storage:
        for number, (day, shares) in enumerate(days.items()):
            size = (sizes or {}).get(day, REPORTS_PER_DAY)
            reports = [
                {**report, "id": f"{number:04x}{report['id'][4:]}"}  # ids unique over days
                for report in sdk_reports(params, population(shares, size, seed=number), number)
            ]
            batch = validate_batch(make_batch(f"{number:032x}", reports), registry)
            assert batch.errors == []
            assert storage.insert(batch.reports, day=day).accepted == size
    return path


def boolean_days(tmp_path: Path) -> Path:
    shares = {day: {True: share, False: 1 - share} for day, share in TRUE_SHARES.items()}
    return write_days(tmp_path / "veil.db", BooleanParams(alpha=0.6, beta=0.4),
                      {**shares, SMALL_DAY: {True: 0.5, False: 0.5}}, {SMALL_DAY: 10})


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_summary_states_the_days_the_counts_cover_not_the_range_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = boolean_days(tmp_path)
    out = tmp_path / "out"
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--start", "2024-01-01",
                 "--end", "2024-12-31", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["start"], summary["end"]) == ("2024-03-01", SMALL_DAY)
    assert summary["days_with_reports"] == 4
    assert "from 2024-03-01 to 2024-03-05" in capsys.readouterr().out
    # an open range, and a range that cuts into the data, cover what they hold
    assert decode_metric(db=db, metric=METRIC).summary["start"] == "2024-03-01"
    part = decode_metric(db=db, metric=METRIC, start="2024-03-02", end="2024-03-03").summary
    assert (part["start"], part["end"], part["reports"]) == ("2024-03-02", "2024-03-02",
                                                            REPORTS_PER_DAY)


def test_by_day_writes_a_tidy_table_and_a_chart_that_follow_each_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = boolean_days(tmp_path)
    out = tmp_path / "out"
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--by", "day",
                 "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"3 day(s) decoded, 1 skipped (fewer reports than needed): {SMALL_DAY}" in stdout
    assert (out / "by_day.png").read_bytes().startswith(PNG_MAGIC)
    header, rows = read_csv(out / "by_day.csv")
    assert header == ["day", *RESULT_COLUMNS]
    assert [(row["day"], row["value"]) for row in rows] == [
        (day, value) for day in TRUE_SHARES for value in ("true", "false")]
    for row in rows:
        if row["value"] == "true":
            # each day's estimate follows that day's truth: within 4 of its standard errors
            truth = TRUE_SHARES[row["day"]]
            assert abs(float(row["proportion"]) - truth) < 4 * float(row["prop_std_error"]), row
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["by_day"]["days"] == list(TRUE_SHARES)
    assert SMALL_DAY in summary["by_day"]["skipped"]
    # each day's rows are that day's decode on its own
    daily = decode_metric_by_day(db=db, metric=METRIC)
    for day in TRUE_SHARES:
        alone = decode_metric(db=db, metric=METRIC, start=day, end=day)
        assert next(row for row in rows if row["day"] == day)["proportion"] == repr(
            alone.rows[0]["proportion"])
        assert dict(daily.days)[day].rows == alone.rows
    # --force decodes the small day too, as it does a small range
    forced = decode_metric_by_day(db=db, metric=METRIC, force=True)
    assert [day for day, _ in forced.days] == [*TRUE_SHARES, SMALL_DAY]
    assert forced.skipped == {}


def test_by_day_hashes_each_candidate_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The whole range and every day share one candidate map (the same parameters and
    candidates), and the candidates file is read once."""
    db = write_days(tmp_path / "veil.db", StringParams(k=32, h=2, m=8),
                    {"2024-03-01": {"a.example": 1.0}, "2024-03-02": {"b.example": 1.0}})
    (tmp_path / "candidates.txt").write_text("a.example\nb.example\n", encoding="utf-8")
    reads: list[str] = []

    def counted(path: Any) -> list[str]:
        reads.append(str(path))
        return read_candidates(path)

    monkeypatch.setattr(candidate_map, "read_candidates", counted)
    candidate_map.remembered_map.cache_clear()
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--candidates",
                 str(tmp_path / "candidates.txt"), "--by", "day", "--out",
                 str(tmp_path / "out")]) == 0
    assert "2 day(s) decoded" in capsys.readouterr().out
    # the map is built for the whole range, and the two days find it remembered
    cache = candidate_map.remembered_map.cache_info()
    assert (cache.misses, cache.hits) == (1, 2)
    assert reads == [str(tmp_path / "candidates.txt")]


def test_by_day_pandas_and_plot(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    db = write_days(tmp_path / "veil.db",
                    NumberParams(low=0.0, high=60.0, mechanism="laplace", epsilon=2.0),
                    {"2024-03-01": {10.0: 1.0}, "2024-03-02": {50.0: 1.0}})
    daily = decode_metric_by_day(db=db, metric=METRIC)
    frame = daily.to_pandas()
    assert list(frame.columns) == ["day", *RESULT_COLUMNS]
    assert str(frame["day"].dtype).startswith("datetime64")
    assert frame["estimate"].tolist() == [row["estimate"] for _, r in daily.days for row in r.rows]
    for mean, se, expected in zip(frame["estimate"], frame["std_error"], [10.0, 50.0],
                                  strict=True):
        # discrete Laplace noise of scale 64 / 2 grid steps (sd about 45 steps of 60/64, 42
        # units) over 2,000 reports: a standard error near 0.95; unbiased, so within 4 of it
        assert 0.8 < se < 1.1
        assert abs(mean - expected) < 4 * se
    ax = daily.plot()
    try:
        assert len(ax.get_lines()) == 1  # one series: the mean
        assert "minutes per session" in ax.get_ylabel()
    finally:
        plt.close(ax.figure)
    assert "<table>" in daily._repr_html_() and "2024-03-02" in daily._repr_html_()


def test_by_day_refuses_google_rappor_files(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "params.csv").write_text("k,h,m,p,q,f\n8,1,1,0.5,0.75,0.5\n", encoding="utf-8")
    (tmp_path / "counts.csv").write_text("10,1,2,3,4,5,6,7,8\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("a\n", encoding="utf-8")
    assert main(["decode", "--params", str(tmp_path / "params.csv"), "--counts",
                 str(tmp_path / "counts.csv"), "--candidates", str(tmp_path / "c.txt"),
                 "--by", "day", "--out", str(tmp_path / "out")]) == 2
    assert "--by day needs collected data" in capsys.readouterr().err


def test_by_day_over_http_lists_the_collectors_days(
    live_collector, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Over HTTP a decode reads the same days; the read token comes from $VEIL_READ_TOKEN."""
    params = live_collector.registry["dark_mode"].params
    registry = live_collector.registry
    with open_storage(live_collector.db_path) as storage:
        for number, day in enumerate(["2024-03-01", "2024-03-03"]):
            reports = [{**report, "metric": "dark_mode", "id": f"{number:04x}{report['id'][4:]}"}
                       for report in sdk_reports(params, [True] * 300, number)]
            batch = validate_batch(make_batch(f"{number:032x}", reports), registry)
            assert batch.errors == []
            storage.insert(batch.reports, day=day)
    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VEIL_READ_TOKEN", live_collector.token)
        assert main(["decode", "--server", live_collector.url, "--metric", "dark_mode",
                     "--start", "2024-01-01", "--end", "2024-12-31", "--by", "day",
                     "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["start"], summary["end"]) == ("2024-03-01", "2024-03-03")
    assert summary["by_day"] == {"days": ["2024-03-01", "2024-03-03"], "skipped": {}}
    _, rows = read_csv(out / "by_day.csv")
    assert {row["day"] for row in rows} == {"2024-03-01", "2024-03-03"}
    assert all(math.isfinite(float(row["proportion"])) for row in rows)
    capsys.readouterr()
