"""Each encoder's output follows its stated probabilities.

Randomness is seeded everywhere (secrets and the fresh stream), so every test
is deterministic; tolerances are 4 standard deviations of the statistic under
the stated law, with the formula given at each use. A test fails if an
encoder's law drifts from its parameters by more than a few standard errors.
"""

from __future__ import annotations

import inspect
import math
import os
import random

import pytest

from veil.client.encoders import Encoder, make_encoder
from veil.client.encoders.rappor import BitRappor
from veil.client.randomness import FreshStream
from veil.shared.bits import realized
from veil.shared.hashing import bloom_indices
from veil.shared.kinds import BooleanParams, CategoryParams, NumberParams, StringParams
from veil.shared.registry import Metric

SIGMAS = 4.0


def secrets_stream(seed: int, count: int) -> list[bytes]:
    """``count`` installation secrets from a seeded generator."""
    generator = random.Random(seed)
    return [generator.randbytes(32) for _ in range(count)]


def fresh(seed: int):
    """A seeded stand-in for os.urandom (test only)."""
    return random.Random(seed).randbytes


def binomial_tolerance(n: int, probability: float) -> float:
    """4 binomial standard deviations of a count: 4 sqrt(n p (1 - p))."""
    return SIGMAS * math.sqrt(n * probability * (1 - probability))


def assert_bit_frequencies(counts: list[int], n: int, expected: list[float]) -> None:
    """Each bit's count, and the pooled count of the bits sharing one probability.

    Bits are independent given the encoder's input, so a pool of ``b`` bits is a
    binomial count of ``b n`` trials: the pooled check sees shifts ``sqrt(b)``
    times smaller than the per-bit one.
    """
    pools: dict[float, list[int]] = {}
    for bit, (count, probability) in enumerate(zip(counts, expected, strict=True)):
        tolerance = binomial_tolerance(n, probability)
        assert abs(count - n * probability) <= tolerance, (
            f"bit {bit}: {count} ones in {n}, expected {n * probability:.1f} ± {tolerance:.1f}"
        )
        pools.setdefault(probability, []).append(count)
    for probability, pool in pools.items():
        trials = n * len(pool)
        tolerance = binomial_tolerance(trials, probability)
        assert abs(sum(pool) - trials * probability) <= tolerance, (
            f"{len(pool)} bits with probability {probability}: {sum(pool)} ones in {trials}, "
            f"expected {trials * probability:.1f} ± {tolerance:.1f}"
        )


def bit_counts(payloads: list[str], k: int) -> list[int]:
    counts = [0] * k
    for payload in payloads:
        bits = int.from_bytes(bytes.fromhex(payload), "little")
        for i in range(k):
            counts[i] += (bits >> i) & 1
    return counts


STRING_PARAMS = [
    StringParams(k=32, h=2, m=4, p=0.5, q=0.75, f=0.5),
    StringParams(k=24, h=3, m=2, p=0.39, q=0.61, f=0.3),  # non-dyadic: many mask words
]


def test_production_randomness_is_os_urandom() -> None:
    """Fresh noise defaults to the OS CSPRNG; only tests inject a seeded source."""
    assert inspect.signature(make_encoder).parameters["random_bytes"].default is os.urandom
    assert inspect.signature(Encoder.__init__).parameters["random_bytes"].default is os.urandom
    metric = Metric("homepage", StringParams())
    assert make_encoder(metric, bytes(32)).fresh.random_bytes is os.urandom


@pytest.mark.parametrize("params", STRING_PARAMS, ids=["paper", "google"])
def test_string_bits_follow_p_star_and_q_star_over_installations(params: StringParams) -> None:
    """Over many secrets, a Bloom bit is reported 1 w.p. q*, any other bit w.p. p*."""
    metric = Metric("homepage", params)
    n = 3000
    payloads = []
    cohort = 1
    random_bytes = fresh(11)
    for secret in secrets_stream(1, n):
        encoder = make_encoder(metric, secret, cohort, random_bytes)
        payloads.append(encoder.encode("example.com"))
    bloom = set(bloom_indices(b"example.com", cohort, params.k, params.h))
    p_star, q_star = params.effective_probs
    expected = [q_star if i in bloom else p_star for i in range(params.k)]
    assert_bit_frequencies(bit_counts(payloads, params.k), n, expected)


@pytest.mark.parametrize("params", STRING_PARAMS, ids=["paper", "google"])
def test_string_irr_follows_q_and_p_given_the_prr(params: StringParams) -> None:
    """For one secret, a bit is reported 1 w.p. q where the PRR is 1 and p where it is 0."""
    metric = Metric("homepage", params)
    encoder = make_encoder(metric, secrets_stream(2, 1)[0], 3, fresh(12))
    prr = encoder.memoized(encoder.memo_key("example.com"))
    n = 3000
    payloads = [encoder.encode("example.com") for _ in range(n)]
    p, q = realized(params.p), realized(params.q)
    expected = [q if (prr >> i) & 1 else p for i in range(params.k)]
    assert_bit_frequencies(bit_counts(payloads, params.k), n, expected)


def test_prr_flips_each_bit_with_probability_f_over_two() -> None:
    """Over many secrets, a PRR bit differs from its Bloom bit w.p. f/2, for 1s and 0s alike."""
    params = StringParams(k=32, h=2, m=1, f=0.5)
    metric = Metric("homepage", params)
    n = 2000
    bloom = set(bloom_indices(b"example.com", 0, params.k, params.h))
    counts = [0] * params.k
    for secret in secrets_stream(3, n):
        prr = make_encoder(metric, secret).memoized(b"example.com")
        for i in range(params.k):
            counts[i] += (prr >> i) & 1
    half_f = realized(params.f) / 2
    expected = [1 - half_f if i in bloom else half_f for i in range(params.k)]
    assert_bit_frequencies(counts, n, expected)


def test_category_one_hot_bit_follows_q_star_and_the_rest_p_star() -> None:
    params = CategoryParams(categories=("firefox", "chrome", "safari", "edge", "other"))
    metric = Metric("browser", params)
    n = 4000
    random_bytes = fresh(13)
    payloads = [make_encoder(metric, secret, 0, random_bytes).encode("safari")
                for secret in secrets_stream(4, n)]
    p_star, q_star = params.effective_probs
    expected = [q_star if label == "safari" else p_star for label in params.categories]
    assert_bit_frequencies(bit_counts(payloads, params.k), n, expected)


@pytest.mark.parametrize("params", [BooleanParams(), BooleanParams(alpha=0.8, beta=0.3)],
                         ids=["default", "skewed"])
def test_boolean_yes_probabilities_over_installations(params: BooleanParams) -> None:
    """P(yes | false) and P(yes | true) are ``yes_probs`` (Warner's design)."""
    metric = Metric("dark_mode", params)
    n = 8000
    yes = {False: 0, True: 0}
    for secret in secrets_stream(5, n):
        encoder = make_encoder(metric, secret)
        for value in (False, True):
            yes[value] += encoder.encode(value)
    for value, probability in zip((False, True), params.yes_probs, strict=True):
        assert abs(yes[value] - n * probability) <= binomial_tolerance(n, probability)


def test_boolean_answer_is_memoized_per_value() -> None:
    encoder = make_encoder(Metric("dark_mode", BooleanParams()), secrets_stream(6, 1)[0])
    assert len({encoder.encode(True) for _ in range(50)}) == 1
    assert len({encoder.encode(False) for _ in range(50)}) == 1


@pytest.mark.parametrize(
    "params",
    [
        NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0, resolution=16),
        NumberParams(low=-5.0, high=5.0, mechanism="gaussian", epsilon=4.0, delta=1e-5,
                     resolution=8),
    ],
    ids=["laplace", "gaussian"],
)
def test_number_noise_has_the_stated_variance_and_no_bias(params: NumberParams) -> None:
    """On a grid point (no rounding), report - value is pure noise: mean 0, noise_variance()."""
    metric = Metric("load_time", params)
    value = params.low + 5 * params.step
    n = 3000
    noise = [make_encoder(metric, secret).encode(value) - value for secret in secrets_stream(7, n)]
    mean = math.fsum(noise) / n
    variance = math.fsum((x - mean) ** 2 for x in noise) / (n - 1)
    expected = params.noise_variance()
    # mean: 4 standard errors sqrt(Var / n) with the stated variance
    assert abs(mean) <= SIGMAS * math.sqrt(expected / n)
    # variance: the sample variance has standard error sqrt((m4 - s^4) / n),
    # m4 the sample fourth central moment
    m4 = math.fsum((x - mean) ** 4 for x in noise) / n
    assert abs(variance - expected) <= SIGMAS * math.sqrt((m4 - variance**2) / n)


def test_number_alpha_rounding_is_unbiased_over_installations() -> None:
    """Off the grid, the rounded point is the upper neighbour w.p. the fractional position."""
    params = NumberParams(low=0.0, high=1.0, mechanism="1bitmean", epsilon=1.0, resolution=4)
    metric = Metric("battery", params)
    fraction = 0.3
    value = (2 + fraction) * params.step
    n = 6000
    up = sum(make_encoder(metric, secret).grid_point(value) == 3 for secret in secrets_stream(8, n))
    assert abs(up - n * fraction) <= binomial_tolerance(n, fraction)


@pytest.mark.parametrize("grid_point", [0, 9, 32])
def test_one_bit_mean_bit_probability_per_grid_point(grid_point: int) -> None:
    """1BitMean reports 1 w.p. (1 + t (e^eps - 1)) / (e^eps + 1), t = j / resolution."""
    params = NumberParams(low=0.0, high=100.0, mechanism="1bitmean", epsilon=1.0, resolution=32)
    metric = Metric("battery", params)
    value = params.low + grid_point * params.step
    n = 6000
    ones = sum(make_encoder(metric, secret).encode(value) for secret in secrets_stream(9, n))
    e = math.exp(params.epsilon)
    probability = (1 + grid_point / params.resolution * (e - 1)) / (e + 1)
    assert abs(ones - n * probability) <= binomial_tolerance(n, probability)


def test_prr_is_deterministic_per_secret_metric_and_value() -> None:
    params = StringParams(k=64, h=2, m=8)
    secret = secrets_stream(10, 1)[0]
    first = make_encoder(Metric("homepage", params), secret, 5, fresh(1))
    again = make_encoder(Metric("homepage", params), secret, 5, fresh(2))
    assert first.memoized(b"example.com") == again.memoized(b"example.com")
    assert first.derive(b"example.com") == again.derive(b"example.com")


@pytest.mark.parametrize("vary", ["secret", "metric"])
def test_prrs_are_independent_across_secrets_and_metrics(vary: str) -> None:
    """Two PRRs of one value agree on a bit w.p. (1 - f/2)^2 + (f/2)^2 when independent."""
    params = StringParams(k=32, h=2, m=1, f=0.5)
    n = 1500
    agree = 0
    for secret, other_secret in zip(secrets_stream(20, n), secrets_stream(21, n), strict=True):
        first = make_encoder(Metric("homepage", params), secret).memoized(b"example.com")
        if vary == "secret":
            second = make_encoder(Metric("homepage", params), other_secret).memoized(b"example.com")
        else:
            second = make_encoder(Metric("homepage2", params), secret).memoized(b"example.com")
        agree += params.k - bin(first ^ second).count("1")
    half_f = realized(params.f) / 2
    probability = (1 - half_f) ** 2 + half_f**2
    trials = n * params.k  # bits are independent given the Bloom filter
    assert abs(agree - trials * probability) <= binomial_tolerance(trials, probability)


def test_irr_is_fresh_for_every_report() -> None:
    """Two reports of one value differ on a bit w.p. 2q(1-q) where the PRR is 1, 2p(1-p) where 0."""
    params = StringParams(k=32, h=2, m=1)
    encoder = make_encoder(Metric("homepage", params), secrets_stream(30, 1)[0], 0, fresh(31))
    prr = encoder.memoized(b"example.com")
    p, q = realized(params.p), realized(params.q)
    n = 1500
    differ = [0] * params.k
    for _ in range(n):
        a, b = (int.from_bytes(bytes.fromhex(encoder.encode("example.com")), "little")
                for _ in range(2))
        for i in range(params.k):
            differ[i] += ((a ^ b) >> i) & 1
    expected = [2 * q * (1 - q) if (prr >> i) & 1 else 2 * p * (1 - p) for i in range(params.k)]
    assert_bit_frequencies(differ, n, expected)


@pytest.mark.parametrize(("k", "p", "q"), [(1, 0.1, 0.9), (13, 0.39, 0.61), (203, 0.1, 0.9)])
def test_irr_sampler_is_exact_for_thresholds_with_many_binary_digits(k: int, p: float,
                                                                     q: float) -> None:
    """The digit-by-digit comparison gives each bit probability q (PRR 1) or p (PRR 0),
    including when it needs more words than its first read (the rarely taken path)."""
    rappor = BitRappor(k, p, q, 0.5)
    prr = int("10" * k, 2) & rappor.full  # alternate ones and zeros (bit 0 is 0)
    source = random.Random(40 + k).randbytes
    reads: list[int] = []

    def counted(n: int) -> bytes:
        reads.append(n)
        return source(n)

    fresh_stream = FreshStream(counted)
    n = 3000
    counts = [0] * k
    for _ in range(n):
        bits = rappor.irr(prr, fresh_stream)
        for i in range(k):
            counts[i] += (bits >> i) & 1
    expected = [realized(q) if (prr >> i) & 1 else realized(p) for i in range(k)]
    assert_bit_frequencies(counts, n, expected)
    if k > 8:
        assert len(reads) > n  # some reports needed a second read


def test_laplace_reports_are_unbiased_off_the_grid() -> None:
    """Off the grid the mean report is still the value: alpha rounding plus zero-mean noise.

    Var(report) = noise_variance() + step^2 * t (1 - t), t the fractional grid position
    (rounding up w.p. t); 4 standard errors sqrt(Var / n).
    """
    params = NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0, resolution=16)
    metric = Metric("load_time", params)
    fraction = 0.7
    value = params.low + (6 + fraction) * params.step
    n = 3000
    reports = [make_encoder(metric, secret).encode(value) for secret in secrets_stream(50, n)]
    variance = params.noise_variance() + params.step**2 * fraction * (1 - fraction)
    assert abs(math.fsum(reports) / n - value) <= SIGMAS * math.sqrt(variance / n)
