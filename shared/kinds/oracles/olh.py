"""Optimized local hashing with memoization: L-OLH over a linear hash family.

Each category index ``x`` is written as ``r`` digits in base ``g`` (a prime;
``g**r >= d``). A hash function is a vector ``a`` of ``r`` digits, and
``h_a(x) = sum(a_i x_i) mod g``. For ``x != y`` exactly ``1/g`` of all ``g**r``
functions collide (``a . (x - y) = 0`` is one linear condition over GF(g)), so
the OLH estimator is exactly unbiased with a finite family whose size is about
``d``, and the collector can count reports per (function, bucket).

Permanent response (memoized per value): a uniformly random ``a`` and the
bucket ``h_a(x)`` through GRR over ``g`` buckets at ``epsilon``. Instantaneous
response: the bucket kept with probability ``lambda``, otherwise a uniformly
random bucket. Payload: ``a * g + bucket`` where ``a`` is read as a base-``g``
number (digit ``i`` of ``a`` is its ``i``-th least significant digit).

A report supports the categories that hash to its bucket: its own with
probability ``p``, any other with probability exactly ``1/g``. ``g`` defaults to
the prime with the lowest variance whose table of ``g**(r+1)`` counts stays
within :data:`MAX_OLH_RESPONSES` (Wang et al.'s optimum is ``e^epsilon + 1``), or the
smallest table within 1% of that variance.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError
from veil.shared.kinds.oracles.base import (
    OracleParams,
    largest_numerator,
    log_ratio,
    support_share_variance,
)

#: most (function, bucket) counters an OLH metric keeps per day
MAX_OLH_RESPONSES = 1 << 20


def is_prime(n: int) -> bool:
    """Whether ``n`` is a prime (trial division; ``n`` is small here)."""
    if n < 2:
        return False
    return all(n % f for f in range(2, math.isqrt(n) + 1))


def digits_needed(g: int, d: int) -> int:
    """The least ``r >= 1`` with ``g**r >= d``."""
    r, size = 1, g
    while size < d:
        r, size = r + 1, size * g
    return r


def bucket_channel(g: int, prr: int, irr: int) -> tuple[float, float]:
    """``(P(bucket kept), P(a given other bucket))`` of GRR over ``g`` then the fresh response."""
    a, keep = prr / PROB_ONE, irr / PROB_ONE
    return a * keep + (1 - keep) / g, (1 - a) / (g - 1) * keep + (1 - keep) / g


def bucket_prr_epsilon(g: int, numerator: int) -> float:
    a = numerator / PROB_ONE
    return log_ratio(a * (g - 1), 1 - a)


def numerators(g: int, epsilon: float, report_epsilon: float) -> tuple[int, int]:
    """The permanent and instantaneous numerators of OLH with ``g`` buckets."""
    prr = largest_numerator(functools.partial(bucket_prr_epsilon, g), epsilon,
                            -(-PROB_ONE // g), PROB_ONE - 1)
    irr = largest_numerator(lambda keep: log_ratio(*bucket_channel(g, prr, keep)),
                            report_epsilon, 0, PROB_ONE)
    return prr, irr


def zero_share_variance(g: int, epsilon: float, report_epsilon: float) -> float:
    """Variance per report of the share estimate of an absent category."""
    p, _ = bucket_channel(g, *numerators(g, epsilon, report_epsilon))
    return support_share_variance(p, 1 / g, 0.0, 1)


def best_g(d: int, epsilon: float, report_epsilon: float) -> int:
    """The prime ``g`` of lowest variance whose table fits :data:`MAX_OLH_RESPONSES`; the
    smallest table among those within 1% of that variance (the variance flattens out
    towards large ``g`` while the table keeps growing)."""
    fits = [g for g in range(2, 1025)
            if is_prime(g) and g ** (digits_needed(g, d) + 1) <= MAX_OLH_RESPONSES]
    variances = {g: zero_share_variance(g, epsilon, report_epsilon) for g in fits}
    lowest = min(variances.values())
    return min((g for g in fits if variances[g] <= 1.01 * lowest),
               key=lambda g: (g ** (digits_needed(g, d) + 1), g))


@dataclasses.dataclass(frozen=True)
class OlhParams(OracleParams):
    """OLH over the ``d`` categories with ``g`` buckets (chosen when not given)."""

    oracle: ClassVar[str] = "olh"

    g: int | None = None

    def _check(self) -> None:
        owner = type(self).__name__
        if self.g is None:
            object.__setattr__(self, "g", best_g(self.d, self.epsilon,
                                                 float(self.report_epsilon or 0.0)))
        g = self.g
        if isinstance(g, bool) or not isinstance(g, int) or not is_prime(g):
            raise ParameterError("g", f"The 'g' parameter of {owner} must be a prime. Got {g!r}.")
        if g ** (digits_needed(g, self.d) + 1) > MAX_OLH_RESPONSES:
            raise ParameterError(
                "g",
                f"The 'g' parameter of {owner}: {g} buckets over {self.d} categories need "
                f"{g ** (digits_needed(g, self.d) + 1)} counters, more than {MAX_OLH_RESPONSES}; "
                "omit g to have the best one chosen",
            )

    @property
    def buckets(self) -> int:
        """``g``, the number of hash buckets."""
        assert self.g is not None
        return self.g

    @functools.cached_property
    def digits(self) -> int:
        """``r``: base-``g`` digits of a category index (and of a hash function)."""
        return digits_needed(self.buckets, self.d)

    @functools.cached_property
    def functions(self) -> int:
        """``g**r``: the number of hash functions (computed once: every payload is checked
        against :attr:`responses`)."""
        return int(self.buckets ** self.digits)

    @property
    def responses(self) -> int:
        return self.functions * self.buckets

    def prr_range(self) -> tuple[int, int]:
        return -(-PROB_ONE // self.buckets), PROB_ONE - 1

    def prr_epsilon(self, numerator: int) -> float:
        return bucket_prr_epsilon(self.buckets, numerator)

    def report_probs(self, prr: int, irr: int) -> tuple[float, float]:
        return bucket_channel(self.buckets, prr, irr)[0], 1 / self.buckets

    def report_epsilon_of(self, prr: int, irr: int) -> float:
        return log_ratio(*bucket_channel(self.buckets, prr, irr))

    def hash(self, function: int, index: int) -> int:
        """``h_a(x)``: the bucket of category ``index`` under hash function ``function``."""
        g, total = self.buckets, 0
        for _ in range(self.digits):
            total += (function % g) * (index % g)
            function, index = function // g, index // g
        return total % g
