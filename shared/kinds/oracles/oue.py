"""Optimized unary encoding with memoization and a symmetric instantaneous response: L-OSUE.

Permanent response: one bit per category; the category's own bit is 1 with
probability 1/2, every other bit with probability ``c = 1 / (e^epsilon + 1)``
(realized), each bit drawn independently (Wang et al.'s OUE).
Instantaneous response: each bit is kept with probability ``lambda`` and
otherwise replaced by a fair coin, i.e. reported as 1 with probability
``(1 + lambda) / 2`` if its permanent bit is 1 and ``(1 - lambda) / 2`` if 0
(Arcolezi et al.'s L-OSUE). A report supports the categories whose bit is 1;
it supports its own with probability exactly 1/2, so one report is OUE at
``epsilon_1 = ln((1 - q) / q)``. The payload is the ``d`` bits as hex.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from veil.shared.bits import PROB_ONE, hex_to_bits
from veil.shared.kinds.oracles.base import OracleParams, log_ratio

HALF = PROB_ONE // 2


@dataclasses.dataclass(frozen=True)
class OueParams(OracleParams):
    """OUE over the ``d`` categories; payload: ``d`` bits, hex (bit ``i`` is category ``i``).

    The permanent numerator is ``2**32 - c * 2**32`` (more means less noise); the
    instantaneous numerator is ``lambda * 2**32``.
    """

    oracle: ClassVar[str] = "oue"

    @property
    def k(self) -> int:
        """Report length in bits: one per category."""
        return self.d

    @property
    def statistic(self) -> str:
        return "bits"

    @property
    def responses(self) -> int:
        return 1 << self.d

    @property
    def report_bits(self) -> int:
        return self.d

    def prr_range(self) -> tuple[int, int]:
        return HALF, PROB_ONE - 1

    def other_numerator(self, prr: int) -> int:
        """Numerator of ``c``, the probability that another category's permanent bit is 1."""
        return PROB_ONE - prr

    def prr_epsilon(self, numerator: int) -> float:
        c = self.other_numerator(numerator) / PROB_ONE
        return log_ratio(1 - c, c)

    @property
    def keep(self) -> float:
        """``lambda``: the realized probability that a bit keeps its permanent value."""
        zero, one = self.irr_thresholds(self.irr_numerator)
        return (one - zero) / PROB_ONE

    def irr_thresholds(self, irr: int) -> tuple[int, int]:
        """Numerators of ``P(report 1 | permanent 0)`` and ``P(report 1 | permanent 1)``."""
        flip = (PROB_ONE - irr) // 2
        return flip, PROB_ONE - flip

    def report_probs(self, prr: int, irr: int) -> tuple[float, float]:
        zero, one = (t / PROB_ONE for t in self.irr_thresholds(irr))
        c = self.other_numerator(prr) / PROB_ONE
        return (one + zero) / 2, c * one + (1 - c) * zero

    def report_epsilon_of(self, prr: int, irr: int) -> float:
        p, q = self.report_probs(prr, irr)
        return log_ratio(p, q) + log_ratio(1 - q, 1 - p)

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        return hex_to_bits(payload, self.d, field)
