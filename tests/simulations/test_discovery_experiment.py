"""``veil experiment discovery``: Veil's discovery and PEM side by side, end to end."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from veil.server.analysis.tables import STRING_COLUMNS
from veil.server.cli import main
from veil.simulations.discovery import url_population
from veil.simulations.discovery_experiment import (
    DISCOVERED_COLUMNS,
    QUICK_LENGTH,
    figures_of_merit,
    string_channel_params,
    url_zipf_population,
)


def test_the_quick_experiment_writes_its_table_report_and_plot(tmp_path: Path, capsys) -> None:
    out = tmp_path / "discovery"
    assert main(["experiment", "discovery", "--quick", "--reports", "200000", "--seed", "3",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("recall") == 2 and "report.html" in printed
    with open(out / "discovered.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(DISCOVERED_COLUMNS) == ["method", *STRING_COLUMNS]
    assert {row["method"] for row in rows} == {"veil", "pem"}
    with open(out / "metrics.csv", newline="", encoding="utf-8") as handle:
        metrics = {row["method"]: row for row in csv.DictReader(handle)}
    # the two most frequent of 2,000 Zipf(1.1) strings hold about 17% and 8%: at 200,000
    # reports both methods must find them, by name. The population is the one
    # discovery_experiment draws in quick mode, first from the generator of the seed.
    population = url_zipf_population(2_000, np.random.default_rng(3), high=QUICK_LENGTH)
    top = sorted(zip(population.probs, population.values, strict=True), reverse=True)[:2]
    assert [float(share) for share, _ in top] == pytest.approx([0.169, 0.079], abs=5e-4)
    for method in ("veil", "pem"):
        found = {row["string"] for row in rows if row["method"] == method}
        assert {value for _, value in top} <= found, method
    # the metrics count what the rows show: both top strings are among the strings of 1%
    # and more, so recall at 1% is at least 2 of them; precision is a share
    common = sum(share >= 0.01 for share in population.shares.values())
    for method in ("veil", "pem"):
        assert float(metrics[method]["recall_0.01"]) >= 2 / common - 1e-9, method
        assert 0.0 < float(metrics[method]["precision"]) <= 1.0, method
    assert (out / "discovery.png").stat().st_size > 1000 and (out / "report.html").exists()


def test_population_csv_and_bad_input(tmp_path: Path, capsys) -> None:
    population = tmp_path / "population.csv"
    population.write_text("value,count\nhttps://a.example/,600\nhttps://b.example/x,400\n")
    out = tmp_path / "out"
    assert main(["experiment", "discovery", "--population", str(population), "--quick",
                 "--no-pem", "--reports", "50000", "--out", str(out)]) == 0
    with open(out / "discovered.csv", newline="", encoding="utf-8") as handle:
        found = {row["string"] for row in csv.DictReader(handle)}
    assert found == {"https://a.example/", "https://b.example/x"}
    capsys.readouterr()
    assert main(["experiment", "discovery", "--reports", "0", "--out", str(out)]) == 2
    assert "--reports" in capsys.readouterr().err


def test_figures_of_merit() -> None:
    shares = {"a": 0.5, "b": 0.3, "c": 0.005, "d": 0.001}
    merit = figures_of_merit(["a", "c", "zzz"], shares)
    assert merit["recall_0.01"] == 0.5 and merit["recall_0.003"] == pytest.approx(2 / 3)
    assert merit["precision"] == pytest.approx(2 / 3)
    assert merit["f1_top32"] == pytest.approx(2 * 2 / (4 + 3))


def test_the_string_channel_spends_the_stated_epsilon() -> None:
    params = string_channel_params(4.0)
    assert params.epsilon_inf <= 4.0 and params.epsilon_inf == pytest.approx(4.0, rel=1e-8)
    # no instantaneous response (p=0, q=1): one report reveals what all reports do
    assert params.epsilon_1 == params.epsilon_inf
    assert (params.p, params.q, params.h) == (0.0, 1.0, 1)


def test_url_population_is_distinct_bounded_and_seeded() -> None:
    values = url_population(500, np.random.default_rng(1), high=24)
    assert len(set(values)) == 500 and all(8 <= len(v) <= 24 for v in values)
    assert values == url_population(500, np.random.default_rng(1), high=24)
