"""What every mechanism's parameter set offers."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.privacy import group_privacy
from veil.shared.validation import reject_unknown

#: every mechanism's parameter class, keyed by its ``mechanism_name``, in the order defined
MECHANISMS: FaceRegistry[type[MechanismParams]] = FaceRegistry("parameter class")
#: each kind's default mechanism (the class a metric naming no ``oracle`` gets), by kind
KINDS: FaceRegistry[type[MechanismParams]] = FaceRegistry("kind")


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
