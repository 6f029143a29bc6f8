"""FLH and HCMS string metrics through a real ``veil serve`` over HTTP with a real SQLite file.

An outsider's view: SDK encoders (one installation each, seeded secrets) upload through
``POST /v1/reports``; the collector's counts document decodes to the population; payloads
and cohorts the mechanisms cannot produce are refused, each with an error naming its field,
while the valid reports beside them are stored. ``oracle = "auto"`` is served as the oracle it
chose, and ``veil metrics`` states the choice.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import requests

from veil.client.encoders import make_encoder
from veil.server.analysis.decoders import decode_counts
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report

REGISTRY_TOML = """version = 1

[metrics.page_flh]
kind = "string"
oracle = "flh"
epsilon = 3.0
report_epsilon = 2.0
functions = 64
min_reports = 1

[metrics.page_hcms]
kind = "string"
oracle = "hcms"
epsilon = 3.0
report_epsilon = 2.0
rows = 64
columns = 16
min_reports = 1

[metrics.page_auto]
kind = "string"
oracle = "auto"
epsilon = 4.0
min_reports = 1
"""
SHARES = {"a.example": 0.6, "b.example": 0.3, "c.example": 0.1}
REPORTS = 4000
BATCH = 500


def population(seed: int) -> list[str]:
    values = [v for v, share in SHARES.items() for _ in range(round(share * REPORTS))]
    random.Random(seed).shuffle(values)
    return values


def upload(url: str, registry: Registry, metric: str, values: list[str], seed: int) -> None:
    rnd = random.Random(seed)
    entry = registry[metric]
    reports = []
    for value in values:
        encoder = make_encoder(entry, rnd.randbytes(32), rnd.getrandbits(32),
                               random_bytes=rnd.randbytes)
        reports.append(make_report(f"{rnd.getrandbits(128):032x}", metric, encoder.cohort,
                                   encoder.encode(value), entry.params.fingerprint))
    for start in range(0, len(reports), BATCH):
        body = make_batch(f"{rnd.getrandbits(128):032x}", reports[start:start + BATCH])
        answer = requests.post(url + "/v1/reports", json=body, timeout=30)
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("metric", ["page_flh", "page_hcms", "page_auto"])
def test_sdk_reports_through_a_real_collector_decode_to_the_population(
        collector_factory, metric: str) -> None:
    registry = Registry.from_toml(REGISTRY_TOML)
    collector = collector_factory(registry=registry)
    upload(collector.url, registry, metric, population(1), 2)
    document = collector.counts(metric)
    assert document["reports"] == REPORTS
    result = decode_counts(document, [*SHARES, "never.example", "nor.example"])
    rows = {row["value"]: row for row in result.rows}
    for value, share in SHARES.items():
        # unbiased, with the stated standard error (population shares): within 4 of them
        assert abs(rows[value]["proportion"] - share) <= 4 * rows[value]["prop_std_error"]
    assert "never.example" not in rows and "nor.example" not in rows
    assert result.summary["oracle"] == registry[metric].params.oracle


@pytest.mark.parametrize(("metric", "cohort", "payload", "field"), [
    ("page_flh", 0, 8, "payload"),         # g = 8 buckets (chosen for report_epsilon 2): 0..7
    ("page_flh", 0, -1, "payload"),
    ("page_flh", 0, True, "payload"),
    ("page_flh", 0, 1.0, "payload"),
    ("page_flh", 0, "3", "payload"),
    ("page_flh", 64, 0, "cohort"),         # 64 hash functions: cohorts 0..63
    ("page_hcms", 0, 32, "payload"),       # 16 columns: 2 l + bit in 0..31
    ("page_hcms", -1, 0, "cohort"),
    ("page_hcms", 64, 0, "cohort"),
])
def test_payloads_the_mechanism_cannot_produce_are_refused_by_field(
        collector_factory, metric: str, cohort: int, payload: object, field: str) -> None:
    registry = Registry.from_toml(REGISTRY_TOML)
    assert registry["page_flh"].params.buckets == 8
    collector = collector_factory(registry=registry)
    params = registry[metric].params
    good = make_report("1" * 32, metric, 0, 0, params.fingerprint)
    bad = make_report("2" * 32, metric, cohort, payload, params.fingerprint)
    answer = requests.post(collector.url + "/v1/reports",
                           json=make_batch("3" * 32, [good, bad]), timeout=30)
    # per-report outcomes: the valid report is stored, the other refused by field
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["accepted"] == 1 and body["rejected"] == 1, body
    assert [error["field"] for error in body["errors"]] == [f"reports[1].{field}"], body
    assert collector.counts(metric)["reports"] == 1


def test_veil_metrics_states_what_auto_chose(tmp_path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text(REGISTRY_TOML, encoding="utf-8")
    shown = subprocess.run([sys.executable, "-m", "veil.server.cli", "metrics", "--config",
                            str(path)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "auto chose flh" in shown.stdout
    assert "rappor's 128-bit reports exceed the 32-bit cap" in shown.stdout


@pytest.mark.parametrize("metric", ["page_flh", "page_hcms"])
def test_veil_decode_with_ibu_reads_the_collectors_file(collector_factory, tmp_path,
                                                        metric: str) -> None:
    import csv
    import json

    from veil.server.cli import main

    registry = Registry.from_toml(REGISTRY_TOML)
    collector = collector_factory(registry=registry)
    upload(collector.url, registry, metric, population(3), 4)
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join([*SHARES, "never.example", "nor.example"]) + "\n")
    out = tmp_path / "out"
    assert main(["decode", "--db", str(collector.db_path), "--metric", metric, "--estimator",
                 "ibu", "--candidates", str(candidates), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "results.csv", newline="", encoding="utf-8") as handle:
        rows = {row["string"]: row for row in csv.DictReader(handle)}
    assert summary["estimator"] == "ibu" and summary["ibu_converged"]
    assert summary["interval"].startswith("observed information")
    assert set(SHARES) <= set(rows)  # IBU shows the strings the decoder detected
    shares = [float(row["proportion"]) for row in rows.values()]
    # the detected strings and the background are one distribution over the reports
    assert min(shares) >= 0
    assert sum(shares) + summary["ibu_background_share"] == pytest.approx(1.0, abs=1e-9)
    for value, share in SHARES.items():
        row = rows[value]
        # within 4 stated standard errors of the population's share
        assert abs(float(row["proportion"]) - share) <= 4 * float(row["prop_std_error"])
