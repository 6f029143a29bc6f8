"""Issue 16, D8: the collector serves the privacy parameters, the application sets the limits.

Veil protects people against the collector, so a collector that serves
``epsilon = 50``, ``alpha = 0.9999999`` or ``f = 0`` (``epsilon_inf = inf``) must
not be obeyed: by default a metric whose ``epsilon_inf`` is above 10 is refused
before any report is encoded, loudly (an error naming the metric, its epsilon
and the limit, logged), and its reports are dropped and counted, never raised
into the application. ``max_epsilon_per_report``, ``max_epsilon_per_value`` and
``pinned`` parameter fingerprints let the application set its own limits.
"""

from __future__ import annotations

import logging
import math

import requests

from veil.client import Client
from veil.client.privacy_limits import DEFAULT_MAX_EPSILON_PER_VALUE
from veil.shared.registry import Registry

HOSTILE = Registry.from_dict({"metrics": {
    "homepage": {"kind": "string", "min_reports": 1, "k": 32, "h": 2, "m": 4, "f": 0.0},
    "dark_mode": {"kind": "boolean", "min_reports": 1, "alpha": 0.9999999},
    "load_time": {"kind": "number", "min_reports": 1, "low": 0.0, "high": 10.0,
                  "mechanism": "laplace", "epsilon": 50.0},
    "browser": {"kind": "category", "min_reports": 1, "categories": ["firefox", "chrome"]},
}})
REFUSED = {"homepage": "inf", "dark_mode": "16.8", "load_time": "50"}
VALUES = {"homepage": "example.com", "dark_mode": True, "load_time": 3.0, "browser": "firefox"}


def test_a_hostile_collectors_metrics_are_refused_by_default(collector_factory, tmp_path, caplog):
    collector = collector_factory(registry=HOSTILE)
    with caplog.at_level(logging.ERROR, logger="veil.client"):
        client = Client(collector.url, tmp_path / "state")  # the registry comes over HTTP
        assert client.flush(timeout=10).ok  # waits for the registry
    assert set(client.refused_metrics) == set(REFUSED)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for name, epsilon in REFUSED.items():
        [message] = [m for m in errors if f"metric {name!r}" in m]
        assert f"epsilon_inf is {epsilon}" in message
        assert f"max_epsilon_per_value = {DEFAULT_MAX_EPSILON_PER_VALUE:g}" in message
        assert client.refused_metrics[name] == message
    for metric, value in VALUES.items():
        client.report(metric, value)  # never raises into the application
    assert client.pending == 1 and client.drops["privacy_limit"] == len(REFUSED)
    assert set(client.privacy_spent().per_metric) == {"browser"}
    assert client.flush().accepted == 1
    client.close()
    assert collector.counts("browser")["reports"] == 1
    for name in REFUSED:  # with min_reports = 1, no report at all is a 409
        answer = requests.get(f"{collector.url}/v1/metrics/{name}/counts",
                              headers=collector.headers(), timeout=10)
        assert (answer.status_code, answer.json()["error"]["code"]) == (409, "too_few_reports")


def test_the_per_value_limit_holds_from_both_sides(tmp_path, offline_url):
    """A metric exactly at the limit is accepted; the next float below refuses it."""
    registry = Registry.from_dict({"metrics": {"homepage": {"kind": "string", "k": 32}}})
    epsilon_inf = registry["homepage"].params.epsilon_inf
    at = Client(offline_url, tmp_path / "at", registry=registry, max_epsilon_per_value=epsilon_inf)
    below = Client(offline_url, tmp_path / "below", registry=registry,
                   max_epsilon_per_value=math.nextafter(epsilon_inf, 0.0))
    assert at.refused_metrics == {} and set(below.refused_metrics) == {"homepage"}
    at.report("homepage", "example.com")
    below.report("homepage", "example.com")
    assert (at.pending, below.pending) == (1, 0)
    at.close(timeout=1)
    below.close(timeout=1)


def test_the_per_report_limit_refuses_metrics_whose_epsilon_1_is_above_it(tmp_path, offline_url):
    limit = 1.05  # string default epsilon_1 = 1.0743, boolean ln 3 = 1.0986, laplace 1.0
    client = Client(offline_url, tmp_path / "state", registry=Registry.from_dict(
        {"metrics": {"homepage": {"kind": "string"}, "dark_mode": {"kind": "boolean"},
                     "load_time": {"kind": "number", "epsilon": 1.0}}}),
        max_epsilon_per_report=limit)
    assert set(client.refused_metrics) == {"homepage", "dark_mode"}
    assert "epsilon_1 is 1.07429" in client.refused_metrics["homepage"]
    assert "max_epsilon_per_report = 1.05" in client.refused_metrics["homepage"]
    client.close(timeout=1)


def test_pinned_fingerprints_refuse_any_other_parameters(tmp_path, offline_url, caplog,
                                                         recording_transport):
    transport = recording_transport
    reviewed = Registry.from_dict({"metrics": {"homepage": {"kind": "string", "k": 32}}})
    served = Registry.from_dict({"metrics": {"homepage": {"kind": "string", "k": 32, "f": 0.25},
                                             "dark_mode": {"kind": "boolean"}}})
    pin = reviewed["homepage"].params.fingerprint
    with Client(offline_url, tmp_path / "ok", registry=reviewed, transport=transport,
                pinned={"homepage": pin}) as client:
        client.report("homepage", "example.com")
        assert client.refused_metrics == {}
    assert [r["params"] for r in transport.reports] == [pin]
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        client = Client(offline_url, tmp_path / "changed", registry=served, transport=transport,
                        pinned={"homepage": pin, "gone": "0123456789abcdef"})
    message = client.refused_metrics["homepage"]
    assert pin in message and served["homepage"].params.fingerprint in message
    assert set(client.refused_metrics) == {"homepage"}  # unpinned metrics within the limits stay
    assert "pinned metric 'gone' is not in the registry" in caplog.text
    client.report("homepage", "example.com")
    client.report("dark_mode", True)
    assert client.pending == 1 and client.dropped == client.drops["privacy_limit"] == 1
    client.close(timeout=1)


def test_the_application_can_lift_the_default_limit(tmp_path, offline_url):
    with Client(offline_url, tmp_path / "state", registry=HOSTILE,
                max_epsilon_per_value=None) as client:
        assert client.refused_metrics == {}
        client.report("homepage", "example.com")  # one report: epsilon_1 (finite)
        assert client.privacy_spent().total == HOSTILE["homepage"].params.epsilon_1
        client.report("homepage", "example.com")  # f = 0: repeating it reveals the value
        assert client.privacy_spent().total == math.inf
