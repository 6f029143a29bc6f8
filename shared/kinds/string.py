"""Strings over an open dictionary: Bloom-filter RAPPOR (Erlingsson et al., 2014)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from veil.shared.bits import PROB_ONE, hex_to_bits, realize, realized
from veil.shared.errors import ParameterError, WireFormatError
from veil.shared.hashing import HASHINGS, MD5_MAX_H, MD5_MAX_K
from veil.shared.kinds.base import MechanismParams
from veil.shared.privacy import (
    f_for_epsilon_inf,
    q_for_epsilon_1,
    rappor_effective_probs,
    rappor_epsilon_1,
    rappor_epsilon_inf,
)
from veil.shared.validation import Interval, OneOf, check_fields, shown_number

MAX_K = 65536
MAX_H = 64
MAX_M = 65536
#: privacy targets a string metric's settings may give instead of ``q`` and ``f``
EPSILON_TARGETS = ("epsilon_inf", "epsilon_1")
#: the largest target accepted (any epsilon_inf beyond about 46 h realizes the same f)
MAX_EPSILON_TARGET = 1e300

RAPPOR_CONSTRAINTS = {
    "p": Interval(float, 0, 1),
    "q": Interval(float, 0, 1),
    "f": Interval(float, 0, 1),
}


def check_rappor_probs(owner: str, p: float, q: float) -> None:
    """RAPPOR needs ``p < q``: a reported 1 must be likelier when the bit is set, as the
    probabilities are declared and as they are realized (``N / 2**32``)."""
    if not p < q:
        raise ParameterError(
            "q", f"The 'q' parameter of {owner} must be greater than p={p!r}. Got {q!r} instead."
        )
    if not realize(p) < realize(q):
        raise ParameterError(
            "q", f"The 'q' parameter of {owner} must be greater than p={p!r} as realized (N / "
                 f"2**32, N = round(x * 2**32)): both are realized as {realized(p)!r}, which "
                 f"says nothing; q must be at least {(realize(p) + 1) / PROB_ONE!r} (p + "
                 f"2**-32). Got {q!r} instead.")


class RapporBits:
    """RAPPOR's probabilities and privacy math, for kinds whose reports are bit vectors
    with :attr:`hashes` bits set per value before the permanent and instantaneous responses."""

    p: float
    q: float
    f: float

    @property
    def hashes(self) -> int:
        """Bits a value sets before randomization (``h`` for strings, 1 for categories)."""
        raise NotImplementedError

    @property
    def statistic(self) -> str:
        return "bits"

    @property
    def effective_probs(self) -> tuple[float, float]:
        """``(p*, q*)`` of the combined PRR and IRR for the realized probabilities."""
        return rappor_effective_probs(realized(self.p), realized(self.q), realized(self.f))

    def check_informative(self, source: str = "", about: str = "the values") -> None:
        """:class:`ParameterError` (field ``f``) for parameters whose reported bits are coin
        flips (``p* = q*``, as with ``f = 1``): their reports say nothing about ``about``
        (``source``: the file they were read from, for the message). Decoders call it."""
        p_star, q_star = self.effective_probs
        if not q_star > p_star:
            raise ParameterError("f", (
                f"{source}{': ' if source else ''}with f={self.f} every reported bit is a coin "
                f"flip (p* = q* = {p_star:.4g}): the reports carry no information about "
                f"{about}; use f < 1"))

    @property
    def epsilon_1(self) -> float:
        return rappor_epsilon_1(self.hashes, realized(self.p), realized(self.q), realized(self.f))

    @property
    def epsilon_inf(self) -> float:
        return rappor_epsilon_inf(self.hashes, realized(self.f))

    @functools.cached_property
    def _ones_bounds(self) -> tuple[int, int | None]:
        """The fewest and most bits a report can set: at most :attr:`hashes` where a bit no
        value sets never reads 1 (``p* = 0``), at least one where a value's own bits always
        read 1 (``q* = 1``); any number (``None``: up to ``k``) whenever ``0 < p* <= q* < 1``."""
        p_star, q_star = self.effective_probs
        return (1 if q_star == 1.0 else 0), (self.hashes if p_star == 0.0 else None)

    def parse_bits(self, payload: Any, k: int, field: str) -> int:
        """A wire payload of ``k`` bits that these parameters can produce (see
        :attr:`_ones_bounds`); :class:`WireFormatError` otherwise."""
        bits = hex_to_bits(payload, k, field)
        fewest, most = self._ones_bounds
        if fewest or most is not None:
            ones = bits.bit_count()
            if most is not None and ones > most:
                raise WireFormatError(field, f"sets {ones} bits, but with p* = 0 (p = {self.p:g}, "
                                             f"f = {self.f:g}) a report sets at most {most}",
                                      "out_of_range")
            if ones < fewest:
                raise WireFormatError(field, f"sets no bit, but with q* = 1 (q = {self.q:g}, "
                                             f"f = {self.f:g}) a value's own bits always read 1",
                                      "out_of_range")
        return bits


@dataclasses.dataclass(frozen=True)
class StringParams(RapporBits, MechanismParams):
    """Bloom-filter RAPPOR: ``k`` bits, ``h`` hashes, ``m`` cohorts, IRR ``p``/``q``, PRR ``f``,
    values hashed by ``hashing`` (:data:`~veil.shared.hashing.HASHINGS`).

    Defaults are the RAPPOR paper's: 128 bits, 2 hashes, 64 cohorts, p=0.5,
    q=0.75, f=0.5 (epsilon_inf = 4 ln 3, about 4.39; epsilon_1 about 1.07), hashed
    with mmh3. ``hashing="md5-google"`` hashes like google/rappor's clients and
    needs ``h <= 16`` and ``k <= 256``.
    """

    kind: ClassVar[str] = "string"
    #: the other oracles a string metric may name live in :mod:`veil.shared.kinds.string_oracles`
    oracle: ClassVar[str] = "rappor"
    default_oracle: ClassVar[str] = "rappor"
    has_cohorts: ClassVar[bool] = True
    omitted_when_default: ClassVar[frozenset[str]] = frozenset({"hashing"})
    sized_by: ClassVar[tuple[str, ...]] = ("m", "k")

    k: int = 128
    h: int = 2
    m: int = 64
    p: float = 0.5
    q: float = 0.75
    f: float = 0.5
    hashing: str = "mmh3"

    @property
    def possible_values(self) -> tuple[int | None, str]:
        return None, "strings"

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_fields(
            owner,
            dataclasses.asdict(self),
            {
                "k": Interval(int, 1, MAX_K),
                "h": Interval(int, 1, MAX_H),
                "m": Interval(int, 1, MAX_M),
                **RAPPOR_CONSTRAINTS,
                "hashing": OneOf(HASHINGS),
            },
        )
        check_rappor_probs(owner, self.p, self.q)
        if self.hashing == "md5-google":
            for name, value, high, why in [
                ("h", self.h, MD5_MAX_H, "an MD5 digest has 16 bytes, one per hash"),
                ("k", self.k, MD5_MAX_K, "a digest byte reaches bits 0..255 only"),
            ]:
                if value > high:
                    raise ParameterError(
                        name,
                        f"The {name!r} parameter of {owner} must be at most {high} with "
                        f"hashing='md5-google' ({why}). Got {value!r} instead.",
                    )

    @property
    def cohorts(self) -> int:
        return self.m

    @property
    def hashes(self) -> int:
        return self.h

    @property
    def bits_per_value(self) -> float:
        """The distinct Bloom bits a value sets on average over hashing: ``k (1 - (1 -
        1/k)^h)`` (its h hashes may fall on the same bit)."""
        return self.k * (1 - (1 - 1 / self.k) ** self.h)

    def as_rappor(self) -> StringParams:
        return self

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        return self.parse_bits(payload, self.k, field)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> tuple[StringParams, str]:
        """Parameters from a registry's settings, which may give privacy targets
        (:data:`EPSILON_TARGETS`) instead of ``q`` and ``f``: then the ``q`` and ``f`` that
        :meth:`for_epsilon` chooses, and a note saying so ("" without targets)."""
        settings = dict(settings)
        targets = {key: settings.pop(key) for key in EPSILON_TARGETS if key in settings}
        if not targets:
            return cast(StringParams, cls.from_dict(settings)), ""
        for key, value in targets.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0 < value <= MAX_EPSILON_TARGET
            ):
                raise ParameterError(key, f"{key} must be a number above 0, at most "
                                          f"{MAX_EPSILON_TARGET:g}. Got {shown_number(value)} "
                                          "instead.")
        if "epsilon_inf" not in targets:
            raise ParameterError("epsilon_1", "epsilon_1 needs epsilon_inf too: give both "
                                              "(or p, q and f instead)")
        clash = sorted({"q", "f"} & set(settings))
        if clash:
            raise ParameterError(clash[0], f"give epsilon_inf (and epsilon_1) or {clash[0]}, not "
                                           "both: the targets choose q and f")
        # checks k, h, m, p and hashing (q = 1 leaves p the most room: the targets choose q)
        try:
            base = cast(StringParams, cls.from_dict({**settings, "q": 1.0}))
        except ParameterError as exc:
            if exc.field != "q":  # the q given here: only p can leave it no room
                raise
            raise ParameterError("p", f"p = {shown_number(settings.get('p'))} leaves no q above "
                                      "it on the encoders' grid of N / 2**32, and the targets "
                                      "choose q above p: lower p") from None
        chosen = cls.for_epsilon(targets["epsilon_inf"], targets.get("epsilon_1"),
                                 k=base.k, h=base.h, m=base.m, p=base.p)
        asked = ", ".join(f"{key} = {value:g}" for key, value in targets.items())
        note = (f"q and f chosen for {asked} with h = {base.h}, p = {base.p:g}: "
                f"q = {chosen.q!r}, f = {chosen.f!r} (as realized: epsilon_inf = "
                f"{chosen.epsilon_inf:.10g}, epsilon_1 = {chosen.epsilon_1:.10g})")
        return cast(StringParams, cls.from_dict({**settings, "q": chosen.q, "f": chosen.f})), note

    @classmethod
    def for_epsilon(
        cls,
        epsilon_inf: float,
        epsilon_1: float | None = None,
        *,
        k: int = 128,
        h: int = 2,
        m: int = 64,
        p: float = 0.5,
    ) -> StringParams:
        """Parameters whose longitudinal bound is ``epsilon_inf`` (and one-report bound
        ``epsilon_1`` if given, by choosing ``q``; otherwise q = 0.75).

        ``f`` and ``q`` are set on the encoders' grid of ``N / 2**32`` (:func:`realized`),
        rounded towards more privacy: the bounds of the realized probabilities never
        exceed the targets.
        """
        f = f_on_grid(epsilon_inf, h)
        if epsilon_1 is None:
            if not realize(p) < realize(0.75):
                raise ParameterError("p", f"with epsilon_inf alone q is 0.75, so p must be below "
                                          f"it. Got {p!r} instead: lower p, or give epsilon_1 too")
            return cls(k=k, h=h, m=m, p=p, q=0.75, f=f)
        fewest = (realize(p) + 1) / PROB_ONE  # the least q realized above p
        _check_reachable(epsilon_1, epsilon_inf, h, p, f, fewest)
        q = math.floor(q_for_epsilon_1(epsilon_1, h, realized(p), f) * PROB_ONE) / PROB_ONE
        return cls(k=k, h=h, m=m, p=p, q=max(q, fewest), f=f)


def f_on_grid(epsilon_inf: float, h: int) -> float:
    """The least ``f`` on the encoders' grid of ``N / 2**32`` whose longitudinal bound over
    ``h`` hash functions is at most ``epsilon_inf`` (rounded up: towards more privacy), and
    at least ``2**-32``: ``f = 0`` would have no longitudinal bound at all."""
    return max(math.ceil(f_for_epsilon_inf(epsilon_inf, h) * PROB_ONE), 1) / PROB_ONE


def _check_reachable(epsilon_1: float, epsilon_inf: float, h: int, p: float, f: float,
                     fewest: float) -> None:
    """Refuse an ``epsilon_1`` target that no ``q`` in ``[fewest, 1]`` reaches with the ``f``
    chosen for ``epsilon_inf``, ``h`` and ``p``, saying which way to move each."""
    given = f"epsilon_1 = {shown_number(epsilon_1)}"
    with_ = (f"with epsilon_inf = {shown_number(epsilon_inf)} (which sets f = {f:.6g}), h = {h} "
             f"and p = {p:g}")
    most = rappor_epsilon_1(h, realized(p), 1.0, f) if fewest <= 1 else 0.0  # p realized as 1
    if not epsilon_1 <= most:
        raise ParameterError(
            "epsilon_1", f"{given} cannot be reached {with_}: even q = 1 gives "
                         f"{_significant(most, math.floor)}; lower epsilon_1 to that or less, "
                         "raise epsilon_inf, or lower p")
    least = rappor_epsilon_1(h, realized(p), fewest, f)
    if epsilon_1 < least:
        raise ParameterError(
            "epsilon_1", f"{given} is below the least one-report bound that probabilities of "
                         f"32 bits realize {with_}: q = p + 2**-32 gives "
                         f"{_significant(least, math.ceil)}; raise epsilon_1 to that or more")


def _significant(x: float, rounding: Any) -> str:
    """``x`` to 4 significant digits, rounded with ``rounding`` (``math.floor`` or
    ``math.ceil``), so that the number a message asks for is safe to give."""
    if not (math.isfinite(x) and x > 0):
        return f"{x:g}"
    scale = 10.0 ** (3 - math.floor(math.log10(x)))
    return f"{rounding(x * scale) / scale:.4g}"
