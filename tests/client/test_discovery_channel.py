"""The discovery channel of a string metric on the client.

* **Assignment.** Each installation reports a string metric through one channel, chosen
  from its secret (:func:`veil.client.recorder.reporting_channel`): deterministic per secret,
  and over many secrets the discovery channel's frequency is ``share`` (its realized
  ``N / 2**32``). Among the installations on the channel, levels (``cohort_seed % levels``)
  are uniform.
* **Law.** Over many installations reporting one value, a report supports the value's
  vector (``bucket == A x``) with probability ``support_probs[0]`` and otherwise names each
  of the ``g - 1`` other buckets alike; the rows of ``A`` are uniform bits; the permanent
  response keeps ``A x`` with probability ``N_prr / 2**32``; reports of one installation
  keep its permanent bucket with probability ``lambda + (1 - lambda) / g``. Checked at a
  moderate epsilon and at boundary-ish ones (0.02 with one bucket bit, 20 where the
  probabilities saturate), with seeded secrets and a seeded stand-in for the CSPRNG.
* **Stream layout.** The permanent response is re-derived from raw HMAC blocks as the
  encoder's docstring lays it out.
* **The real Client**: reports go out under the channel's name, cohort and fingerprint,
  share ``A`` when they share a value, pass the collector's validation and are charged to
  the channel in the privacy ledger; a report to the channel's own name is refused; a
  pinned string metric's unpinned channel is refused.

Tolerances: a count of ``n`` independent events of probability ``p`` is within 4 binomial
standard errors, ``|count - n p| <= 4 sqrt(n p (1 - p))``.
"""

from __future__ import annotations

import json
import math
import random
import secrets as secrets_module
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import veil.client.state_dir as state_module
from tests.client.test_oracle_encoders import RawStream as OracleRawStream
from veil.client import Client, UnknownMetricError
from veil.client.encoders import ENCODERS, DiscoveryEncoder, make_encoder
from veil.client.recorder import reporting_channel
from veil.client.state_dir import DATABASE_FILE, SECRET_FILE, derived_cohort_seed
from veil.shared.bits import realize
from veil.shared.errors import ParameterError
from veil.shared.kinds import DiscoveryParams
from veil.shared.registry import Metric, Registry
from veil.shared.wire import validate_report

ONE = 1 << 32
SIGMAS = 4.0
VALUE = "example.com/news"


def registry_with(share: float = 0.9, **discovery: Any) -> Registry:
    return Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": 32, "h": 2, "m": 4,
                     "discovery": {"share": share, "segment": 1, "max_length": 16,
                                   "epsilon": 4.0, **discovery}},
        "search": {"kind": "string", "k": 32, "h": 2, "m": 4, "discovery": {"share": share}},
        "dark_mode": {"kind": "boolean"},
    }})


REGISTRY = registry_with()
CHANNEL = REGISTRY["homepage.discovery"]
PARAMS: DiscoveryParams = CHANNEL.params  # type: ignore[assignment]


def secrets(seed: int, count: int) -> list[bytes]:
    """``count`` installation secrets from a seeded generator."""
    generator = random.Random(seed)
    return [generator.randbytes(32) for _ in range(count)]


def fresh(seed: int) -> Callable[[int], bytes]:
    """A seeded stand-in for os.urandom (tests only)."""
    return random.Random(seed).randbytes


def within(count: int, n: int, p: float, what: str) -> None:
    expected = n * p
    tolerance = SIGMAS * math.sqrt(n * p * (1 - p))
    assert abs(count - expected) <= tolerance, (
        f"{what}: {count} of {n}, expected {expected:.1f} ± {tolerance:.1f}")


def split(params: DiscoveryParams, data: bytes) -> tuple[list[int], int]:
    """The rows of ``A`` and the bucket of a parsed payload."""
    width = params.row_bytes
    rows = [int.from_bytes(data[i * width:(i + 1) * width], "big")
            for i in range(len(data) // width)]
    return rows, data[-1]


def hash_of(rows: list[int], x: int) -> int:
    """``A x`` over GF(2): bit ``i`` is the parity of ``row_i & x``."""
    return sum((bin(row & x).count("1") % 2) << i for i, row in enumerate(rows))


def vector(params: DiscoveryParams, value: str, level: int) -> int:
    return params.vector(params.padded(value.encode()), level)


# --- assignment -------------------------------------------------------------------------


@pytest.mark.parametrize("share", [0.9, 0.3])
def test_assignment_is_per_secret_and_has_the_declared_share(share: float) -> None:
    registry = registry_with(share)
    channel = registry["homepage.discovery"]
    n = 20000
    chosen = [reporting_channel(registry, "homepage", secret) for secret in secrets(1, n)]
    assert {metric.name for metric in chosen} == {"homepage", "homepage.discovery"}
    again = [reporting_channel(registry, "homepage", secret) for secret in secrets(1, 200)]
    assert again == chosen[:200]
    on_channel = sum(metric is channel for metric in chosen)
    within(on_channel, n, realize(share) / ONE, "installations on the discovery channel")
    # each string metric draws its own assignment: agreement s^2 + (1 - s)^2 (independent)
    other = [reporting_channel(registry, "search", secret).of == "search"
             for secret in secrets(1, n)]
    s = realize(share) / ONE
    agree = sum((metric is channel) == on for metric, on in zip(chosen, other, strict=True))
    within(agree, n, s * s + (1 - s) * (1 - s), "metrics assigned alike")


def test_a_metric_without_a_channel_is_its_own() -> None:
    for secret in secrets(2, 50):
        assert reporting_channel(REGISTRY, "dark_mode", secret) is REGISTRY["dark_mode"]


def test_levels_are_uniform_on_the_channel() -> None:
    levels = PARAMS.levels
    assert levels == 16
    counts: Counter[int] = Counter()
    for secret in secrets(3, 40000):
        if reporting_channel(REGISTRY, "homepage", secret) is CHANNEL:
            encoder = make_encoder(CHANNEL, secret, derived_cohort_seed(secret))
            assert isinstance(encoder, DiscoveryEncoder) and encoder.level == encoder.cohort
            counts[encoder.cohort] += 1
    n = sum(counts.values())
    assert set(counts) == set(range(levels))
    for level in range(levels):
        within(counts[level], n, 1 / levels, f"level {level}")


# --- the encoder's law ------------------------------------------------------------------

LAW_CASES = [
    DiscoveryParams(segment=1, max_length=16, epsilon=4.0),  # t = 6, no instantaneous noise
    DiscoveryParams(segment=2, max_length=16, epsilon=4.0, report_epsilon=1.5),
    DiscoveryParams(segment=2, max_length=16, epsilon=0.02),  # t = 1: p barely above 1/2
    DiscoveryParams(segment=1, max_length=8, epsilon=20.0, report_epsilon=19.0),  # saturated
    DiscoveryParams(segment=1, max_length=8, fingerprint_bits=16, epsilon=8.0, bucket_bits=8),
]
LAW_IDS = [f"seg{p.segment}-eps{p.epsilon:g}-r{p.report_epsilon:g}-t{p.bucket_bits}"
           for p in LAW_CASES]


@pytest.mark.parametrize("params", LAW_CASES, ids=LAW_IDS)
def test_reports_over_installations_support_the_value_with_p(params: DiscoveryParams) -> None:
    metric = Metric("homepage.discovery", params)
    n = 12000
    g, t, bits = params.buckets, params.bucket_bits, params.domain_bits
    assert t is not None
    random_bytes = fresh(4)
    report_hits = permanent_hits = 0
    offsets: Counter[int] = Counter()
    row_bits = [0] * (t * bits)
    for secret in secrets(5, n):
        encoder = make_encoder(metric, secret, derived_cohort_seed(secret), random_bytes)
        x = vector(params, VALUE, encoder.cohort or 0)
        rows, bucket = split(params, params.parse_payload(encoder.encode(VALUE)))
        assert len(rows) == t
        own = hash_of(rows, x)
        report_hits += bucket == own
        if bucket != own:
            offsets[bucket ^ own] += 1
        permanent_rows, permanent = encoder.memoized(encoder.memo_key(VALUE))
        assert permanent_rows == b"".join(r.to_bytes(params.row_bytes, "big") for r in rows)
        permanent_hits += permanent == own
        for i, row in enumerate(rows):
            for j in range(bits):
                row_bits[i * bits + j] += (row >> j) & 1
    p = params.support_probs[0]
    within(report_hits, n, p, "reports supporting the value")
    within(permanent_hits, n, params.numerators[0] / ONE, "permanent responses of the value")
    misses = n - report_hits
    assert set(offsets) <= set(range(1, g))
    if misses:  # among the other g - 1 buckets, uniformly
        for offset in range(1, g):
            within(offsets[offset], misses, 1 / (g - 1), f"other bucket at offset {offset}")
    for index, ones in enumerate(row_bits):
        within(ones, n, 0.5, f"bit {index % bits} of row {index // bits}")


def test_reports_of_one_installation_keep_its_permanent_bucket() -> None:
    params = LAW_CASES[1]
    metric = Metric("homepage.discovery", params)
    n = 12000
    g = params.buckets
    keep = params.numerators[1] / ONE
    assert keep < 1
    for seed, secret in enumerate(secrets(6, 3)):
        encoder = make_encoder(metric, secret, derived_cohort_seed(secret), fresh(7 + seed))
        value = f"site{seed}.example"
        rows, permanent = encoder.memoized(encoder.memo_key(value))
        buckets: Counter[int] = Counter()
        for _ in range(n):
            data = params.parse_payload(encoder.encode(value))
            assert data[:-1] == rows  # A is memoized: every report of the value carries it
            buckets[data[-1]] += 1
        for bucket in range(g):
            p = keep + (1 - keep) / g if bucket == permanent else (1 - keep) / g
            within(buckets[bucket], n, p, f"bucket {bucket} (permanent {permanent})")


# --- the stream layout ------------------------------------------------------------------


class RawStream(OracleRawStream):
    """The permanent stream of the oracle tests, plus the rows' sampler."""

    def top_bits(self, bits: int) -> int:
        """The top ``bits`` bits of ``ceil(bits / 8)`` big-endian bytes."""
        size = (bits + 7) // 8
        return int.from_bytes(self.read(size), "big") >> (8 * size - bits)


def layout_permanent(params: DiscoveryParams, secret: bytes, metric: str, value: str,
                     level: int) -> tuple[bytes, int]:
    key = params.padded(value.encode())[: (level + 1) * params.segment]  # the memo key
    stream = RawStream(secret, metric, params.fingerprint.encode() + b"\0" + key)
    assert params.bucket_bits is not None
    rows = [stream.top_bits(params.domain_bits) for _ in range(params.bucket_bits)]
    bucket = hash_of(rows, vector(params, value, level))
    if int.from_bytes(stream.read(4), "big") >= params.numerators[0]:
        g = params.buckets
        while True:  # randbelow(g - 1): g - 1 is not a power of two (but for g = 2)
            other = stream.top_bits((g - 2).bit_length()) if g > 2 else 0
            if other < g - 1:
                break
        bucket = other + (other >= bucket)
    return b"".join(row.to_bytes(params.row_bytes, "big") for row in rows), bucket


@pytest.mark.parametrize("params", LAW_CASES, ids=LAW_IDS)
def test_permanent_response_is_the_documented_stream_layout(params: DiscoveryParams) -> None:
    metric = Metric("homepage.discovery", params)
    for secret in secrets(8, 40):
        encoder = make_encoder(metric, secret, derived_cohort_seed(secret))
        for value in ("", "a", VALUE, "ünïcode/" * 5):
            expected = layout_permanent(params, secret, metric.name, value, encoder.cohort or 0)
            assert encoder.memoized(encoder.memo_key(value)) == expected


def test_the_encoder_is_registered_and_refuses_values_that_are_not_strings() -> None:
    assert ENCODERS["discovery"] is DiscoveryEncoder
    encoder = make_encoder(CHANNEL, b"s" * 32, 5)
    assert encoder.cohort == 5 % PARAMS.levels
    for bad in (3, None, b"bytes", "\ud800"):
        with pytest.raises(ParameterError) as info:
            encoder.memo_key(bad)
        assert info.value.field == "value"


# --- the real Client --------------------------------------------------------------------


def first_secret(channel: str) -> bytes:
    """The first of a seeded list of secrets that reports ``homepage`` through ``channel``."""
    return next(secret for secret in secrets(9, 1000)
                if reporting_channel(REGISTRY, "homepage", secret).name == channel)


ON_CHANNEL = first_secret("homepage.discovery")
ON_STRING = first_secret("homepage")


@pytest.fixture
def seeded_client(tmp_path: Path, offline_url: str, monkeypatch: pytest.MonkeyPatch,
                  ) -> Iterator[Callable[..., Client]]:
    """``seeded_client(secret, name, **options)``: a Client on a new state directory whose
    installation secret is ``secret`` (created by the client as usual, so its ledger is whole)."""
    clients: list[Client] = []

    def make(secret: bytes, name: str = "state", **options: Any) -> Client:
        fake = SimpleNamespace(token_bytes=lambda n: secret[:n],
                               token_hex=secrets_module.token_hex)
        with monkeypatch.context() as patch:
            patch.setattr(state_module, "secrets", fake)
            client = Client(offline_url, tmp_path / name, registry=options.pop("registry",
                                                                              REGISTRY),
                            strict=options.pop("strict", True), **options)
        assert (tmp_path / name / SECRET_FILE).read_bytes() == secret
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close(timeout=0.5)


def queued(client: Client) -> list[dict[str, Any]]:
    assert client.state_dir is not None
    database = sqlite3.connect(client.state_dir / DATABASE_FILE)
    try:
        return [json.loads(body) for (body,) in
                database.execute("SELECT body FROM outbox ORDER BY seq")]
    finally:
        database.close()


def test_a_client_on_the_channel_reports_through_it_and_is_charged_there(
        seeded_client: Callable[..., Client], tmp_path: Path, offline_url: str) -> None:
    # report_epsilon below epsilon: one report (epsilon_1) costs less than a repeated value
    # (epsilon_inf), so the ledger's total tells which one each value was charged
    registry = registry_with(report_epsilon=2.0)
    channel = registry["homepage.discovery"]
    params: DiscoveryParams = channel.params  # type: ignore[assignment]
    assert params.epsilon_1 < params.epsilon_inf - 1.0
    assert reporting_channel(registry, "homepage", ON_CHANNEL) == channel
    client = seeded_client(ON_CHANNEL, registry=registry)
    for value in (VALUE, VALUE, VALUE, "other.org"):
        client.report("homepage", value)
    reports = queued(client)
    level = derived_cohort_seed(ON_CHANNEL) % params.levels
    assert [r["metric"] for r in reports] == ["homepage.discovery"] * 4
    assert {r["params"] for r in reports} == {params.fingerprint}
    assert {r["cohort"] for r in reports} == {level}
    for report in reports:
        validate_report(report, registry)
    rows = {report["payload"][:-2] for report in reports[:3]}
    assert len(rows) == 1  # one value, one memoized A
    encoder = make_encoder(channel, ON_CHANNEL, level)
    expected = encoder.memoized(encoder.memo_key(VALUE))[0]
    assert rows == {expected.hex()}
    # the memo key is the value's first level + 1 bytes: the two values differ in the first
    assert encoder.memo_key("other.org") != encoder.memo_key(VALUE)
    assert reports[3]["payload"][:-2] != expected.hex()  # one response per reported prefix
    spent = client.privacy_spent()
    assert set(spent.per_metric) == {"homepage.discovery"}
    want = params.epsilon_inf + params.epsilon_1  # VALUE repeated, other.org once
    assert spent.per_metric["homepage.discovery"] == pytest.approx(want, rel=1e-10)
    assert spent.per_metric["homepage.discovery"] >= want * (1 - 1e-15)
    client.close(timeout=0.5)
    with Client(offline_url, tmp_path / "state", registry=registry, strict=True) as again:
        again.report("homepage", VALUE)  # after a restart: the same channel and A
        last = queued(again)[-1]
        assert last["metric"] == "homepage.discovery" and last["payload"][:-2] == expected.hex()


def test_a_client_on_the_string_channel_reports_the_string_metric(
        seeded_client: Callable[..., Client]) -> None:
    client = seeded_client(ON_STRING)
    client.report("homepage", VALUE)
    (report,) = queued(client)
    assert report["metric"] == "homepage"
    assert report["params"] == REGISTRY["homepage"].params.fingerprint
    assert set(client.privacy_spent().per_metric) == {"homepage"}


def test_reporting_to_the_channel_itself_is_refused(
        seeded_client: Callable[..., Client]) -> None:
    strict = seeded_client(ON_CHANNEL)
    with pytest.raises(UnknownMetricError, match="report to 'homepage'"):
        strict.report("homepage.discovery", VALUE)
    with pytest.raises(UnknownMetricError) as info:
        strict.report("nope", VALUE)
    assert "dark_mode, homepage, search." in str(info.value)  # channels are not offered
    lenient = seeded_client(ON_CHANNEL, "lenient", strict=False)
    lenient.report("homepage.discovery", VALUE)
    assert lenient.drops["unknown_metric"] == 1
    assert lenient.pending == 0 and lenient.privacy_spent().per_metric == {}


def test_pinning_a_string_metric_refuses_its_unpinned_channel(
        seeded_client: Callable[..., Client]) -> None:
    pinned = {"homepage": REGISTRY["homepage"].params.fingerprint}
    on_channel = seeded_client(ON_CHANNEL, "a", pinned=pinned)
    assert "homepage.discovery" in on_channel.refused_metrics
    assert "pin 'homepage.discovery' too" in on_channel.refused_metrics["homepage.discovery"]
    on_channel.report("homepage", VALUE)
    assert on_channel.pending == 0 and on_channel.drops["privacy_limit"] == 1
    on_string = seeded_client(ON_STRING, "b", pinned=pinned)
    on_string.report("homepage", VALUE)
    assert on_string.pending == 1
    both = seeded_client(ON_CHANNEL, "c",
                         pinned={**pinned, "homepage.discovery": PARAMS.fingerprint})
    assert both.refused_metrics == {}
    both.report("homepage", VALUE)
    assert [r["metric"] for r in queued(both)] == ["homepage.discovery"]
