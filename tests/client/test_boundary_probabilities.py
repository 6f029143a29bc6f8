"""Every probability at its boundaries: 0, 1, and the smallest and largest representable.

Encoders realize a probability as ``N / 2**32`` (:func:`veil.shared.bits.realize`), so
the smallest non-zero one is ``2**-32`` and the largest below one ``1 - 2**-32``; 0 and 1
must be exact (a certain event always happens, an impossible one never). RAPPOR's
one-time setting is ``q = 1``: a bit set in the PRR is always reported.

Randomness is seeded; tolerances are 4 binomial standard deviations
``4 sqrt(n P (1 - P))`` of a count with probability ``P`` (zero where ``P`` is 0 or 1, so
those checks are exact).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from veil.client.encoders import make_encoder
from veil.client.encoders.rappor import BitRappor
from veil.client.randomness import FreshStream, HmacStream
from veil.shared.bits import realized
from veil.shared.hashing import bloom_indices
from veil.shared.kinds import BooleanParams, CategoryParams, NumberParams, StringParams
from veil.shared.registry import Metric

SMALLEST = 2.0**-32
LARGEST = 1 - 2.0**-32
SIGMAS = 4.0


def tolerance(n: int, probability: float) -> float:
    """4 binomial standard deviations of a count: 4 sqrt(n P (1 - P))."""
    return SIGMAS * math.sqrt(n * probability * (1 - probability))


def assert_counts(counts: list[int], n: int, expected: list[float], what: str) -> None:
    for bit, (count, probability) in enumerate(zip(counts, expected, strict=True)):
        assert abs(count - n * probability) <= tolerance(n, probability), (
            f"{what}, bit {bit}: {count} ones in {n}, expected probability {probability}"
        )


def secrets(seed: int, count: int) -> list[bytes]:
    generator = random.Random(seed)
    return [generator.randbytes(32) for _ in range(count)]


def bit_counts(payloads: list[int], k: int) -> list[int]:
    return [sum((bits >> i) & 1 for bits in payloads) for i in range(k)]


def one_report_each(metric: Metric, value: str, secrets_seed: int, fresh_seed: int,
                    n: int) -> list[int]:
    """One report of ``value`` from each of ``n`` seeded installations, its bits parsed as the
    collector would (seeded fresh noise, cohort 0)."""
    fresh = random.Random(fresh_seed).randbytes
    params = metric.params
    return [params.parse_payload(make_encoder(metric, s, 0, fresh).encode(value))
            for s in secrets(secrets_seed, n)]


IRR_PAIRS = [
    (0.0, 1.0),
    (0.0, LARGEST),
    (SMALLEST, 1.0),
    (0.25, 1.0),
    (0.0, 0.5),
    (0.5, 1.0),
    (SMALLEST, LARGEST),
    (LARGEST, 1.0),
]


@pytest.mark.parametrize(("p", "q"), IRR_PAIRS)
def test_irr_reports_each_bit_with_probability_q_or_p_at_the_boundaries(p: float,
                                                                         q: float) -> None:
    k = 16
    rappor = BitRappor(k, p, q, 0.5)
    prr = 0b1010_0110_0011_1001
    fresh = FreshStream(random.Random(7).randbytes)
    n = 2000
    reports = [rappor.irr(prr, fresh) for _ in range(n)]
    expected = [realized(q) if (prr >> i) & 1 else realized(p) for i in range(k)]
    assert_counts(bit_counts(reports, k), n, expected, f"IRR p={p} q={q}")


@pytest.mark.parametrize("f", [0.0, SMALLEST, 0.5, LARGEST, 1.0])
def test_prr_replaces_each_bit_with_probability_f_at_the_boundaries(f: float) -> None:
    """A PRR bit is 1 w.p. 1 - f/2 where the input bit is 1 and f/2 where it is 0."""
    k = 16
    rappor = BitRappor(k, 0.25, 0.75, f)
    bits = 0b0110_1001_1100_0011
    n = 2000
    prrs = [rappor.prr(bits, HmacStream(secret, b"prr", "m", b"v")) for secret in secrets(3, n)]
    half_f = realized(f) / 2
    expected = [1 - half_f if (bits >> i) & 1 else half_f for i in range(k)]
    assert_counts(bit_counts(prrs, k), n, expected, f"PRR f={f}")


@pytest.mark.parametrize(("p", "q", "f"), [(0.0, 1.0, 0.5), (0.25, 1.0, 0.25), (0.0, 1.0, 0.0)])
def test_string_reports_follow_p_star_and_q_star_with_q_one(p: float, q: float, f: float) -> None:
    """RAPPOR's one-time setting (q = 1): Bloom bits are reported 1 w.p. q*, others p*."""
    params = StringParams(k=32, h=2, m=1, p=p, q=q, f=f)
    n = 2000
    payloads = one_report_each(Metric("homepage", params), "a.com", 4, 5, n)
    bloom = set(bloom_indices(b"a.com", 0, params.k, params.h))
    p_star, q_star = params.effective_probs
    expected = [q_star if i in bloom else p_star for i in range(params.k)]
    assert_counts(bit_counts(payloads, params.k), n, expected, f"string p={p} q={q} f={f}")


@pytest.mark.parametrize(("p", "q", "f"), [(0.0, 1.0, 0.5), (SMALLEST, 1.0, 1.0),
                                           (0.0, 1.0, 0.0)])
def test_category_reports_follow_p_star_and_q_star_at_the_boundaries(p: float, q: float,
                                                                     f: float) -> None:
    params = CategoryParams(categories=("a", "b", "c", "d"), p=p, q=q, f=f)
    n = 2000
    payloads = one_report_each(Metric("browser", params), "c", 5, 6, n)
    p_star, q_star = params.effective_probs
    expected = [q_star if label == "c" else p_star for label in params.categories]
    assert_counts(bit_counts(payloads, params.k), n, expected, f"category p={p} q={q} f={f}")


@pytest.mark.parametrize(
    ("alpha", "beta"),
    list(itertools.product([0.0, SMALLEST, LARGEST], [SMALLEST, 0.5, LARGEST])),
)
def test_boolean_yes_probabilities_at_the_boundaries(alpha: float, beta: float) -> None:
    params = BooleanParams(alpha=alpha, beta=beta)
    metric = Metric("dark_mode", params)
    n = 2000
    yes = {False: 0, True: 0}
    for secret in secrets(6, n):
        encoder = make_encoder(metric, secret)
        for value in (False, True):
            yes[value] += encoder.encode(value)
    for value, probability in zip((False, True), params.yes_probs, strict=True):
        assert abs(yes[value] - n * probability) <= tolerance(n, probability), (
            f"alpha={alpha} beta={beta} value={value}: {yes[value]} yes in {n}"
        )


@pytest.mark.parametrize("grid_point", [0, 8])
@pytest.mark.parametrize("epsilon", [1e-9, 50.0])
def test_one_bit_mean_at_the_extreme_epsilons(epsilon: float, grid_point: int) -> None:
    """1BitMean's bit probability (1 + t (e^eps - 1)) / (e^eps + 1) at both ends of epsilon."""
    params = NumberParams(low=0.0, high=1.0, mechanism="1bitmean", epsilon=epsilon, resolution=8)
    metric = Metric("battery", params)
    n = 2000
    value = grid_point * params.step
    ones = sum(make_encoder(metric, secret).encode(value) for secret in secrets(8, n))
    probability = params.one_bit_numerator(grid_point) / 2**32
    assert abs(ones - n * probability) <= tolerance(n, probability)
    assert math.isfinite(params.epsilon_1)
