"""Strings over an open dictionary through hashed frequency oracles: fast local hashing
(FLH; Cormode, Maddock and Maple, PVLDB 2021) and Apple's Hadamard count-mean sketch
(HCMS; "Learning with Privacy at Scale", 2017).

A string metric names its ``oracle``: ``rappor`` (the default, Bloom-filter RAPPOR,
:class:`~veil.shared.kinds.string.StringParams`), ``flh``, ``hcms``, or ``auto``
(:func:`choose_string_oracle`). No candidate list lives on the device: the value is
hashed, and the collector decodes any list of candidates later.

**The pool of hash functions is the cohort.** Both oracles hash with one function of
a fixed pool, ``h_j`` for ``j`` in ``[0, cohorts)``, and an installation uses the
function of its cohort (derived from its secret, as RAPPOR's cohorts are). The
function is therefore fixed per installation, not drawn per report: a fresh function
per report would need a permanent response per (value, function), and an observer of
many reports would collect up to ``cohorts`` independent randomizations of one value,
voiding ``epsilon_inf``. Fixed, it is independent of every value and the permanent
response stays the one memoized randomization of the value's bucket. The reports
carry the function as their ``cohort``, so the collector's statistic is the counts per
(cohort, payload): storage, counts documents and archives handle it unchanged.

**Hashing** (:func:`value_key`, :func:`bucket`): a value's key is ``u =
mmh3_x64_128(utf8(value), seed 0)``'s first 64-bit half (unsigned); function ``j``
has the odd multiplier ``a_j = splitmix64(2 j) | 1`` and the offset ``b_j =
splitmix64(2 j + 1)``; the bucket among ``n`` is ``(((a_j u + b_j) mod 2**64) >> 32)
* n >> 32`` (multiply-add-shift, then Lemire's range reduction). The decoder computes
the same in NumPy for every (candidate, function) at once.

**Two responses**, as every memoized oracle in Veil (:mod:`veil.shared.kinds.oracles`):

* FLH: permanent, the bucket ``h_j(x)`` among ``g`` through generalized randomized
  response at ``epsilon`` (kept with probability ``a``, else one of the other ``g - 1``
  uniformly); instantaneous, kept with probability ``lambda``, else a uniform bucket.
  Payload: the bucket. ``g`` defaults to :func:`best_buckets` (at most OLH's optimum
  ``round(e^epsilon + 1)``: the smallest within 1% of the lowest variance).
* HCMS: permanent, a coefficient ``l`` uniform in ``[0, m)`` and the bit
  ``parity(l & h_j(x))`` (the sign of the Hadamard entry ``H[l, h_j(x)]``) kept with
  probability ``a = e^epsilon / (e^epsilon + 1)``, else flipped; instantaneous, the bit
  kept with probability ``lambda``, else a fair coin. Payload: ``2 l + bit``.

Probabilities are realized as ``N / 2**32`` and rounded towards less information, so
the stated epsilons (from the realized numerators) never exceed the declared ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import mmh3

from veil.shared.bits import PROB_ONE
from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.oracles.base import (
    CountedResponses,
    largest_numerator,
    log_ratio,
    settle_epsilons,
    uninformative_report,
    unrealizable_epsilon,
)
from veil.shared.kinds.oracles.olh import (
    bucket_channel,
    bucket_prr_epsilon,
    numerators,
    zero_share_variance,
)
from veil.shared.privacy import round_up
from veil.shared.validation import Interval, check_fields

MASK64 = (1 << 64) - 1
#: most hash functions (cohorts) a string oracle may use, as for RAPPOR's cohorts
MAX_FUNCTIONS = 65536
#: most buckets (FLH) or sketch columns (HCMS)
MAX_BUCKETS = 4096
#: cells (functions x buckets) the defaults aim for: enough that collisions between the
#: candidates in one function cost the decoder little (docs/strings.md), few enough that
#: one report adds to one small counter row
DEFAULT_CELLS = 1 << 16
#: the largest number of bits a report (cohort and payload) may take on the wire for ``auto``
DEFAULT_MAX_REPORT_BITS = 32
#: bits of a Bloom-filter RAPPOR report at the default k (its cohort aside)
RAPPOR_REPORT_BITS = 128
#: every string oracle but RAPPOR, keyed by its ``oracle`` name, in the order defined
STRING_ORACLES: FaceRegistry[type[StringOracleParams]] = FaceRegistry("string oracle")


def splitmix64(x: int) -> int:
    """SplitMix64's output for state ``x`` (Steele, Lea and Flood, 2014)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=MAX_FUNCTIONS)
def function_key(j: int) -> tuple[int, int]:
    """``(a_j, b_j)``: the odd multiplier and the offset of hash function ``j``."""
    return splitmix64(2 * j) | 1, splitmix64(2 * j + 1)


def value_key(data: bytes) -> int:
    """``u``: the 64-bit key of a value's UTF-8 bytes (the first half of mmh3 x64 128)."""
    return mmh3.hash64(data, 0, True, signed=False)[0]


def bucket(j: int, u: int, n: int) -> int:
    """The bucket in ``[0, n)`` of key ``u`` under hash function ``j``."""
    a, b = function_key(j)
    return ((((a * u + b) & MASK64) >> 32) * n) >> 32


@dataclasses.dataclass(frozen=True)
class StringOracleParams(CountedResponses, MechanismParams, abstract=True):
    """A string metric through a hashed oracle: ``epsilon`` bounds every report of a value
    (``epsilon_inf``), ``report_epsilon`` one report (``epsilon_1``, default half);
    ``functions`` hash functions, one per cohort. Defining a subclass registers it in
    :data:`STRING_ORACLES`."""

    kind: ClassVar[str] = "string"

    @property
    def possible_values(self) -> tuple[int | None, str]:
        return None, "strings"
    default_oracle: ClassVar[str] = "rappor"
    min_wire_version: ClassVar[int] = 2
    has_cohorts: ClassVar[bool] = True

    epsilon: float = 2.0
    report_epsilon: float | None = None

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(abstract=abstract, **kwargs)
        if not abstract:
            STRING_ORACLES.add(cls.oracle, cls)

    def _check_epsilons(self) -> None:
        settle_epsilons(self)

    def _check_report_epsilon(self) -> None:
        """Refuse a ``report_epsilon`` whose realized instantaneous response keeps nothing."""
        if self.irr_numerator == 0:
            raise uninformative_report(
                type(self).__name__, self.report_epsilon, self.least_report_epsilon,
                f"with {self.buckets} buckets and epsilon={self.epsilon!r}")

    @property
    def least_report_epsilon(self) -> float:
        """The one-report epsilon of the least informative instantaneous response that still
        says something (numerator 1)."""
        raise NotImplementedError

    @property
    def hash_functions(self) -> int:
        """How many hash functions (cohorts) the pool holds."""
        raise NotImplementedError

    @property
    def buckets(self) -> int:
        """The range of each hash function (FLH's ``g``, HCMS's ``m``)."""
        raise NotImplementedError

    @property
    def cohorts(self) -> int:
        return self.hash_functions

    @property
    def prr_numerator(self) -> int:
        """``N_prr``: the permanent response keeps the value's own symbol when a uniform
        32-bit word is below it."""
        raise NotImplementedError

    @property
    def irr_numerator(self) -> int:
        """``N_irr``: a report keeps the permanent response when a uniform 32-bit word is
        below it."""
        raise NotImplementedError

    @property
    def report_bits(self) -> int:
        """Bits a report carries on a compact wire: its cohort and its payload."""
        return (self.hash_functions - 1).bit_length() + (self.responses - 1).bit_length()

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """Variance of a candidate's estimated share (true share ``share``) among ``reports``
        reports, for a pool without collisions among the candidates."""
        raise NotImplementedError

    def decode_variance(self, candidates: int, reports: int = 1) -> float:
        """:meth:`share_variance` of an absent candidate when ``candidates`` are decoded
        together: the decoder removes the collisions between them (docs/strings.md), which
        multiplies the variance by ``1 / (1 - candidates / (cells (1 - 1/buckets)))``
        (infinite when the candidates outnumber the cells)."""
        cells = self.hash_functions * self.buckets * (1 - 1 / self.buckets)
        share = max(candidates - 1, 0) / cells
        return self.share_variance(0.0, reports) / (1 - share) if share < 1 else math.inf


def _count(owner: str, name: str, value: Any, low: int, high: int) -> int:
    check_fields(owner, {name: value}, {name: Interval(int, low, high)})
    return int(value)


@functools.lru_cache(maxsize=256)
def best_buckets(epsilon: float, report_epsilon: float) -> int:
    """FLH's default ``g``: near ``e^epsilon + 1`` (OLH's optimum for one report), the
    smallest ``g`` whose variance is within 1% of the lowest on a grid up to it (a report
    with instantaneous noise, ``report_epsilon < epsilon``, gains little from more buckets,
    and fewer buckets leave room for more hash functions)."""
    upper = min(MAX_BUCKETS, max(2, round(math.exp(epsilon) + 1)))
    grid = sorted({max(2, round(v)) for v in
                   (2 * (upper / 2) ** (i / 47) for i in range(48))} | {upper})
    # an absent value's variance per report: OLH's, the same two-step channel over g
    variances = {g: zero_share_variance(g, epsilon, report_epsilon) for g in grid}
    lowest = min(variances.values())
    return min(g for g, v in variances.items() if v <= 1.01 * lowest)


@dataclasses.dataclass(frozen=True)
class FlhParams(StringOracleParams):
    """Fast local hashing: ``g`` buckets (default :func:`best_buckets`), ``functions``
    hash functions (default ``2**16 // g``); payload: the reported bucket."""

    oracle: ClassVar[str] = "flh"
    sized_by: ClassVar[tuple[str, ...]] = ("functions", "g")

    g: int | None = None
    functions: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        self._check_epsilons()
        if self.g is None:
            object.__setattr__(self, "g", best_buckets(self.epsilon, float(self.report_epsilon or 0)))
        g = _count(owner, "g", self.g, 2, MAX_BUCKETS)
        if self.functions is None:
            object.__setattr__(self, "functions", max(1, min(MAX_FUNCTIONS, DEFAULT_CELLS // g)))
        _count(owner, "functions", self.functions, 1, MAX_FUNCTIONS)
        said = bucket_prr_epsilon(g, self.prr_numerator)
        if said > self.epsilon:  # even the least informative numerator says more
            raise unrealizable_epsilon(owner, self.epsilon, said, f"with g={g} buckets",
                                       "raise epsilon, or leave g out (a smaller g realizes "
                                       "smaller epsilons)")
        if not said > 0:  # a uniform permanent response: no report would say anything
            raise unrealizable_epsilon(owner, self.epsilon,
                                       bucket_prr_epsilon(g, self.prr_numerator + 1),
                                       f"with g={g} buckets", "raise epsilon")
        self._check_report_epsilon()

    @property
    def hash_functions(self) -> int:
        assert self.functions is not None
        return self.functions

    @property
    def buckets(self) -> int:
        assert self.g is not None
        return self.g

    @property
    def responses(self) -> int:
        return self.buckets

    @functools.cached_property
    def numerators(self) -> tuple[int, int]:
        """The permanent (GRR over ``g``) and instantaneous numerators."""
        return numerators(self.buckets, self.epsilon, float(self.report_epsilon or 0.0))

    @property
    def prr_numerator(self) -> int:
        return self.numerators[0]

    @property
    def irr_numerator(self) -> int:
        return self.numerators[1]

    @property
    def least_report_epsilon(self) -> float:
        return log_ratio(*bucket_channel(self.buckets, self.prr_numerator, 1))

    @property
    def bucket_probs(self) -> tuple[float, float]:
        """``(P1, P0)``: one report names its value's bucket / one given other bucket."""
        return bucket_channel(self.buckets, *self.numerators)

    @property
    def epsilon_inf(self) -> float:
        return round_up(bucket_prr_epsilon(self.buckets, self.prr_numerator))

    @property
    def epsilon_1(self) -> float:
        return round_up(log_ratio(*self.bucket_probs))

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """``rho (1 - rho) / (N (P1 - 1/g)^2)`` with ``rho = s P1 + (1 - s) / g`` (OLH's)."""
        p1, _ = self.bucket_probs
        g = self.buckets
        rho = share * p1 + (1 - share) / g
        if not p1 > 1 / g:
            return math.inf
        return rho * (1 - rho) / (reports * (p1 - 1 / g) ** 2)


@dataclasses.dataclass(frozen=True)
class HcmsParams(StringOracleParams):
    """Hadamard count-mean sketch: ``rows`` hash functions (cohorts) of ``columns`` (a power
    of two) each; payload ``2 l + bit`` for the coefficient ``l`` and the reported bit."""

    oracle: ClassVar[str] = "hcms"
    sized_by: ClassVar[tuple[str, ...]] = ("rows", "columns")

    rows: int = 4096
    columns: int = 16

    def __post_init__(self) -> None:
        owner = type(self).__name__
        self._check_epsilons()
        _count(owner, "rows", self.rows, 1, MAX_FUNCTIONS)
        columns = _count(owner, "columns", self.columns, 2, MAX_BUCKETS)
        if columns & (columns - 1):
            raise ParameterError(
                "columns", f"The 'columns' parameter of {owner} must be a power of two (the "
                           f"Hadamard transform's size). Got {columns!r} instead.")
        if self.prr_numerator == PROB_ONE // 2:  # a fair coin: the bit says nothing
            raise unrealizable_epsilon(owner, self.epsilon,
                                       self._keep_epsilon(PROB_ONE // 2 + 1), "")
        self._check_report_epsilon()

    @property
    def hash_functions(self) -> int:
        return self.rows

    @property
    def buckets(self) -> int:
        return self.columns

    @property
    def responses(self) -> int:
        return 2 * self.columns

    @functools.cached_property
    def prr_numerator(self) -> int:
        """``a * 2**32``: the largest probability of keeping the bit within ``epsilon``."""
        return largest_numerator(self._keep_epsilon, self.epsilon, PROB_ONE // 2, PROB_ONE - 1)

    @functools.cached_property
    def irr_numerator(self) -> int:
        """``lambda * 2**32``: the largest keep probability within ``report_epsilon``."""
        a = self.prr_numerator / PROB_ONE
        return largest_numerator(
            lambda keep: self._keep_epsilon_of(a * keep / PROB_ONE + (1 - keep / PROB_ONE) / 2),
            float(self.report_epsilon or 0.0), 0, PROB_ONE)

    @property
    def least_report_epsilon(self) -> float:
        a = self.prr_numerator / PROB_ONE
        return self._keep_epsilon_of(a / PROB_ONE + (1 - 1 / PROB_ONE) / 2)

    @staticmethod
    def _keep_epsilon_of(p: float) -> float:
        return log_ratio(p, 1 - p)

    def _keep_epsilon(self, numerator: int) -> float:
        return self._keep_epsilon_of(numerator / PROB_ONE)

    @property
    def bit_kept(self) -> float:
        """``P``: the probability that a report's bit is its value's Hadamard sign."""
        a, keep = self.prr_numerator / PROB_ONE, self.irr_numerator / PROB_ONE
        return a * keep + (1 - keep) / 2

    @property
    def epsilon_inf(self) -> float:
        return round_up(self._keep_epsilon(self.prr_numerator))

    @property
    def epsilon_1(self) -> float:
        return round_up(self._keep_epsilon_of(self.bit_kept))

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """``(1 / (2P - 1)^2 - rho^2) / (N (1 - 1/m)^2)``, ``rho = s + (1 - s) / m``."""
        scale = 2 * self.bit_kept - 1
        m = self.columns
        if not scale > 0:
            return math.inf
        rho = share + (1 - share) / m
        return (1 / scale**2 - rho**2) / (reports * (1 - 1 / m) ** 2)


def choose_string_oracle(settings: Mapping[str, Any]) -> tuple[StringOracleParams, str]:
    """``oracle = "auto"`` for a string metric: the registered string oracle of lowest
    :meth:`~StringOracleParams.decode_variance` at ``epsilon`` (and ``report_epsilon``) for
    ``expected_candidates`` candidates (default 1000) whose reports fit ``max_report_bits``
    (default 32; Bloom-filter RAPPOR's reports take ``k`` bits, 128 by default, and do not),
    with a sentence saying why."""
    allowed = {"epsilon", "report_epsilon", "expected_candidates", "max_report_bits"}
    reject = sorted(set(settings) - allowed)
    if reject:
        raise ParameterError(reject[0], "oracle = 'auto' of a string metric takes epsilon, "
                                        "report_epsilon, expected_candidates and max_report_bits; "
                                        f"not {reject[0]!r}")
    if "epsilon" not in settings:
        raise ParameterError("epsilon", "oracle = 'auto' needs the epsilon to choose for")
    candidates = _count("auto", "expected_candidates", settings.get("expected_candidates", 1000),
                        1, 1 << 30)
    cap = _count("auto", "max_report_bits",
                 settings.get("max_report_bits", DEFAULT_MAX_REPORT_BITS), 1, 1 << 20)
    built = [cls(epsilon=settings["epsilon"], report_epsilon=settings.get("report_epsilon"))
             for cls in STRING_ORACLES.values()]
    fitting = [p for p in built if p.report_bits <= cap]
    if not fitting:
        smallest = min(built, key=lambda p: p.report_bits)
        raise ParameterError("max_report_bits", f"no string oracle fits reports of {cap} bits; "
                                                f"the smallest is {smallest.oracle} at "
                                                f"{smallest.report_bits}")
    chosen = min(fitting, key=lambda p: (p.decode_variance(candidates), p.report_bits))
    others = "; ".join(f"{p.oracle} {p.decode_variance(candidates):.4g}"
                       + ("" if p in fitting else f" ({p.report_bits}-bit reports, over the cap)")
                       for p in built if p is not chosen)
    why = (f"auto chose {chosen.oracle}: share variance {chosen.decode_variance(candidates):.4g}/N "
           f"over {candidates} candidates with {chosen.report_bits}-bit reports at epsilon "
           f"{chosen.epsilon:g} (one report {chosen.report_epsilon:g}); others: {others}")
    if cap < RAPPOR_REPORT_BITS:
        why += f"; rappor's {RAPPOR_REPORT_BITS}-bit reports exceed the {cap}-bit cap"
    return chosen, why
