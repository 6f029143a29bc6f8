"""Exact samplers for the discrete Laplace and discrete Gaussian distributions.

They follow Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020), Algorithms 1-3: integer and rational
arithmetic only, so the output distribution is exactly the stated one and
none of the floating-point weaknesses of textbook Laplace sampling (Mironov,
CCS 2012) apply.
"""

from __future__ import annotations

from fractions import Fraction
from math import floor, isqrt

from veil.client.randomness import RandomStream


def bernoulli_exp(stream: RandomStream, gamma: Fraction) -> bool:
    """True with probability ``exp(-gamma)`` for rational ``gamma >= 0``."""
    while gamma > 1:
        if not bernoulli_exp(stream, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while stream.bernoulli(gamma / k):
        k += 1
    return k % 2 == 1


def discrete_laplace(stream: RandomStream, scale: Fraction) -> int:
    """An integer ``z`` with ``P(z)`` proportional to ``exp(-|z| / scale)``."""
    t, s = scale.numerator, scale.denominator  # scale = t / s
    while True:
        u = stream.randbelow(t)
        if not bernoulli_exp(stream, Fraction(u, t)):
            continue
        v = 0
        while bernoulli_exp(stream, Fraction(1)):
            v += 1
        y = (u + t * v) // s
        negative = stream.bernoulli(Fraction(1, 2))
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(stream: RandomStream, sigma2: Fraction) -> int:
    """An integer ``z`` with ``P(z)`` proportional to ``exp(-z**2 / (2 sigma2))``."""
    t = isqrt(floor(sigma2)) + 1
    while True:
        y = discrete_laplace(stream, Fraction(t))
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp(stream, gamma):
            return y
