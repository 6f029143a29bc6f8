"""What the frequency oracles for categories share: a permanent and an instantaneous response.

Every oracle reports a category in two steps, as RAPPOR does for strings (the
longitudinal designs of Arcolezi et al., L-GRR and L-OSUE, generalized):

1. The **permanent response**, derived from the installation secret per (metric,
   value) and memoized: an ``epsilon``-LDP randomization of the value (GRR, OUE,
   OLH or Hadamard at ``epsilon``). However often a value is reported, the
   reports are post-processing of this one response, so they reveal at most
   ``epsilon_inf`` (the realized ``epsilon``).
2. The **instantaneous response**, fresh from the CSPRNG for every report: each
   output symbol is kept with probability ``lambda`` and otherwise replaced by a
   uniformly random one (per bit for OUE). ``lambda`` is the largest for which one
   report reveals at most ``report_epsilon`` (``epsilon_1``), so reports of one
   value differ and do not link an installation's reports to each other.

Probabilities are realized as dyadic rationals ``N / 2**32`` (as everywhere in
Veil) and rounded towards less information, so the stated epsilons, computed
from the realized probabilities, never exceed the declared ones.

The decoder of every oracle reads a *support count* per category: how many
reports are consistent with it. A report of category ``x`` supports ``x`` with
probability :attr:`OracleParams.support_probs`\\ ``[0]`` and any other category
with probability ``[1]``, independently across reports, so the share
``(support / N - q) / (p - q)`` is unbiased with the variance of
:meth:`OracleParams.share_variance`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError, WireFormatError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.category import CategoryList, check_categories
from veil.shared.privacy import format_epsilon, round_up
from veil.shared.validation import Interval, check_fields, shown_number

#: every frequency oracle of a category metric but RAPPOR, keyed by its ``oracle`` name, in
#: the order defined (``oracle = "auto"`` chooses among them)
ORACLES: FaceRegistry[type[OracleParams]] = FaceRegistry("oracle")
#: most categories an oracle metric may list
MAX_ORACLE_CATEGORIES = 65536
#: largest declared epsilon (beyond it the realized probabilities saturate at 1 - 2**-32)
MAX_ORACLE_EPSILON = 20.0
#: the checks of a mechanism's ``epsilon`` and ``report_epsilon`` (:func:`check_fields`)
EPSILON_FIELDS = {
    "epsilon": Interval(float, 0, MAX_ORACLE_EPSILON, "right"),
    "report_epsilon": Interval(float, 0, MAX_ORACLE_EPSILON, "right"),
}


def check_report_epsilon(owner: str, epsilon: float, report_epsilon: float) -> None:
    """Refuse a ``report_epsilon`` above ``epsilon``: a report is post-processing of the
    permanent response, so it can never leak more than it."""
    if report_epsilon > epsilon:
        raise ParameterError(
            "report_epsilon",
            f"The 'report_epsilon' parameter of {owner} must be at most epsilon="
            f"{epsilon!r} (a report is post-processing of the permanent response). "
            f"Got {report_epsilon!r} instead.",
        )


def settle_epsilons(params: Any) -> None:
    """Give frozen ``params`` their default ``report_epsilon`` (``epsilon / 2``), then check
    both epsilons (:data:`EPSILON_FIELDS`) and that a report leaks no more than the value
    (:func:`check_report_epsilon`): what every mechanism declared by epsilon shares."""
    owner = type(params).__name__
    # epsilon first: halving an integer beyond the float range would overflow
    check_fields(owner, {"epsilon": params.epsilon}, {"epsilon": EPSILON_FIELDS["epsilon"]})
    if params.report_epsilon is None:
        object.__setattr__(params, "report_epsilon", params.epsilon / 2)
    check_fields(owner, {"epsilon": params.epsilon, "report_epsilon": params.report_epsilon},
                 EPSILON_FIELDS)
    check_report_epsilon(owner, params.epsilon, float(params.report_epsilon or 0.0))


def unrealizable_epsilon(owner: str, epsilon: Any, least: float, over: str,
                         hint: str = "") -> ParameterError:
    """The error for an ``epsilon`` below ``least``, the smallest positive epsilon of the
    permanent response that probabilities of 32 bits realize ``over`` the mechanism's
    symbols: below it the response is uniform noise (no report would say anything about
    its value) or says more than ``epsilon``. ``hint``: what else to change."""
    return ParameterError(
        "epsilon",
        f"The 'epsilon' parameter of {owner} is below what probabilities of 32 bits can "
        f"realize{' ' + over if over else ''} (at least {format_epsilon(least, 3)}). Got "
        f"{epsilon!r} instead{': ' + hint if hint else ''}.")


def realized_numerator(owner: str, epsilon_of: Any, epsilon: float, low: int, high: int,
                       over: str) -> int:
    """The largest numerator in ``[low, high]`` whose epsilon (``epsilon_of``, non-decreasing)
    is at most ``epsilon``; :func:`unrealizable_epsilon` when even ``low`` says more, or
    when the largest says nothing (epsilon 0: the response would be uniform noise)."""
    if epsilon_of(low) > epsilon:
        raise unrealizable_epsilon(owner, epsilon, epsilon_of(low), over)
    numerator = largest_numerator(epsilon_of, epsilon, low, high)
    if not epsilon_of(numerator) > 0:
        raise unrealizable_epsilon(owner, epsilon, epsilon_of(numerator + 1), over)
    return numerator


def uninformative_report(owner: str, report_epsilon: Any, least: float, over: str) -> ParameterError:
    """The error for a ``report_epsilon`` so small that the instantaneous response keeps
    nothing (its realized numerator is 0): ``least`` is the smallest one-report epsilon
    probabilities of 32 bits realize ``over`` the mechanism's symbols."""
    return ParameterError(
        "report_epsilon",
        f"The 'report_epsilon' parameter of {owner} is below what probabilities of 32 bits can "
        f"realize {over} (at least {format_epsilon(least, 3)}): no report would say anything "
        f"about its value. Got {report_epsilon!r} instead.")


def parse_index(payload: Any, size: int, field: str) -> int:
    """A payload that must be a JSON integer in ``[0, size)``."""
    if type(payload) is not int:
        raise WireFormatError(field, f"must be an integer in [0, {size - 1}]", "wrong_type")
    if not 0 <= payload < size:
        raise WireFormatError(field, f"must be an integer in [0, {size - 1}]; got "
                                     f"{shown_number(payload)}",
                              "out_of_range")
    return payload


def log_ratio(numerator: float, denominator: float) -> float:
    """``ln(numerator / denominator)``, infinite when only the denominator is 0."""
    if denominator <= 0.0:
        return math.inf if numerator > 0.0 else 0.0
    return math.log(numerator / denominator)


def support_share_variance(p: float, q: float, share: float, reports: int) -> float:
    """Variance of the share ``(support / N - q) / (p - q)`` of a value whose true share is
    ``share`` among ``reports`` reports, when a report supports its own value with ``p`` and
    any other with ``q``: ``(s p(1-p) + (1-s) q(1-q)) / (N (p-q)^2)`` (infinite if p <= q)."""
    if not p > q:
        return math.inf
    return (share * p * (1 - p) + (1 - share) * q * (1 - q)) / (reports * (p - q) ** 2)


def largest_numerator(epsilon_of: Any, target: float, low: int, high: int) -> int:
    """The largest ``N`` in ``[low, high]`` with ``epsilon_of(N) <= target``, for an
    ``epsilon_of`` non-decreasing in ``N`` with ``epsilon_of(low) <= target`` (bisection)."""
    if epsilon_of(high) <= target:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if epsilon_of(middle) <= target:
            low = middle
        else:
            high = middle
    return low


class CountedResponses:
    """What a mechanism whose collector counts each distinct payload shares (the category
    oracles and the hashed string oracles): the ``responses`` statistic, a payload checked
    as an index into it, and the report's size on a compact wire."""

    @property
    def statistic(self) -> str:
        return "responses"

    @property
    def responses(self) -> int:
        """Number of distinct report payloads (the length of the ``responses`` statistic)."""
        raise NotImplementedError

    @property
    def report_bits(self) -> int:
        """Bits of information one report carries (its size on a compact wire)."""
        raise NotImplementedError

    @property
    def report_bytes(self) -> int:
        """:attr:`report_bits` rounded up to whole bytes."""
        return (self.report_bits + 7) // 8

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        """The payload, an index into the ``responses`` statistic (:func:`parse_index`)."""
        return parse_index(payload, self.responses, field)


@dataclasses.dataclass(frozen=True)
class OracleParams(CountedResponses, CategoryList, MechanismParams, abstract=True):
    """A category metric reported through a frequency oracle (see the module docstring).

    ``categories`` lists the values (the report of ``categories[i]`` encodes ``i``);
    ``epsilon`` bounds what all reports of one value reveal (``epsilon_inf``) and
    ``report_epsilon`` what one report reveals (``epsilon_1``, default ``epsilon / 2``).
    Defining a subclass registers it in :data:`ORACLES` too.
    """

    kind: ClassVar[str] = "category"
    default_oracle: ClassVar[str] = "rappor"
    min_wire_version: ClassVar[int] = 2
    sized_by: ClassVar[tuple[str, ...]] = ("categories",)

    categories: tuple[str, ...] = ()
    epsilon: float = 2.0
    report_epsilon: float | None = None

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(abstract=abstract, **kwargs)
        if not abstract:
            ORACLES.add(cls.oracle, cls)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "categories", check_categories(owner, self.categories, 2,
                                                                MAX_ORACLE_CATEGORIES))
        settle_epsilons(self)
        self._check()
        # realizes the probabilities: refuses an epsilon too small, then a report_epsilon
        if self.irr_numerator == 0:
            raise uninformative_report(owner, self.report_epsilon,
                                       self.report_epsilon_of(self.prr_numerator, 1),
                                       f"over {self.d} categories with epsilon={self.epsilon!r}")

    def _check(self) -> None:
        """Oracle-specific checks (none by default)."""

    @property
    def d(self) -> int:
        """Number of categories."""
        return len(self.categories)

    # --- the two responses, as 32-bit numerators ------------------------------------

    def prr_epsilon(self, numerator: int) -> float:
        """Epsilon of the permanent response with PRR numerator ``numerator`` (non-decreasing)."""
        raise NotImplementedError

    def prr_range(self) -> tuple[int, int]:
        """Numerators of the permanent response from no information to the most."""
        raise NotImplementedError

    def report_probs(self, prr: int, irr: int) -> tuple[float, float]:
        """``(p, q)``: probabilities that one report supports its own / another category."""
        raise NotImplementedError

    def report_epsilon_of(self, prr: int, irr: int) -> float:
        """Epsilon of one report (both responses) for the given numerators."""
        raise NotImplementedError

    @functools.cached_property
    def prr_numerator(self) -> int:
        """The permanent response's numerator: the most information within ``epsilon``."""
        low, high = self.prr_range()
        return realized_numerator(type(self).__name__, self.prr_epsilon, self.epsilon, low, high,
                                  f"over {self.d} categories")

    @functools.cached_property
    def irr_numerator(self) -> int:
        """``lambda * 2**32``: the largest keep probability within ``report_epsilon``."""
        prr = self.prr_numerator
        return largest_numerator(
            lambda irr: self.report_epsilon_of(prr, irr), float(self.report_epsilon or 0.0),
            0, PROB_ONE)

    @property
    def keep(self) -> float:
        """``lambda``: the realized probability that a report keeps the permanent symbol."""
        return self.irr_numerator / PROB_ONE

    @property
    def support_probs(self) -> tuple[float, float]:
        """``(p, q)`` of the realized responses (see the module docstring)."""
        return self.report_probs(self.prr_numerator, self.irr_numerator)

    @property
    def epsilon_inf(self) -> float:
        return round_up(self.prr_epsilon(self.prr_numerator))

    @property
    def epsilon_1(self) -> float:
        return round_up(self.report_epsilon_of(self.prr_numerator, self.irr_numerator))

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """Variance of the estimated share of a category whose true share is ``share``
        among ``reports`` reports (:func:`support_share_variance`)."""
        return support_share_variance(*self.support_probs, share, reports)

    # --- what the collector keeps and what a report costs ----------------------------

    @property
    def report_bits(self) -> int:
        return max(1, (self.responses - 1).bit_length())
