"""``veil populate`` against a real ``veil serve``, then ``veil decode --server`` on every metric."""

from __future__ import annotations

import json

import pytest

from veil.server.cli import main
from veil.shared.registry import Registry
from veil.simulations.demo import DECOYS, SITES
from veil.simulations.populate import YES_SHARE

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

    summary = json.loads((tmp_path / "dark_mode" / "summary.json").read_text())
    rows = (tmp_path / "dark_mode" / "results.csv").read_text().splitlines()
    assert summary["reports"] == INSTALLATIONS and len(rows) >= 2
    # randomized response with alpha = 0.5 (p* = 0.25, q* = 0.75): the yes-share's standard
    # error is at most sqrt(0.25) / (q* - p*) / sqrt(N) = 1 / sqrt(4000) = 0.016, plus the
    # population's own sd of about 0.0075; 5 of those (0.09) bounds the error of the estimate
    header = rows[0].split(",")
    for line in rows[1:]:
        row = dict(zip(header, line.split(","), strict=True))
        if row.get("value", row.get("string")) in ("true", "yes", "True"):
            assert float(row["proportion"]) == pytest.approx(YES_SHARE, abs=0.09)


def test_populate_names_an_unknown_metric(collector, capsys) -> None:
    assert main(["populate", "--server", collector.url, "--installations", "10",
                 "--metric", "no_such_metric"]) == 2
    assert "no_such_metric" in capsys.readouterr().err


def test_populate_without_the_upload_token_says_how_to_give_it(collector_factory, capsys,
                                                             monkeypatch) -> None:
    collector = collector_factory(REGISTRY, upload_token="required-token")
    monkeypatch.delenv("VEIL_UPLOAD_TOKEN", raising=False)
    assert main(["populate", "--server", collector.url, "--installations", "10"]) == 2
    assert "--upload-token" in capsys.readouterr().err
