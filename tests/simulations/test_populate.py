"""``veil populate`` against a real ``veil serve``, then ``veil decode --server`` on every metric."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from tests.test_common_checks import EXAMPLES, IDS
from veil.client import make_encoder
from veil.server.cli import main
from veil.server.storage import open_storage
from veil.shared.kinds.joint import JointParams
from veil.shared.registry import Metric, Registry
from veil.simulations.demo import DECOYS, SITES, YES_SHARE
from veil.simulations.populate import draw_population

#: one metric of each kind; not tests/conftest.py's TEST_REGISTRY, because the category metric
#: takes oracle "auto", which leaves a note in its registry entry (the regression tested here:
#: decoding it from the collector must not take the note for a parameter), the string metric
#: releases counts only from 1000 reports, as a real deployment would, and the boolean metric
#: states the alpha = 0.5 that the yes-share's tolerance below is derived for
REGISTRY = Registry.from_toml("""
version = 1

[metrics.homepage]
kind = "string"
min_reports = 1000
k = 32
h = 2
m = 4

[metrics.browser]
kind = "category"
oracle = "auto"
epsilon = 2.0
categories = ["chrome", "firefox", "safari", "other"]

[metrics.dark_mode]
kind = "boolean"
alpha = 0.5

[metrics.load_seconds]
kind = "number"
low = 0
high = 10
mechanism = "laplace"
epsilon = 1.0

[metrics.dark_mode_by_browser]
kind = "joint"
of = ["browser", "dark_mode"]
epsilon = 4.0
""")
INSTALLATIONS = 4000
def test_populate_uploads_every_metric_and_each_decodes(collector_factory, tmp_path, capsys,
                                                        monkeypatch) -> None:
    collector = collector_factory(REGISTRY, upload_token="populate-upload-token")
    candidates = tmp_path / "candidates.txt"
    monkeypatch.setenv("VEIL_UPLOAD_TOKEN", "populate-upload-token")
    assert main(["populate", "--server", collector.url, "--installations", str(INSTALLATIONS),
                 "--candidates-out", str(candidates)]) == 0
    printed = capsys.readouterr().out
    for name in REGISTRY:
        assert f"{name}: {INSTALLATIONS:,} reports accepted" in printed
        assert collector.counts(name)["reports"] == INSTALLATIONS
    assert candidates.read_text().split() == [*SITES, *DECOYS]

    # the category metric's registry entry carries the note of oracle "auto": decoding it
    # from the collector's counts document must not take the note for a parameter
    for name in REGISTRY:
        out = tmp_path / name
        args = ["decode", "--server", collector.url, "--token", collector.token,
                "--metric", name, "--out", str(out)]
        if name == "homepage":
            args += ["--candidates", str(candidates)]
        assert main(args) == 0, name
        assert json.loads((out / "summary.json").read_text())["reports"] == INSTALLATIONS

    with open(tmp_path / "dark_mode" / "results.csv", newline="") as table:
        rows = {row["value"]: row for row in csv.DictReader(table)}
    # randomized response with alpha = 0.5 (p* = 0.25, q* = 0.75): the estimated yes-share's
    # sampling sd is sqrt(r (1 - r)) / (q* - p*) / sqrt(N) for the rate r of yes answers, at
    # most sqrt(1/4) / 0.5 / sqrt(4000) = 1 / sqrt(4000) = 0.0158; the drawn population's own
    # share has sd sqrt(0.35 * 0.65 / 4000) = 0.0075 around YES_SHARE; combined in quadrature
    # that is 0.0175, and 5 of those (0.088) bound the estimate's distance from YES_SHARE
    sampling = math.sqrt(1 / 4) / (0.75 - 0.25) / math.sqrt(INSTALLATIONS)
    population = math.sqrt(YES_SHARE * (1 - YES_SHARE) / INSTALLATIONS)
    assert float(rows["true"]["proportion"]) == pytest.approx(
        YES_SHARE, abs=5 * math.hypot(sampling, population))


def test_populate_names_an_unknown_metric(collector, capsys) -> None:
    assert main(["populate", "--server", collector.url, "--installations", "10",
                 "--metric", "no_such_metric"]) == 2
    assert "no_such_metric" in capsys.readouterr().err


def test_populate_without_the_upload_token_says_how_to_give_it(collector_factory, capsys,
                                                             monkeypatch) -> None:
    collector = collector_factory(REGISTRY, upload_token="required-token")
    monkeypatch.delenv("VEIL_UPLOAD_TOKEN", raising=False)
    assert main(["populate", "--server", collector.url, "--installations", "10"]) == 1
    assert "--upload-token" in capsys.readouterr().err


def test_populate_writes_the_candidates_before_it_uploads(collector, tmp_path, capsys) -> None:
    """A --candidates-out that cannot be written fails the run before any report is sent
    (it used to be written after every upload)."""
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    assert main(["populate", "--server", collector.url, "--installations", "50",
                 "--candidates-out", str(blocked / "homepage.txt")]) == 1
    assert str(blocked) in capsys.readouterr().err
    with open_storage(collector.db_path) as storage:
        assert sum(row["reports"] for row in storage.stats()["metrics"]) == 0


def test_populate_says_when_no_collector_answers(offline_url, capsys) -> None:
    assert main(["populate", "--server", offline_url, "--installations", "10"]) == 1
    error = capsys.readouterr().err
    assert f"GET {offline_url}/v1/metrics failed" in error
    assert "is the collector running" in error


@pytest.mark.parametrize("params", [params for params, _, _ in EXAMPLES], ids=IDS)
def test_every_mechanism_has_a_population_its_encoder_takes(params) -> None:
    values, truth = draw_population(params, np.random.default_rng(3), 200)
    again, _ = draw_population(params, np.random.default_rng(3), 200)
    assert len(values) == 200 and values == again and truth
    encoder = make_encoder(Metric("m", params), bytes(32))
    for value in values:
        encoder.encode(value)


def test_a_wide_marginals_metric_draws_without_its_product_domain() -> None:
    # eight variables of sixteen values: 16^8 (4.3e9) cells, beyond any array here, while
    # each installation reports one of the 28 pairs
    domains = tuple(tuple(f"v{i}_{j}" for j in range(16)) for i in range(8))
    params = JointParams(of=tuple(f"v{i}" for i in range(8)), domains=domains, marginals=2)
    values, truth = draw_population(params, np.random.default_rng(3), 300)
    assert len(values) == 300 and truth.endswith("(associated by construction)")
    encoder = make_encoder(Metric("m", params), bytes(32))
    for value in values:
        encoder.encode(value)
