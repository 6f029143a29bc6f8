"""``veil decode --estimator ibu`` and ``--all`` from the outside: reports encoded by the real
client encoders, uploaded over HTTP to a real ``veil serve``, decoded from its SQLite file
and from google/rappor files with the command, and read back as a user reads them."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.analysis.test_cli import _upload
from veil.server.analysis import (
    build_map,
    simulate_string_counts,
    write_counts,
    write_map,
    write_params,
)
from veil.server.cli import main
from veil.shared.kinds import StringParams
from veil.shared.registry import Registry

REGISTRY = Registry.from_toml("""\
version = 1

[metrics.browser]
kind = "category"
oracle = "grr"
epsilon = 0.5
min_reports = 1
categories = ["firefox", "chrome", "safari", "edge", "opera", "other"]

[metrics.os]
kind = "category"
oracle = "oue"
epsilon = 0.5
min_reports = 1
categories = ["linux", "mac", "windows", "bsd", "haiku", "plan9"]

[metrics.dark_mode]
kind = "boolean"
min_reports = 1
""")
#: three of six categories absent: at epsilon 0.5 and 3,000 reports their unbiased shares
#: fall below 0 about half the time each, where IBU's may not
SHARES = [0.6, 0.3, 0.1, 0.0, 0.0, 0.0]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("metric", ["browser", "os"])
def test_ibu_shares_are_non_negative_and_sum_to_one(collector_factory, tmp_path: Path,
                                                      metric: str) -> None:
    collector = collector_factory(REGISTRY)
    labels = list(REGISTRY[metric].params.categories)
    values = random.Random(7).choices(labels, weights=SHARES, k=3000)
    _upload(collector, metric, values, seed=3)
    outputs = {}
    for estimator in ("unbiased", "ibu"):
        out = tmp_path / f"{metric}-{estimator}"
        assert main(["decode", "--db", str(collector.db_path), "--metric", metric,
                     "--estimator", estimator, "--out", str(out)]) == 0
        outputs[estimator] = (_rows(out / "results.csv"),
                              json.loads((out / "summary.json").read_text()))
    unbiased, _ = outputs["unbiased"]
    rows, summary = outputs["ibu"]
    assert min(float(row["proportion"]) for row in unbiased) < 0  # what IBU is for
    shares = np.array([float(row["proportion"]) for row in rows])
    assert shares.min() >= 0
    assert shares.sum() == pytest.approx(1.0, abs=1e-9)
    assert summary["estimator"] == "ibu" and summary["ibu_converged"]
    truth = {label: values.count(label) / len(values) for label in labels}
    for row in rows:
        low, high = float(row["prop_low_95"]), float(row["prop_high_95"])
        assert low <= float(row["proportion"]) <= high
        # each interval holds the composition's share (a 95% interval: 6 of 6 hold here)
        assert low <= truth[row["value"]] <= high, row
        # the p-value still tests the unbiased share
        assert row["p_value"] == next(u["p_value"] for u in unbiased if u["value"] == row["value"])


def test_ibu_is_refused_by_name_where_it_does_not_apply(
        collector_factory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    collector = collector_factory(REGISTRY)
    _upload(collector, "dark_mode", [True, False] * 50, seed=4)
    code = main(["decode", "--db", str(collector.db_path), "--metric", "dark_mode",
                 "--estimator", "ibu", "--out", str(tmp_path / "out")])
    assert code != 0
    assert "estimator" in capsys.readouterr().err


def test_all_ranks_every_candidate_with_its_p_value(tmp_path: Path) -> None:
    params = StringParams(k=32, h=2, m=8)
    names = ["alpha.example", "beta.example", "gamma.example"]
    reports, ones = simulate_string_counts(params, build_map(params, names),
                                           np.array([0.6, 0.3, 0.1]), 300_000,
                                           np.random.default_rng(41))
    write_params(params, tmp_path / "params.csv")
    write_counts(reports, ones, tmp_path / "counts.csv")
    decoys = [f"decoy{i}.example" for i in range(40)]
    write_map(params, names + decoys, tmp_path / "map.csv")
    files = ["--params", str(tmp_path / "params.csv"), "--counts", str(tmp_path / "counts.csv"),
             "--map", str(tmp_path / "map.csv")]
    assert main(["decode", *files, "--out", str(tmp_path / "default")]) == 0
    assert main(["decode", *files, "--all", "--out", str(tmp_path / "all")]) == 0
    detected = [row["string"] for row in _rows(tmp_path / "default" / "results.csv")]
    ranked = _rows(tmp_path / "all" / "results.csv")
    assert sorted(row["string"] for row in ranked) == sorted(names + decoys)
    assert [int(row["rank"]) for row in ranked] == list(range(1, 44))
    assert [row["string"] for row in ranked if row["detected"] == "1"] == detected
    assert [row["string"] for row in ranked[:3]] == names  # the true strings lead
    p_values = [float(row["p_value"]) for row in ranked]
    assert p_values == sorted(p_values) and all(0 <= p <= 1 for p in p_values)
