"""Reports encoded by the real encoders, uploaded over HTTP to ``veil serve``, read back exactly."""

from __future__ import annotations

import json

import pytest
import requests

KINDS_AND_VALUES = {
    "homepage": ["example.com", "veil.dev", "example.com", "news.example"] * 10,
    "browser": ["firefox", "chrome", "safari", "other", "chrome"] * 6,
    "dark_mode": [True, False, True] * 7,
    "load_time": [0.5, 3.25, 9.9, 7.0] * 5,
    "battery": [10.0, 55.5, 99.0] * 6,
    "latency": [0.1, 0.9, 0.5] * 5,
}


def test_counts_equal_uploaded_payloads_for_every_kind(collector, wire):
    sent = []
    for metric, values in KINDS_AND_VALUES.items():
        sent += wire.reports(metric, values)
    response = requests.post(collector.url + "/v1/reports", json=wire.batch(sent), timeout=30)
    assert response.status_code == 200, response.text
    receipt = response.json()
    assert (receipt["accepted"], receipt["duplicates"], receipt["rejected"]) == (len(sent), 0, 0)
    for metric in KINDS_AND_VALUES:
        document = collector.counts(metric)
        expected = wire.expected(metric, sent)
        assert document["metric"] == metric
        assert document["kind"] == collector.registry[metric].kind
        assert document["params"] == collector.registry[metric].to_dict()
        assert document["reports"] == expected["reports"]
        if "sum" in expected["cohorts"][0]:
            # sums of at most 40 floats: only the order of additions differs
            got, want = document["cohorts"][0], expected["cohorts"][0]
            assert got["reports"] == want["reports"]
            assert abs(got["sum"] - want["sum"]) <= 1e-9 * max(1.0, abs(want["sum"]))
            assert abs(got["sum_squares"] - want["sum_squares"]) <= 1e-9 * max(
                1.0, want["sum_squares"])
        else:
            assert document["cohorts"] == expected["cohorts"]


def test_counts_survive_a_clean_restart(collector, wire):
    sent = wire.reports("homepage", ["a.example", "b.example"] * 20)
    assert requests.post(collector.url + "/v1/reports", json=wire.batch(sent),
                         timeout=30).json()["accepted"] == 40
    assert collector.stop() == 0
    collector.start()
    assert collector.counts("homepage")["cohorts"] == wire.expected("homepage", sent)["cohorts"]


def test_real_clients_upload_to_veil_serve_and_counts_match_bit_for_bit(collector, wire, tmp_path):
    """Several installations (distinct secrets and cohorts) flush through the SDK."""
    from veil.client import Client

    sent: list[dict] = []

    def keep_body(response: requests.Response, *args: object, **kwargs: object) -> None:
        if response.request.method == "POST" and response.status_code == 200:
            sent.extend(json.loads(response.request.body)["reports"])

    values = {"homepage": ["example.com", "veil.dev", "news.example"],
              "browser": ["chrome", "safari"], "dark_mode": [True, False],
              "battery": [12.5, 80.0], "load_time": [1.5]}
    for installation in range(6):
        with Client(collector.url, tmp_path / f"state{installation}") as client:
            client.session.hooks["response"].append(keep_body)
            for metric, options in values.items():
                for value in options:
                    client.report(metric, value)
            result = client.flush()
            assert result.ok and result.rejected == 0, result
    assert len({report["id"] for report in sent}) == len(sent) == 6 * 10
    cohorts_used = {r["cohort"] for r in sent if r["metric"] == "homepage"}
    assert len(cohorts_used) > 1, "installations should spread over cohorts"
    for metric in values:
        document = collector.counts(metric)
        expected = wire.expected(metric, sent)
        assert document["reports"] == expected["reports"]
        if metric == "load_time":
            assert document["cohorts"][0]["sum"] == pytest.approx(expected["cohorts"][0]["sum"])
        else:
            assert document["cohorts"] == expected["cohorts"]
