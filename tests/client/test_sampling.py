"""The exact samplers produce the discrete Laplace and discrete Gaussian laws.

Each test draws from a seeded stream and compares the count of every value in
a central window (and the pooled rest) with its probability under the
closed-form pmf: 4 binomial standard deviations, sqrt(n p (1 - p)), per cell.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from veil.client.encoders.sampling import bernoulli_exp, discrete_gaussian, discrete_laplace
from veil.client.randomness import FreshStream

SIGMAS = 4.0


def stream(seed: int) -> FreshStream:
    return FreshStream(random.Random(seed).randbytes)


def assert_matches_pmf(samples: list[int], pmf, window: int) -> None:
    """Per-value and pooled-tail counts within 4 binomial standard deviations.

    Values whose expected count is below 5 are pooled with the tails (the usual
    condition for the normal approximation of a binomial count to hold).
    """
    n = len(samples)
    counts = Counter(samples)
    cells = {z: (counts[z], pmf(z)) for z in range(-window, window + 1) if n * pmf(z) >= 5}
    inside = math.fsum(p for _, p in cells.values())
    cells["rest"] = (sum(c for z, c in counts.items() if z not in cells), 1.0 - inside)
    for cell, (count, probability) in cells.items():
        tolerance = SIGMAS * math.sqrt(n * probability * (1 - probability))
        assert abs(count - n * probability) <= tolerance, (
            f"value {cell}: {count} of {n}, expected {n * probability:.1f} ± {tolerance:.1f}"
        )


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_is_true_with_probability_exp_minus_gamma(gamma: Fraction) -> None:
    source = stream(1)
    n = 6000
    hits = sum(bernoulli_exp(source, gamma) for _ in range(n))
    probability = math.exp(-gamma)
    assert abs(hits - n * probability) <= SIGMAS * math.sqrt(n * probability * (1 - probability))


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(2), Fraction(7, 3)])
def test_discrete_laplace_pmf(scale: Fraction) -> None:
    """P(z) = (1 - r) / (1 + r) * r^|z| with r = exp(-1 / scale)."""
    source = stream(2)
    samples = [discrete_laplace(source, scale) for _ in range(8000)]
    r = math.exp(-1 / scale)
    assert_matches_pmf(samples, lambda z: (1 - r) / (1 + r) * r ** abs(z), window=8)


@pytest.mark.parametrize("sigma2", [Fraction(1, 2), Fraction(4), Fraction(25, 2)])
def test_discrete_gaussian_pmf(sigma2: Fraction) -> None:
    """P(z) = exp(-z^2 / (2 sigma^2)) / sum_y exp(-y^2 / (2 sigma^2))."""
    source = stream(3)
    samples = [discrete_gaussian(source, sigma2) for _ in range(8000)]
    s2 = float(sigma2)
    norm = math.fsum(math.exp(-y * y / (2 * s2)) for y in range(-200, 201))
    assert_matches_pmf(samples, lambda z: math.exp(-z * z / (2 * s2)) / norm, window=8)


def test_samplers_are_symmetric_and_not_constant() -> None:
    source = stream(4)
    samples = [discrete_laplace(source, Fraction(3)) for _ in range(4000)]
    positive = sum(z > 0 for z in samples)
    negative = sum(z < 0 for z in samples)
    # P(z > 0) = P(z < 0) = r / (1 + r); the difference of the two counts has
    # variance n (P(z > 0) + P(z < 0)) (multinomial, first order)
    r = math.exp(-1 / 3)
    side = r / (1 + r)
    assert abs(positive - negative) <= SIGMAS * math.sqrt(len(samples) * 2 * side)
