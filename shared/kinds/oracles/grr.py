"""Generalized randomized response (direct encoding) with memoization: L-GRR.

Permanent response: the category itself with probability ``a``, otherwise one of
the other ``d - 1`` uniformly (``a = e^epsilon / (e^epsilon + d - 1)``, realized).
Instantaneous response: the permanent category with probability ``lambda``,
otherwise a uniformly random category (any of the ``d``). The payload is the
reported category's index; a report supports only the category it names.
Wang et al. (2017): GRR has the lowest variance of the oracles while
``d < 3 e^epsilon + 2``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from veil.shared.bits import PROB_ONE
from veil.shared.kinds.oracles.base import OracleParams, log_ratio


@dataclasses.dataclass(frozen=True)
class GrrParams(OracleParams):
    """GRR over the ``d`` categories; payload: the reported category's index."""

    oracle: ClassVar[str] = "grr"

    def prr_range(self) -> tuple[int, int]:
        return -(-PROB_ONE // self.d), PROB_ONE - 1

    def prr_epsilon(self, numerator: int) -> float:
        a = numerator / PROB_ONE
        return log_ratio(a * (self.d - 1), 1 - a)

    def channel(self, prr: int, irr: int) -> tuple[float, float]:
        """``(P(report = x | x), P(report = y | x))`` for any ``y != x``."""
        a, keep, d = prr / PROB_ONE, irr / PROB_ONE, self.d
        return a * keep + (1 - keep) / d, (1 - a) / (d - 1) * keep + (1 - keep) / d

    def report_probs(self, prr: int, irr: int) -> tuple[float, float]:
        return self.channel(prr, irr)

    def report_epsilon_of(self, prr: int, irr: int) -> float:
        own, other = self.channel(prr, irr)
        return log_ratio(own, other)

    @property
    def responses(self) -> int:
        return self.d
