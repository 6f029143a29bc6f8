"""Hadamard response (Acharya, Sun and Zhang 2019) with memoization.

With ``K`` the least power of two above ``d``, category ``x`` owns row ``x + 1``
of the ``K x K`` Sylvester-Hadamard matrix, whose +1 entries form the set
``C_x = {y : popcount((x + 1) & y) even}`` of ``K / 2`` responses; any two such
sets share exactly ``K / 4`` responses.

Permanent response (memoized per value): a uniform response in ``C_x`` with
probability ``a = e^epsilon / (e^epsilon + 1)`` (realized), otherwise a uniform
response outside it. Instantaneous response: kept with probability ``lambda``,
otherwise a uniform response in ``[0, K)``. Payload: the response, an integer
of ``log2(K)`` bits. A report supports the categories whose set holds it: its
own with probability ``p = a lambda + (1 - lambda) / 2``, any other with
probability exactly 1/2. The decoder counts support for every category at once
with a fast Walsh-Hadamard transform of the response counts.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from veil.shared.bits import PROB_ONE
from veil.shared.kinds.oracles.base import OracleParams, log_ratio


@dataclasses.dataclass(frozen=True)
class HadamardParams(OracleParams):
    """Hadamard response over the ``d`` categories; payload: a response in ``[0, K)``."""

    oracle: ClassVar[str] = "hadamard"

    @property
    def size(self) -> int:
        """``K``: the least power of two greater than ``d``."""
        return 1 << self.d.bit_length()

    @property
    def responses(self) -> int:
        return self.size

    def prr_range(self) -> tuple[int, int]:
        return PROB_ONE // 2, PROB_ONE - 1

    def prr_epsilon(self, numerator: int) -> float:
        a = numerator / PROB_ONE
        return log_ratio(a, 1 - a)

    def response_probs(self, prr: int, irr: int) -> tuple[float, float]:
        """``K`` times the probability of one response inside / outside the value's set."""
        a, keep = prr / PROB_ONE, irr / PROB_ONE
        return 2 * a * keep + (1 - keep), 2 * (1 - a) * keep + (1 - keep)

    def report_probs(self, prr: int, irr: int) -> tuple[float, float]:
        a, keep = prr / PROB_ONE, irr / PROB_ONE
        return a * keep + (1 - keep) / 2, 0.5

    def report_epsilon_of(self, prr: int, irr: int) -> float:
        return log_ratio(*self.response_probs(prr, irr))

    @staticmethod
    def supports(index: int, response: int) -> bool:
        """Whether ``response`` lies in the set of category ``index``."""
        return (((index + 1) & response).bit_count() & 1) == 0
