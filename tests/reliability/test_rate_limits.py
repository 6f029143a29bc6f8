"""Upload rate limits: token buckets of reports per source network and per upload token."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import requests

from veil.server.collector.rate_limits import (
    MAX_BUCKETS,
    RateLimiter,
    UploadLimits,
    network_of,
    upload_limits,
)
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_networks_group_addresses_without_keeping_them():
    assert network_of("203.0.113.7") == network_of("203.0.113.250") == "203.0.113.0/24"
    assert network_of("203.0.114.7") != network_of("203.0.113.7")
    assert network_of("2001:db8:1:2::7") == network_of("2001:db8:1:ffff::1") == "2001:db8:1::/48"
    assert network_of("::ffff:203.0.113.9") == "203.0.113.0/24"
    assert network_of(None) == network_of("not an address") == "unknown"


def test_a_bucket_refills_at_its_rate_and_refuses_beyond_its_burst():
    clock = Clock()
    limiter = RateLimiter(rate=100.0, burst=1000.0, clock=clock)
    assert limiter.take("net-a", 1000) is None          # a full burst passes
    wait = limiter.take("net-a", 500)                    # then the bucket is empty
    assert wait == pytest.approx(5.0)                     # 500 reports at 100 a second
    assert limiter.take("net-b", 1000) is None           # other sources are not affected
    clock.now += 4.0
    assert limiter.take("net-a", 500) == pytest.approx(1.0)  # 400 refilled: not yet
    clock.now += 1.0
    assert limiter.take("net-a", 500) is None
    assert limiter.take("net-a", 5000) == pytest.approx(10.0)  # more than a burst: never


def test_buckets_are_bounded_in_number():
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=10.0, clock=clock)
    assert limiter.take("first", 10) is None
    for i in range(MAX_BUCKETS):
        limiter.take(f"source-{i}", 1)
    # the least recently used bucket was forgotten: it starts full again
    assert limiter.take("first", 10) is None


@pytest.mark.parametrize(("rate", "burst"), [(0, 10), (-1, 10), (1, 0.5), (float("inf"), 10)])
def test_limits_must_be_positive_and_finite(rate, burst):
    with pytest.raises(ValueError, match="rate > 0 and burst >= 1"):
        RateLimiter(rate, burst)


REGISTRY = Registry.from_toml("""
[metrics.dark_mode]
kind = "boolean"
min_reports = 1
""")


def batch(n: int) -> dict:
    """``n`` well-formed dark_mode reports (the limits count reports, not their values)."""
    fingerprint = REGISTRY["dark_mode"].params.fingerprint
    return make_batch(os.urandom(16).hex(), [
        make_report(os.urandom(16).hex(), "dark_mode", None, 1, fingerprint) for _ in range(n)])


def post(client, n: int, address: str = "198.51.100.7", token: str | None = None):
    headers = {"X-Forwarded-For": address}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return client.post("/v1/reports", json=batch(n), headers=headers)


def test_a_network_over_its_rate_gets_429_with_retry_after_and_nothing_stored(app_factory):
    client = app_factory(REGISTRY=REGISTRY, READ_TOKENS="read", NETWORK_RATE=10.0,
                         RATE_BURST_SECONDS=1.0, MAX_REPORTS_PER_BATCH=50,
                         PROXY_HOPS=1).test_client()
    assert post(client, 50).status_code == 200            # a burst of one full batch
    refused = post(client, 50, "198.51.100.200")           # the same /24: refused
    assert refused.status_code == 429
    assert refused.json["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 5  # 50 reports at 10 a second
    assert post(client, 50, "203.0.113.1").status_code == 200  # another network
    counts = client.get("/v1/metrics/dark_mode/counts", headers={"Authorization": "Bearer read"})
    assert counts.json["reports"] == 100


def test_each_upload_token_has_its_own_rate_and_daily_cap(app_factory):
    client = app_factory(REGISTRY=REGISTRY, UPLOAD_TOKEN=["team-a", "team-b"], TOKEN_RATE=1000.0,
                         TOKEN_DAILY_CAP=120, MAX_REPORTS_PER_BATCH=50).test_client()
    assert [post(client, 50, token="team-a").status_code for _ in range(2)] == [200, 200]
    capped = post(client, 50, token="team-a")             # 150 > 120 today
    assert capped.status_code == 429 and "cap of 120" in capped.json["error"]["message"]
    assert post(client, 20, token="team-a").status_code == 200   # 120 exactly
    assert post(client, 50, token="team-b").status_code == 200   # the other token is apart
    assert post(client, 50).status_code == 401


def test_rates_are_shared_among_worker_processes_and_the_daily_cap_is_not():
    """veil serve's workers each take their share of a rate; a burst stays a full batch. The
    daily cap is counted by the store, so every worker applies it whole, keyed by a hash of
    the token (tests/reliability/test_token_daily_cap.py tries it over HTTP)."""
    limits = upload_limits({"WORKERS": 4, "MAX_REPORTS_PER_BATCH": 100, "RATE_BURST_SECONDS": 10,
                            "NETWORK_RATE": 200.0, "TOKEN_RATE": 0, "TOKEN_DAILY_CAP": 1000,
                            "UPLOAD_TOKEN": ["team-a"]})
    assert limits.network is not None and limits.network.rate == 50.0
    assert limits.network.burst == 500.0
    assert limits.token is None
    cap = limits.daily_cap(b"team-a")
    assert cap is not None and cap.limit == 1000
    assert cap.key == hashlib.sha256(b"veil upload token daily cap\0team-a").digest()
    assert limits.daily_cap(None) is None and UploadLimits().daily_cap(b"team-a") is None


def test_each_worker_bursts_a_full_batch_and_serve_says_what_that_allows(collector_factory):
    """Each of ``veil serve``'s workers keeps its own bucket, never under one full batch, so
    that any accepted batch can pass: with 2 workers a rate of 10 a second and a 2 s burst
    (20 reports) lets a source send up to 2 batches of 50 at once (as many as the workers
    its connections reach). The log says so, with the settings that would keep the burst;
    more than 2 batches are never accepted at once."""
    collector = collector_factory(registry=REGISTRY, max_reports=50, serve_args=[
        "--workers", "2", "--network-rate", "10", "--burst-seconds", "2"])
    log = (collector.workdir / "serve.log").read_text()
    assert ("--network-rate 10 with --burst-seconds 2 bursts 20 reports, but each of the 2 "
            "workers keeps its own bucket of at least one batch (--max-reports 50): a source "
            "may send 100 reports at once. Lower --max-reports to 10 or raise --burst-seconds "
            "to 10") in log, log
    statuses = [requests.post(collector.url + "/v1/reports", json=batch(50), timeout=30,
                              headers={"Connection": "close"}).status_code for _ in range(8)]
    assert 1 <= statuses.count(200) <= 2 and statuses.count(429) >= 6, statuses


def test_a_burst_that_holds_a_batch_in_every_worker_is_not_warned():
    from veil.server.collector.rate_limits import burst_warnings

    config = {"WORKERS": 2, "MAX_REPORTS_PER_BATCH": 50, "RATE_BURST_SECONDS": 10,
              "NETWORK_RATE": 10.0, "TOKEN_RATE": 9.0}
    warnings = burst_warnings(config)  # 5 x 10 s holds a batch of 50; 4.5 x 10 s does not
    assert len(warnings) == 1 and warnings[0].startswith("--token-rate 9 "), warnings
    # one worker's floor of one batch is the burst any batch size needs: not warned, though
    # 4 x 10 s holds less than a batch (with two workers the same rate is)
    slow = {**config, "TOKEN_RATE": 4.0}
    assert burst_warnings({**slow, "WORKERS": 1}) == []
    assert [w[:14] for w in burst_warnings(slow)] == ["--token-rate 4"]


def upload(collector, n: int, forwarded_for: str) -> int:
    """POST ``n`` dark_mode reports to a real ``veil serve`` with ``X-Forwarded-For`` set;
    the answer's status."""
    response = requests.post(collector.url + "/v1/reports", json=batch(n), timeout=30,
                             headers={"X-Forwarded-For": forwarded_for})
    return response.status_code


def test_behind_a_proxy_each_forwarded_network_has_its_own_bucket(collector_factory):
    """``veil serve --proxy-hops 1``: the proxy's X-Forwarded-For entry names the network."""
    collector = collector_factory(registry=REGISTRY, max_reports=50, serve_args=[
        "--network-rate", "1", "--burst-seconds", "1", "--proxy-hops", "1"])
    assert upload(collector, 50, "198.51.100.7") == 200       # a burst of one full batch
    assert upload(collector, 50, "198.51.100.200") == 429     # the same /24: refused
    # a different forwarded network is a different client, though the proxy is the same peer
    assert [upload(collector, 50, f"203.0.{i}.1") for i in range(113, 118)] == [200] * 5
    # what the client itself put before the proxy's entry is not trusted: the last entry counts
    assert upload(collector, 50, "192.0.2.1, 198.51.100.7") == 429


def test_without_proxy_hops_a_forged_forwarded_for_is_ignored(collector_factory):
    """``veil serve`` without ``--proxy-hops``: the peer's address is the client's."""
    collector = collector_factory(registry=REGISTRY, max_reports=50, serve_args=[
        "--network-rate", "1", "--burst-seconds", "1"])
    assert upload(collector, 50, "198.51.100.7") == 200
    # every request comes from 127.0.0.1, whatever the header claims
    assert [upload(collector, 50, f"203.0.{i}.1") for i in range(113, 118)] == [429] * 5


def test_only_the_trusted_proxies_may_name_the_client(collector_factory):
    """``--trusted-proxy``: a peer outside it (here the test, on 127.0.0.1) is counted under its
    own address, whatever it forwards; the same requests from a trusted peer name networks."""
    untrusted = collector_factory(registry=REGISTRY, max_reports=50, serve_args=[
        "--network-rate", "1", "--burst-seconds", "1", "--proxy-hops", "1",
        "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "fd00::/8"])
    assert upload(untrusted, 50, "198.51.100.7") == 200
    # a direct client forging a new network each time: every request is 127.0.0.1's
    assert [upload(untrusted, 50, f"203.0.{i}.1") for i in range(113, 118)] == [429] * 5
    trusted = collector_factory(registry=REGISTRY, max_reports=50, serve_args=[
        "--network-rate", "1", "--burst-seconds", "1", "--proxy-hops", "1",
        "--trusted-proxy", "127.0.0.1"])
    assert upload(trusted, 50, "198.51.100.7") == 200
    assert [upload(trusted, 50, f"203.0.{i}.1") for i in range(113, 118)] == [200] * 5


@pytest.mark.parametrize("arguments, message", [
    (["--trusted-proxy", "10.0.0.0/8"], "--trusted-proxy names proxies whose forwarded "
                                        "headers --proxy-hops reads; give --proxy-hops N too"),
    (["--proxy-hops", "1", "--trusted-proxy", "proxy.internal"],
     "--trusted-proxy 'proxy.internal' is not an IP address or network"),
])
def test_trusted_proxies_are_checked_before_serving(tmp_path, arguments, message):
    registry = tmp_path / "metrics.toml"
    registry.write_text('[metrics.dark_mode]\nkind = "boolean"\n')
    completed = subprocess.run(
        [sys.executable, "-m", "veil.server.cli", "serve", "--config", str(registry),
         "--db", str(tmp_path / "veil.db"), "--port", "0", *arguments],
        capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 2 and message in completed.stderr, completed.stderr
    assert not (tmp_path / "veil.db").exists()  # refused before anything was opened


@pytest.mark.parametrize("host, trusted, warned", [
    ("0.0.0.0", (), True), ("0.0.0.0", ("10.0.0.0/8",), False), ("127.0.0.1", (), False),
    ("::1", (), False), ("localhost", (), False),
])
def test_serving_other_machines_with_proxy_hops_and_no_trusted_proxy_is_warned(
        caplog, host, trusted, warned):
    from veil.server.collector.cli import _log_summary
    from veil.server.collector.config import DEFAULTS

    config = {**DEFAULTS, "REGISTRY": "metrics.toml", "HOST": host, "PROXY_HOPS": 1,
              "TRUSTED_PROXIES": trusted}
    with caplog.at_level("WARNING", logger="veil.server.collector.cli"):
        _log_summary(config, 1, "veil.db", f"http://{host}:8080")
    assert ("name the proxies with --trusted-proxy" in caplog.text) == warned
