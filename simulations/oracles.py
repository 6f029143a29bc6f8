"""Simulation-side frequency oracles of Wang et al. (USENIX Security 2017).

Four ways for ``n`` users to report one of ``d`` values under epsilon-LDP,
each with its unbiased count estimator and closed-form variance:

* GRR (generalized randomized response / direct encoding): the true value
  w.p. ``p = e^eps / (e^eps + d - 1)``, otherwise one of the other ``d - 1``;
* SUE (symmetric unary encoding, basic one-hot RAPPOR without memoization):
  each one-hot bit kept w.p. ``e^(eps/2) / (e^(eps/2) + 1)``;
* OUE (optimized unary encoding): the 1 bit kept w.p. 1/2, each 0 bit flipped
  to 1 w.p. ``1 / (e^eps + 1)``;
* OLH (optimized local hashing): each user hashes the domain into
  ``g = round(e^eps + 1)`` buckets with their own hash function (drawn here as
  a fully random function, the ideal family the analysis assumes) and reports
  the bucket of their value with GRR over ``g``.

For all four the support count ``I_v`` of value ``v`` is
``Binomial(n_v, p) + Binomial(n - n_v, q)`` and the estimate
``(I_v - n q) / (p - q)`` has variance
``(n_v p (1-p) + (n - n_v) q (1-q)) / (p - q)**2``; at ``n_v = 0`` this is
Wang et al.'s closed form. Randomness is a seeded NumPy generator
(simulation only, not for production).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from veil.shared.errors import ParameterError

ORACLES = ("GRR", "SUE", "OUE", "OLH")


@dataclasses.dataclass(frozen=True)
class Oracle:
    """One frequency oracle at ``epsilon`` over ``d`` values."""

    name: str
    epsilon: float
    d: int

    def __post_init__(self) -> None:
        if self.name not in ORACLES:
            raise ParameterError("oracle", f"unknown oracle {self.name!r}; choose one of {ORACLES}")
        if not self.epsilon > 0 or self.d < 2:
            raise ParameterError("epsilon", "need epsilon > 0 and d >= 2 values")

    @property
    def g(self) -> int:
        """OLH's number of hash buckets."""
        return max(2, round(math.exp(self.epsilon) + 1))

    @property
    def probs(self) -> tuple[float, float]:
        """``(p, q)``: probability that a user supports their own value / another value."""
        e = math.exp(self.epsilon)
        if self.name == "GRR":
            return e / (e + self.d - 1), 1 / (e + self.d - 1)
        if self.name == "SUE":
            half = math.exp(self.epsilon / 2)
            return half / (half + 1), 1 / (half + 1)
        if self.name == "OUE":
            return 0.5, 1 / (e + 1)
        return e / (e + self.g - 1), 1 / self.g

    def closed_form_variance(self, n: int) -> float:
        """Wang et al.'s variance of a count estimate (the value's own frequency ~ 0)."""
        e = math.exp(self.epsilon)
        if self.name == "GRR":
            return n * (self.d - 2 + e) / (e - 1) ** 2
        if self.name == "SUE":
            half = math.exp(self.epsilon / 2)
            return n * half / (half - 1) ** 2
        return n * 4 * e / (e - 1) ** 2

    def exact_variance(self, counts: np.ndarray) -> np.ndarray:
        """Variance of each count estimate for true ``counts`` (n_v p(1-p) + (n-n_v) q(1-q)) / (p-q)^2."""
        p, q = self.probs
        n = counts.sum()
        variance: np.ndarray = (counts * p * (1 - p) + (n - counts) * q * (1 - q)) / (p - q) ** 2
        return variance

    def support_counts(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Encode every user's value and count, per value, the reports that support it."""
        n, d = len(values), self.d
        p, q = self.probs
        if self.name == "GRR":
            keep = rng.random(n) < p
            other = (values + rng.integers(1, d, size=n)) % d
            return np.bincount(np.where(keep, values, other), minlength=d)
        if self.name in ("SUE", "OUE"):
            bits = rng.random((n, d)) < q
            bits[np.arange(n), values] = rng.random(n) < p
            supports: np.ndarray = bits.sum(axis=0)
            return supports
        g = self.g
        hashes = rng.integers(0, g, size=(n, d))
        own = hashes[np.arange(n), values]
        keep = rng.random(n) < p
        reported = np.where(keep, own, (own + rng.integers(1, g, size=n)) % g)
        hits: np.ndarray = (hashes == reported[:, None]).sum(axis=0)
        return hits

    def estimate(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Unbiased count estimates ``(I_v - n q) / (p - q)`` from one round of reports."""
        p, q = self.probs
        return (self.support_counts(values, rng) - len(values) * q) / (p - q)
