"""What every mechanism's parameter set offers."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.privacy import group_privacy
from veil.shared.validation import reject_unknown

#: every mechanism's parameter class, keyed by its ``mechanism_name``, in the order defined
MECHANISMS: FaceRegistry[type[MechanismParams]] = FaceRegistry("parameter class")
#: each kind's default mechanism (the class a metric naming no ``oracle`` gets), by kind
KINDS: FaceRegistry[type[MechanismParams]] = FaceRegistry("kind")
#: the parameter that gives the length of a statistic's counts vector per cohort, by
#: statistic (the one :meth:`veil.shared.statistics.Statistic.length` reads); a statistic
#: not listed keeps a few sums per cohort and no vector
COUNTS_LENGTHS = {"bits": "k", "responses": "responses", "buckets": "buckets"}
#: the most counters a metric's statistic may hold in a day (:attr:`MechanismParams.counters`):
#: the collector builds them whole, as uint64, for every counts document and export (128 MiB
#: at the limit). The largest documented configuration, the marginals experiment's joint
#: metric of 8 variables of 8 values with ``marginals = 3`` at epsilon 4 (56 marginals of
#: 47**3 OLH responses), holds 5,814,088; the defaults hold at most 131,072 (HCMS)
MAX_COUNTERS = 1 << 24
#: whether :meth:`MechanismParams.check_counters` applies (see :func:`as_recorded`)
_LIMIT_SIZES: contextvars.ContextVar[bool] = contextvars.ContextVar("limit_sizes", default=True)


@contextlib.contextmanager
def as_recorded() -> Iterator[None]:
    """Within it, parameters are read as a store recorded them: :data:`MAX_COUNTERS` limits
    what a registry declares, not what an earlier version let a database record, so a file
    whose metrics hold more still opens and keeps its reports."""
    token = _LIMIT_SIZES.set(False)
    try:
        yield
    finally:
        _LIMIT_SIZES.reset(token)


@dataclasses.dataclass(frozen=True)
class MechanismParams:
    """Immutable, validated parameters of one kind of metric.

    Subclasses are frozen dataclasses that validate in ``__post_init__``, state
    their privacy cost (:attr:`epsilon_1`, :attr:`epsilon_inf`,
    :meth:`privacy_map`) and parse their wire payload (:meth:`parse_payload`).
    Defining one registers it in :data:`MECHANISMS` (and, for its kind's default
    mechanism, in :data:`KINDS`); a base class shared by several mechanisms says
    ``abstract=True`` in its class statement and is not registered.
    """

    kind: ClassVar[str] = ""
    #: which of its kind's mechanisms this class is, for a kind with several (a category's
    #: ``oracle``); "" for a kind with one
    oracle: ClassVar[str] = ""
    #: the ``oracle`` that parameters naming none mean (:meth:`to_dict` leaves it out)
    default_oracle: ClassVar[str] = ""
    #: registry key of this class: the kind, or ``kind/oracle`` for a kind's other oracles
    #: (set for every subclass from :attr:`kind` and :attr:`oracle`)
    mechanism_name: ClassVar[str] = ""
    #: the oldest wire version whose reports may carry this mechanism's payloads
    min_wire_version: ClassVar[int] = 1
    #: whether reports carry a cohort number
    has_cohorts: ClassVar[bool] = False
    #: the kind of metric that a metric of this kind is a channel of (``""``: none): a
    #: discovery channel belongs to a string metric, whose installations it splits
    channel_of: ClassVar[str] = ""
    #: whether the analysis reads the raw reports (the counts cannot answer it): the
    #: collector then serves them to readers (``GET /v1/metrics/<name>/reports``)
    reads_raw_reports: ClassVar[bool] = False
    #: fields that :meth:`to_dict` (and so the :attr:`fingerprint`) leaves out while they
    #: hold their default: fields added later, so that existing parameters keep their names
    omitted_when_default: ClassVar[frozenset[str]] = frozenset()
    #: the parameters that set how many counters the statistic holds (:attr:`counters`),
    #: named by the message that refuses too many
    sized_by: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        default = cls.oracle in ("", cls.default_oracle)
        cls.mechanism_name = cls.kind if default else f"{cls.kind}/{cls.oracle}"
        if abstract:
            return
        if not cls.kind:
            raise TypeError(f"{cls.__name__} names no kind: set kind, or pass abstract=True "
                            "for a base class of several mechanisms")
        MECHANISMS.add(cls.mechanism_name, cls)
        if default:
            KINDS.add(cls.kind, cls)

    @property
    def cohorts(self) -> int:
        """Number of cohorts (1 for kinds without cohorts)."""
        return 1

    @property
    def counts_length(self) -> int:
        """The length of the statistic's counts vector in each cohort (:data:`COUNTS_LENGTHS`;
        0 for a statistic that keeps sums only)."""
        name = COUNTS_LENGTHS.get(self.statistic)
        return int(getattr(self, name)) if name else 0

    @property
    def counters(self) -> int:
        """The counters the statistic holds for one day: :attr:`cohorts` times
        :attr:`counts_length`."""
        return self.cohorts * self.counts_length

    def check_counters(self) -> None:
        """Refuse parameters whose statistic holds more than :data:`MAX_COUNTERS` counters,
        naming the product and the parameters that lower it (:attr:`sized_by`)."""
        if self.counters <= MAX_COUNTERS or not _LIMIT_SIZES.get():
            return
        fields = self.sized_by or ("kind",)
        product = (f"{self.cohorts:,} cohorts x {self.counts_length:,} counters each = "
                   f"{self.counters:,}" if self.cohorts > 1 else f"{self.counters:,}")
        raise ParameterError(
            fields[0], f"{type(self).__name__}: its statistic would hold {product} counters, "
                       f"more than the {MAX_COUNTERS:,} a metric may keep (the collector builds "
                       f"them whole for every counts request); lower {' or '.join(fields)}")

    @property
    def channel_share(self) -> float:
        """For a channel (:attr:`channel_of`), the share of its metric's installations it
        takes; 0 for every other metric."""
        return 0.0

    @property
    def statistic(self) -> str:
        """Name of the sufficient statistic the collector keeps (:mod:`veil.shared.statistics`)."""
        raise NotImplementedError

    @property
    def epsilon_1(self) -> float:
        """Worst-case epsilon of a single report."""
        raise NotImplementedError

    @property
    def epsilon_inf(self) -> float:
        """Worst-case epsilon of any number of reports of one value (memoization bound)."""
        raise NotImplementedError

    @property
    def possible_values(self) -> tuple[int | None, str]:
        """How many distinct values one installation may report (``None``: no limit, as for
        strings) and what they are called: with :attr:`epsilon_inf`, an installation's
        worst case (:func:`veil.server.analysis.cost.privacy_cost`)."""
        return None, "values"

    def privacy_map(self, d_in: int = 1) -> float:
        """Epsilon when a person's data differ in up to ``d_in`` reported values.

        Each distinct value is protected by :attr:`epsilon_inf` however often it
        is reported; ``d_in`` values cost ``d_in`` times that (group privacy).
        """
        return group_privacy(self.epsilon_inf, d_in)

    def as_rappor(self) -> Any:
        """The google/rappor parameters (a ``StringParams``) these reports can be read with,
        or ``None`` for kinds whose reports are not RAPPOR bit vectors."""
        return None

    def parse_payload(self, payload: Any, field: str = "payload") -> Any:
        """Check a wire payload and return its value (bits, 0/1 or a float)."""
        raise NotImplementedError

    @functools.cached_property
    def fingerprint(self) -> str:
        """16 hex digits naming these parameters: the first 8 bytes of the SHA-256 of
        :meth:`to_dict` as compact JSON with sorted keys, whole numbers of float fields
        written as floats (``low = 0`` and ``low = 0.0`` are the same parameters). Reports
        carry it, so that a report encoded with other parameters is refused, not misread."""
        values = self.to_dict()
        for field in dataclasses.fields(self):
            if field.name not in values:  # omitted at its default
                continue
            value = values[field.name]
            if "float" in str(field.type) and isinstance(value, int) and not isinstance(value, bool):
                values[field.name] = float(value)
        text = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a JSON/TOML-ready mapping, ``kind`` first, without the
        :attr:`omitted_when_default` fields that hold their default."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.mechanism_name != self.kind:
            out["oracle"] = self.oracle
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in self.omitted_when_default and value == field.default:
                continue
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MechanismParams:
        """Build from :meth:`to_dict` output (``kind`` and ``oracle`` optional); unknown keys
        are errors."""
        oracle = data.get("oracle", cls.oracle)
        if oracle != cls.oracle:
            raise ParameterError("oracle", f"{cls.__name__} is oracle {cls.oracle!r}; got {oracle!r}")
        data = {key: value for key, value in data.items() if key not in ("kind", "oracle")}
        reject_unknown(cls.__name__, data, {field.name for field in dataclasses.fields(cls)})
        return cls(**data)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> tuple[MechanismParams, str]:
        """Parameters from a registry's settings, and a note on any choice made for them
        ("" when none): :meth:`from_dict`, unless a kind takes settings of its own (a string
        metric's privacy targets)."""
        return cls.from_dict(dict(settings)), ""


F = TypeVar("F", bound=Callable[..., Any])


def implements(params_type: type[MechanismParams],
               registry: FaceRegistry[Any]) -> Callable[[F], F]:
    """A decorator that makes a function one face of ``params_type``'s mechanism (its
    decoder, its simulation encoder): it sets ``function.params_type`` and adds the function
    to ``registry`` under ``params_type.mechanism_name``."""

    def mark(function: F) -> F:
        function.params_type = params_type  # type: ignore[attr-defined]
        registry.add(params_type.mechanism_name, function)
        return function

    return mark
