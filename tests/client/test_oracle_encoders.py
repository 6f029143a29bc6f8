"""The SDK encoders of the category oracles (GRR, OUE, OLH, Hadamard response).

* **Privacy, exactly.** From the realized numerators alone, the exact law of the
  permanent response and of one report is built with :class:`fractions.Fraction`
  for each input, following each mechanism's definition (the permanent response,
  then the instantaneous one composed with it); the largest log-ratio over pairs of
  inputs and outputs must equal the stated ``epsilon_inf`` and ``epsilon_1``: never
  below them, and not more than ``1e-9`` (relative) above. The realized epsilons must
  not exceed the declared ones either.
* **Law.** The encoders' outputs follow those exact laws (seeded secrets and a seeded
  stand-in for the CSPRNG), including at ``report_epsilon == epsilon`` (no
  instantaneous noise), ``epsilon = 20`` (nearly deterministic) and ``d = 2``.
* **Stream layout.** The permanent response is re-derived from the raw HMAC blocks as
  each encoder's docstring lays them out.
* **Memoization** and **bad values**.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any

import pytest

from veil.client.encoders import (
    ENCODERS,
    GrrEncoder,
    HadamardEncoder,
    OlhEncoder,
    OueEncoder,
    make_encoder,
)
from veil.shared.errors import ParameterError
from veil.shared.kinds import GrrParams, HadamardParams, OlhParams, OracleParams, OueParams
from veil.shared.registry import Metric

ONE = 1 << 32
#: a check fails if a count is more than this many standard errors from its expectation
SIGMAS = 5.0
#: how far above the exact epsilon a stated epsilon may be (relative)
SLACK = 1e-9

ORACLES: list[type[OracleParams]] = [GrrParams, OueParams, OlhParams, HadamardParams]
ORACLE_IDS = [cls.oracle for cls in ORACLES]
Law = dict[Any, Fraction]


def labels(d: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(d))


def secrets(seed: int, count: int) -> list[bytes]:
    """``count`` installation secrets from a seeded generator."""
    generator = random.Random(seed)
    return [generator.randbytes(32) for _ in range(count)]


def fresh(seed: int) -> Callable[[int], bytes]:
    """A seeded stand-in for os.urandom (tests only)."""
    return random.Random(seed).randbytes


def prob(numerator: int) -> Fraction:
    """The realized probability ``numerator / 2**32``."""
    return Fraction(numerator, ONE)


def popcount(n: int) -> int:
    return bin(n).count("1")


# --- the exact laws, from the mechanisms' definitions ---------------------------------


def keep_or_uniform(law: Law, keep: Fraction, alphabet: Sequence[Any]) -> Law:
    """The law of the instantaneous response composed with the permanent one's ``law``:
    ``sum_w law(w) (keep [z = w] + (1 - keep) / n) = keep law(z) + (1 - keep) / n``
    (the second form because ``law`` sums to 1)."""
    assert sum(law.values()) == 1
    assert set(law) <= set(alphabet)
    n = len(alphabet)
    return {z: keep * law.get(z, Fraction(0)) + (1 - keep) / n for z in alphabet}


def grr_permanent(params: GrrParams, x: int) -> Law:
    """``x`` w.p. ``a``, any other of the ``d`` w.p. ``(1 - a) / (d - 1)``."""
    a, d = prob(params.prr_numerator), params.d
    return {z: a if z == x else (1 - a) / (d - 1) for z in range(d)}


def grr_report(params: GrrParams, x: int) -> Law:
    return keep_or_uniform(grr_permanent(params, x), prob(params.irr_numerator), range(params.d))


def hadamard_size(d: int) -> int:
    """The least power of two above ``d``."""
    size = 1
    while size <= d:
        size *= 2
    return size


def hadamard_permanent(params: HadamardParams, x: int) -> Law:
    """Uniform in ``C_x = {y : popcount((x + 1) & y) even}`` w.p. ``a``, else uniform outside."""
    size, a = hadamard_size(params.d), prob(params.prr_numerator)
    inside = {y for y in range(size) if popcount((x + 1) & y) % 2 == 0}
    assert len(inside) == size // 2
    return {y: (a if y in inside else 1 - a) / (size // 2) for y in range(size)}


def hadamard_report(params: HadamardParams, x: int) -> Law:
    return keep_or_uniform(hadamard_permanent(params, x), prob(params.irr_numerator),
                           range(hadamard_size(params.d)))


def olh_digits(n: int, g: int, r: int) -> list[int]:
    return [(n // g**i) % g for i in range(r)]


def olh_hash(g: int, r: int, function: int, x: int) -> int:
    """``h_a(x) = sum_i a_i x_i mod g`` over the ``r`` base-``g`` digits, least significant first."""
    return sum(a * b for a, b in zip(olh_digits(function, g, r), olh_digits(x, g, r),
                                     strict=True)) % g


def olh_shape(params: OlhParams) -> tuple[int, int, int]:
    """``(g, r, g**r)`` computed here: ``r`` the fewest base-``g`` digits that hold ``d - 1``."""
    g = params.buckets
    r = 1
    while g**r < params.d:
        r += 1
    return g, r, g**r


def olh_bucket_permanent(params: OlhParams, bucket: int) -> Law:
    """GRR over the ``g`` buckets around ``bucket``."""
    g, a = params.buckets, prob(params.prr_numerator)
    return {b: a if b == bucket else (1 - a) / (g - 1) for b in range(g)}


def olh_law(params: OlhParams, x: int, report: bool) -> Law:
    """The law of the payload ``a g + bucket``: ``a`` uniform among the ``g**r`` functions."""
    g, r, functions = olh_shape(params)
    law: Law = {}
    for function in range(functions):
        buckets = olh_bucket_permanent(params, olh_hash(g, r, function, x))
        if report:
            buckets = keep_or_uniform(buckets, prob(params.irr_numerator), range(g))
        for bucket, p in buckets.items():
            law[function * g + bucket] = p / functions
    return law


def oue_bit_probs(params: OueParams, report: bool) -> tuple[Fraction, Fraction]:
    """``P(bit = 1)`` of the category's own bit and of another's.

    Permanent: own 1/2, other ``c = (2**32 - N_prr) / 2**32``. Report: 1 w.p. ``N_1``
    where the permanent bit is 1 and ``N_0`` where it is 0 (the realized thresholds,
    which must be "kept w.p. lambda, else a fair coin" up to one part in ``2**32``).
    """
    own, other = Fraction(1, 2), prob(ONE - params.prr_numerator)
    if not report:
        return own, other
    zero, one = params.irr_thresholds(params.irr_numerator)
    keep = prob(params.irr_numerator)
    assert zero + one == ONE
    assert abs(prob(zero) - (1 - keep) / 2) <= Fraction(1, ONE)
    t0, t1 = prob(zero), prob(one)
    return own * t1 + (1 - own) * t0, other * t1 + (1 - other) * t0


def oue_law(params: OueParams, x: int, report: bool) -> Law:
    """The law of the ``d``-bit vector (bits independent), for small ``d``."""
    own, other = oue_bit_probs(params, report)
    law: Law = {}
    for vector in range(1 << params.d):
        p = Fraction(1)
        for i in range(params.d):
            one = own if i == x else other
            p *= one if (vector >> i) & 1 else 1 - one
        law[vector] = p
    return law


def exact_law(params: OracleParams, x: int, report: bool) -> Law:
    """The law of the permanent response (``report=False``) or of one report of ``x``,
    keyed by the payload (OUE: the bits as an integer)."""
    if isinstance(params, GrrParams):
        return grr_report(params, x) if report else grr_permanent(params, x)
    if isinstance(params, HadamardParams):
        return hadamard_report(params, x) if report else hadamard_permanent(params, x)
    if isinstance(params, OlhParams):
        return olh_law(params, x, report)
    assert isinstance(params, OueParams)
    return oue_law(params, x, report)


# --- privacy ----------------------------------------------------------------------------


def max_log_ratio(laws: Iterable[Law]) -> float:
    """``max ln(P(z | x) / P(z | x'))`` over the given inputs' laws and every output ``z``:
    per output, the largest probability over the smallest."""
    laws = list(laws)
    worst = Fraction(1)
    for z in laws[0]:
        column = [law[z] for law in laws]
        high, low = max(column), min(column)
        if low == 0:
            if high > 0:
                return math.inf
            continue
        worst = max(worst, high / low)
    return math.log(worst)


def pairs(d: int) -> list[tuple[int, int]]:
    """Pairs of distinct inputs: all of them for small ``d``, a spread of them otherwise."""
    if d <= 16:
        return [(x, y) for x in range(d) for y in range(x + 1, d)]
    return sorted({(0, 1), (0, d - 1), (1, d // 2), (d // 2, d - 1)})


def oue_epsilon(params: OueParams, report: bool) -> float:
    """Vectors of ``x`` and ``y`` differ in law only at bits ``x`` and ``y`` (the others have
    the same law under both and are independent), so the ratio is over those two bits."""
    own, other = oue_bit_probs(params, report)

    def bit(one: Fraction, value: int) -> Fraction:
        return one if value else 1 - one

    under_x = {(u, v): bit(own, u) * bit(other, v) for u in (0, 1) for v in (0, 1)}
    under_y = {(u, v): bit(other, u) * bit(own, v) for u in (0, 1) for v in (0, 1)}
    return max_log_ratio([under_x, under_y])


def olh_epsilon(params: OlhParams, report: bool) -> float:
    """Per hash function ``a`` the payload's law is ``1/g**r`` times the bucket channel's
    row of ``h_a(x)``; the bucket channel is the same around every bucket, so a pair of
    inputs has ratio 1 under a function on which they collide, and otherwise the bucket
    channel's largest ratio (between its rows around two different buckets)."""
    g, r, functions = olh_shape(params)
    rows = [olh_bucket_permanent(params, h) for h in (0, 1)]
    if report:
        rows = [keep_or_uniform(row, prob(params.irr_numerator), range(g)) for row in rows]
    channel = max_log_ratio(rows)
    epsilon = 0.0
    for x, y in pairs(params.d):
        collide = sum(olh_hash(g, r, a, x) == olh_hash(g, r, a, y) for a in range(functions))
        assert collide * g == functions, "a linear family: exactly 1/g of the functions collide"
        if collide < functions:
            epsilon = max(epsilon, channel)
    return epsilon


def exact_epsilon(params: OracleParams, report: bool) -> float:
    if isinstance(params, OueParams):
        return oue_epsilon(params, report)
    if isinstance(params, OlhParams):
        return olh_epsilon(params, report)
    return max_log_ratio(exact_law(params, x, report) for x in range(params.d))


def assert_stated(stated: float, exact: float, declared: float, what: str) -> None:
    assert stated >= exact, f"{what}: stated {stated!r} below the exact {exact!r}"
    assert stated <= exact * (1 + SLACK), f"{what}: stated {stated!r} above the exact {exact!r}"
    assert exact <= declared * (1 + 1e-12), f"{what}: exact {exact!r} above declared {declared!r}"


PRIVACY_CASES = [
    (cls, d, epsilon, report)
    for cls in ORACLES
    for d in (2, 3, 16, 100)
    for epsilon in (0.5, 1.0, 4.0, 8.0, 20.0)
    for report in ("equal", "small")
]


@pytest.mark.parametrize(
    ("cls", "d", "epsilon", "report"), PRIVACY_CASES,
    ids=[f"{cls.oracle}-d{d}-eps{epsilon:g}-{report}" for cls, d, epsilon, report in PRIVACY_CASES],
)
def test_stated_epsilons_are_the_exact_worst_case_log_ratios(
    cls: type[OracleParams], d: int, epsilon: float, report: str
) -> None:
    """report "equal": report_epsilon = epsilon (lambda = 1); "small": report_epsilon = 0.05."""
    report_epsilon = epsilon if report == "equal" else 0.05
    params = cls(categories=labels(d), epsilon=epsilon, report_epsilon=report_epsilon)
    exact_inf = exact_epsilon(params, report=False)
    exact_1 = exact_epsilon(params, report=True)
    assert_stated(params.epsilon_inf, exact_inf, epsilon, "epsilon_inf")
    assert_stated(params.epsilon_1, exact_1, report_epsilon, "epsilon_1")
    if report == "equal":
        assert params.irr_numerator == ONE  # no instantaneous noise is needed
        assert exact_1 == exact_inf


def test_the_privacy_check_sees_an_epsilon_that_is_off() -> None:
    """The exact computation is sharp: moving a numerator by a little changes it."""
    params = GrrParams(categories=labels(3), epsilon=1.0)
    nudged = GrrParams(categories=labels(3), epsilon=1.0)
    nudged.__dict__["prr_numerator"] = params.prr_numerator + 2**20  # the cached property
    assert exact_epsilon(nudged, report=False) > params.epsilon_inf


# --- the encoders' law ------------------------------------------------------------------


def law_cases() -> list[OracleParams]:
    cases: list[OracleParams] = []
    for cls in ORACLES:
        cases += [
            cls(categories=labels(3), epsilon=1.0),
            cls(categories=labels(2), epsilon=2.0),  # d = 2
            # nearly deterministic (OLH with 3 buckets: its default 1021 make too many cells)
            cls(categories=labels(3), epsilon=20.0, report_epsilon=10.0,
                **({"g": 3} if cls is OlhParams else {})),
            cls(categories=labels(3), epsilon=1.5, report_epsilon=1.5),  # lambda = 1
        ]
    cases.append(OlhParams(categories=labels(5), epsilon=1.0, g=2))  # three-digit hash
    cases.append(HadamardParams(categories=labels(5), epsilon=1.0))  # K = 8
    cases.append(OueParams(categories=labels(5), epsilon=0.7, report_epsilon=0.2))
    return cases


LAW_CASES = law_cases()
LAW_IDS = [f"{p.oracle}-d{p.d}-eps{p.epsilon:g}-r{p.report_epsilon:g}" for p in LAW_CASES]


def payload_key(params: OracleParams, payload: Any) -> Any:
    """The payload as the exact laws key it (parsed as the collector would)."""
    return params.parse_payload(payload)


def assert_law(counts: Counter[Any], n: int, law: Law, what: str) -> None:
    """Every cell within 5 binomial standard errors of its count: a cell of probability
    ``p`` among ``n`` draws has ``|count - n p| <= 5 sqrt(n p (1 - p))`` (so a cell of
    probability 0 is never seen); nothing falls outside the law's support."""
    assert sum(counts.values()) == n
    assert set(counts) <= set(law), f"{what}: outputs {set(counts) - set(law)} are impossible"
    for z, p in law.items():
        expected = n * float(p)
        tolerance = SIGMAS * math.sqrt(n * float(p) * float(1 - p))
        assert abs(counts[z] - expected) <= tolerance, (
            f"{what}: output {z}: {counts[z]} in {n}, expected {expected:.1f} ± {tolerance:.1f}"
        )


VALUE = 1  # the category reported in the law tests


@pytest.mark.parametrize("params", LAW_CASES, ids=LAW_IDS)
def test_permanent_response_follows_the_exact_law_over_installations(
    params: OracleParams,
) -> None:
    metric = Metric("browser", params)
    n = 12000
    counts = Counter(make_encoder(metric, secret).memoized(params.categories[VALUE].encode())
                     for secret in secrets(1, n))
    if isinstance(params, OlhParams):  # the memoized pair (function, bucket)
        counts = Counter({a * params.buckets + b: c for (a, b), c in counts.items()})
    assert_law(counts, n, exact_law(params, VALUE, report=False), "permanent response")


@pytest.mark.parametrize("params", LAW_CASES, ids=LAW_IDS)
def test_one_report_follows_the_exact_law_over_installations(params: OracleParams) -> None:
    metric = Metric("browser", params)
    n = 12000
    random_bytes = fresh(2)
    counts = Counter(
        payload_key(params, make_encoder(metric, secret, 0, random_bytes)
                    .encode(params.categories[VALUE]))
        for secret in secrets(3, n)
    )
    assert_law(counts, n, exact_law(params, VALUE, report=True), "one report")


def instantaneous_law(params: OracleParams, permanent: Any) -> Law:
    """The law of a report given the permanent response."""
    keep = prob(params.irr_numerator)
    if isinstance(params, OueParams):
        zero, one = (prob(t) for t in params.irr_thresholds(params.irr_numerator))
        law: Law = {}
        for vector in range(1 << params.d):
            p = Fraction(1)
            for i in range(params.d):
                ones = one if (permanent >> i) & 1 else zero
                p *= ones if (vector >> i) & 1 else 1 - ones
            law[vector] = p
        return law
    if isinstance(params, OlhParams):
        function, bucket = permanent
        g = params.buckets
        buckets = keep_or_uniform({bucket: Fraction(1)}, keep, range(g))
        return {function * g + b: p for b, p in buckets.items()}
    return keep_or_uniform({permanent: Fraction(1)}, keep, range(params.responses))


@pytest.mark.parametrize("params", LAW_CASES, ids=LAW_IDS)
def test_reports_of_one_installation_follow_the_instantaneous_law(params: OracleParams) -> None:
    n = 12000
    for seed, secret in enumerate(secrets(4, 3)):
        encoder = make_encoder(Metric("browser", params), secret, 0, fresh(5 + seed))
        value = params.categories[seed % params.d]
        permanent = encoder.memoized(encoder.memo_key(value))
        counts = Counter(payload_key(params, encoder.encode(value)) for _ in range(n))
        assert_law(counts, n, instantaneous_law(params, permanent), f"reports given {permanent}")


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
@pytest.mark.parametrize("d", [2, 7, 100])
def test_without_instantaneous_noise_every_report_is_the_permanent_response(
    cls: type[OracleParams], d: int
) -> None:
    params = cls(categories=labels(d), epsilon=3.0, report_epsilon=3.0)
    assert params.irr_numerator == ONE
    for secret in secrets(6, 20):
        encoder = make_encoder(Metric("browser", params), secret, 0, fresh(7))
        for value in params.categories[:5]:
            permanent = encoder.memoized(encoder.memo_key(value))
            expected = instantaneous_law(params, permanent) if d <= 7 else None
            reports = {payload_key(params, encoder.encode(value)) for _ in range(30)}
            assert len(reports) == 1
            if expected is not None:
                assert expected[reports.pop()] == 1


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
def test_payloads_pass_wire_validation_at_a_thousand_categories(
    cls: type[OracleParams],
) -> None:
    params = cls(categories=labels(1024), epsilon=2.0)
    encoder = make_encoder(Metric("browser", params), secrets(8, 1)[0], 0, fresh(9))
    for i in range(0, 1024, 7):
        params.parse_payload(encoder.encode(f"c{i}"))


def test_oue_instantaneous_bits_at_a_thousand_categories() -> None:
    """Each bit of a report is 1 w.p. N_1 where the permanent bit is 1 and N_0 where it is 0:
    pooled over the bits sharing a probability, within 5 standard errors of a binomial
    count of ``n * bits`` trials (bits are independent given the permanent response)."""
    params = OueParams(categories=labels(1024), epsilon=2.0)
    encoder = make_encoder(Metric("browser", params), secrets(10, 1)[0], 0, fresh(11))
    permanent = encoder.memoized(b"c3")
    n = 400
    ones_where = {0: 0, 1: 0}
    for _ in range(n):
        bits = params.parse_payload(encoder.encode("c3"))
        ones_where[1] += popcount(bits & permanent)
        ones_where[0] += popcount(bits & ~permanent)
    zero, one = params.irr_thresholds(params.irr_numerator)
    for side, threshold in ((0, zero), (1, one)):
        trials = n * (popcount(permanent) if side else params.d - popcount(permanent))
        p = threshold / ONE
        assert abs(ones_where[side] - trials * p) <= SIGMAS * math.sqrt(trials * p * (1 - p))


# --- the stream layout ------------------------------------------------------------------


class RawStream:
    """The permanent stream read off raw HMAC-SHA256 blocks, as veil.client.randomness
    defines them, with the integer samplers the docstrings describe."""

    def __init__(self, secret: bytes, metric: str, context: bytes) -> None:
        self.secret = secret
        self.suffix = b"veil-v1\0prr\0" + metric.encode() + b"\0" + context
        self.data, self.at = b"", 0

    def read(self, n: int) -> bytes:
        while len(self.data) < self.at + n:  # block i: HMAC(secret, be32(i) || suffix)
            block = len(self.data) // 32 + 1
            self.data += hmac.new(self.secret, block.to_bytes(4, "big") + self.suffix,
                                  hashlib.sha256).digest()
        self.at += n
        return self.data[self.at - n : self.at]

    def u32(self) -> int:
        return int.from_bytes(self.read(4), "big")

    def randbelow(self, n: int) -> int:
        """Whole big-endian bytes, the top ``bit_length(n - 1)`` bits kept, redrawn until < n."""
        if n == 1:
            return 0
        bits = (n - 1).bit_length()
        size = (bits + 7) // 8
        while True:
            candidate = int.from_bytes(self.read(size), "big") >> (8 * size - bits)
            if candidate < n:
                return candidate

    def words(self, count: int, d: int) -> list[int]:
        """``count`` little-endian words of ``d`` bits, ``ceil(d / 8)`` bytes each."""
        width = (d + 7) // 8
        return [int.from_bytes(self.read(width), "little") & ((1 << d) - 1)
                for _ in range(count)]


def layout_permanent(params: OracleParams, secret: bytes, metric: str, x: int) -> Any:
    stream = RawStream(secret, metric,
                       params.fingerprint.encode() + b"\0" + params.categories[x].encode())
    if isinstance(params, GrrParams):
        if stream.u32() < params.prr_numerator:
            return x
        other = stream.randbelow(params.d - 1)
        return other if other < x else other + 1
    if isinstance(params, OlhParams):
        g, r, functions = olh_shape(params)
        function = stream.randbelow(functions)
        bucket = olh_hash(g, r, function, x)
        if stream.u32() >= params.prr_numerator:
            other = stream.randbelow(g - 1)
            bucket = other if other < bucket else other + 1
        return function, bucket
    if isinstance(params, HadamardParams):
        u = x + 1
        y = stream.randbelow(hadamard_size(params.d))
        inside = stream.u32() < params.prr_numerator
        if (popcount(u & y) % 2 == 0) != inside:
            y ^= u & -u
        return y
    assert isinstance(params, OueParams)
    # the coin, then a bit-sliced Bernoulli(N_c) mask: from the lowest 1 digit of N_c up,
    # mask = word | mask for a 1 digit, word & mask for a 0 digit
    c = ONE - params.prr_numerator
    lowest = (c & -c).bit_length() - 1
    coin, *words = stream.words(1 + 32 - lowest, params.d)
    mask = 0
    for position, word in zip(range(lowest, 32), words, strict=True):
        mask = (word | mask) if (c >> position) & 1 else (word & mask)
    own = 1 << x
    return (mask & ~own) | (coin & own)


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
@pytest.mark.parametrize("d", [2, 5, 300])
def test_permanent_response_is_the_documented_stream_layout(
    cls: type[OracleParams], d: int
) -> None:
    params = cls(categories=labels(d), epsilon=1.0)
    for secret in secrets(12, 25):
        encoder = make_encoder(Metric("browser", params), secret)
        for x in {0, 1, d - 1}:
            expected = layout_permanent(params, secret, "browser", x)
            assert encoder.memoized(encoder.memo_key(f"c{x}")) == expected


# --- memoization ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
def test_permanent_response_is_memoized_per_secret_metric_and_value(
    cls: type[OracleParams],
) -> None:
    params = cls(categories=labels(16), epsilon=1.0)
    metric = Metric("browser", params)
    secret, other_secret = secrets(13, 2)
    first = make_encoder(metric, secret, 0, fresh(1))
    again = make_encoder(metric, secret, 0, fresh(2))
    for value in params.categories:
        key = first.memo_key(value)
        assert key == value.encode()
        assert first.memoized(key) == again.memoized(key) == again.derive(key)
    # cached: once derived, a response is not derived again (small ints are shared objects,
    # so `memoized(key) is memoized(key)` would hold without a cache)
    cached = {value: first.memoized(value.encode()) for value in params.categories}

    def derive_again(key: bytes) -> Any:
        raise AssertionError(f"{key!r} was derived again")

    first.derive = derive_again  # type: ignore[method-assign]
    assert {value: first.memoized(value.encode()) for value in params.categories} == cached
    # across installations (and metrics) the responses are independent draws: among 40
    # secrets, one value's permanent responses are not all the same
    key = b"c5"
    across = {make_encoder(metric, s).memoized(key) for s in secrets(14, 40)}
    assert len(across) > 1
    assert make_encoder(metric, other_secret).derive(key) == layout_permanent(
        params, other_secret, "browser", 5)
    renamed = {make_encoder(Metric(f"m{i}", params), secret).memoized(key) for i in range(40)}
    assert len(renamed) > 1


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
def test_reports_of_one_value_vary_when_report_epsilon_is_below_epsilon(
    cls: type[OracleParams],
) -> None:
    params = cls(categories=labels(16), epsilon=4.0, report_epsilon=1.0)
    encoder = make_encoder(Metric("browser", params), secrets(15, 1)[0], 0, fresh(16))
    reports = [encoder.encode("c4") for _ in range(200)]
    assert len(set(reports)) > 1


# --- registration and bad values --------------------------------------------------------


def test_the_four_encoders_are_registered_by_mechanism_name() -> None:
    expected = {GrrParams: GrrEncoder, OueParams: OueEncoder, OlhParams: OlhEncoder,
                HadamardParams: HadamardEncoder}
    for params_type, encoder_type in expected.items():
        assert ENCODERS[params_type.mechanism_name] is encoder_type
        assert encoder_type.params_type is params_type
        encoder = make_encoder(Metric("browser", params_type(categories=labels(4))), bytes(32))
        assert type(encoder) is encoder_type
        assert encoder.fresh.random_bytes is os.urandom  # production noise: the OS CSPRNG


BAD_VALUES = ["nope", "C1", "", 3, 1.5, None, True, b"c1", ["c1"]]


@pytest.mark.parametrize("cls", ORACLES, ids=ORACLE_IDS)
@pytest.mark.parametrize("value", BAD_VALUES, ids=[repr(v) for v in BAD_VALUES])
def test_bad_values_raise_parameter_error_naming_the_type_not_the_value(
    cls: type[OracleParams], value: Any
) -> None:
    """A raw value never appears in a message (it may be private, or huge): an unlisted
    string is "not one of the 4 categories", anything else is named by its type."""
    encoder = make_encoder(Metric("browser", cls(categories=labels(4))), bytes(32))
    with pytest.raises(ParameterError) as raised:
        encoder.encode(value)
    assert raised.value.field == "value"
    message = str(raised.value)
    assert "one of the 4 categories (" in message
    if isinstance(value, str):
        assert message.startswith("is not one of") and repr(value) not in message
    else:
        assert message.endswith(f"; got {type(value).__name__}")
    with pytest.raises(ParameterError):
        encoder.memo_key(value)
