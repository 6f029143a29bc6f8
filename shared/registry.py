"""The metric registry: which metrics exist, their kind and their parameters.

Operators write it as TOML; the collector serves it to clients as JSON
(``GET /v1/metrics``). Example::

    version = 1

    [metrics.homepage]
    kind = "string"
    description = "Home page host name"
    min_reports = 1000
    k = 128
    h = 2
    m = 64
    p = 0.5
    q = 0.75
    f = 0.5

Every key other than ``kind`` and the metric's own keys (:data:`METRIC_KEYS`:
``description``, ``min_reports``, ``note`` and ``of``) is a parameter of the kind (see
:mod:`veil.shared.kinds`), read by its class's
:meth:`~veil.shared.kinds.MechanismParams.from_settings`. A string metric may give
its privacy targets instead of ``q`` and ``f``: ``epsilon_inf = 2.0`` (and
``epsilon_1 = 0.5``) pick them with :meth:`StringParams.for_epsilon
<veil.shared.kinds.StringParams.for_epsilon>`; the registry then records the
chosen ``p``, ``q`` and ``f``, so clients and collectors read the same numbers,
and says so in the metric's ``note``.

A string metric may have a *discovery channel*
(:mod:`veil.shared.kinds.discovery`), a table inside its own::

    [metrics.homepage.discovery]
    share = 0.9
    epsilon = 4.0

It becomes the metric ``homepage.discovery`` of kind ``discovery`` whose ``of`` is
``homepage`` (the JSON form lists it so, as a metric of its own). Each installation
reports a string metric through exactly one of its channels (the string metric or
its discovery channel), so :meth:`Registry.epsilon_total` counts a metric and its
channels by the largest of their epsilons.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import math
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from veil.shared.errors import ParameterError
from veil.shared.kinds import KINDS, DiscoveryParams, MechanismParams, parse_params
from veil.shared.kinds.base import as_recorded
from veil.shared.kinds.discovery import CHANNEL_SUFFIX
from veil.shared.kinds.joint import declared_domains
from veil.shared.privacy import parallel, sequential

#: the most characters a metric name may have
MAX_NAME_LENGTH = 64
#: a metric name, matched whole (:meth:`re.Pattern.fullmatch`: ``$`` would let a final
#: newline through)
METRIC_NAME = re.compile(rf"[a-z][a-z0-9_.-]{{0,{MAX_NAME_LENGTH - 1}}}")
DEFAULT_MIN_REPORTS = 100
#: the most bytes :meth:`Registry.load` reads: a registry is a small file, and a path such
#: as ``/dev/zero`` must not be read until memory runs out
MAX_REGISTRY_BYTES = 16 * 2**20
#: a metric's own keys in its table (besides ``kind``), in the order :meth:`Metric.to_dict`
#: writes them; every other key is a parameter of its kind
METRIC_KEYS = ("description", "min_reports", "note", "of")


def is_metric_key(key: str, value: Any) -> bool:
    """Whether ``key`` (holding ``value``) is a metric's own key rather than a parameter of
    its kind: one of :data:`METRIC_KEYS`, except a list in ``of``, which names a joint
    metric's variables (:mod:`veil.shared.kinds.joint`)."""
    return key in METRIC_KEYS and not (key == "of" and isinstance(value, list | tuple))


#: the own keys :meth:`Metric.to_dict` writes only when they are set
_OPTIONAL_KEYS = ("note", "of")
#: the key of a string metric's table that holds its discovery channel's table
CHANNEL_KEY = CHANNEL_SUFFIX.lstrip(".")


@dataclasses.dataclass(frozen=True)
class Metric:
    """A named metric: its mechanism parameters and collection policy."""

    name: str
    params: MechanismParams
    description: str = ""
    min_reports: int = DEFAULT_MIN_REPORTS
    #: how the registry's choices were made (which oracle ``oracle = "auto"`` picked, why)
    note: str = ""
    #: the string metric this metric is a channel of ("" for a metric of its own): set for a
    #: discovery channel, ``NAME.discovery`` of the string metric ``NAME``
    of: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not METRIC_NAME.fullmatch(self.name):
            where = f"metrics.{_shown_key(self.name)}"
            raise ParameterError(
                where,
                f"{where}: the metric name must start with a lowercase letter and use only "
                f"a-z, 0-9, '_', '.', '-' (at most {MAX_NAME_LENGTH} characters); rename it",
            )
        where = f"metrics.{self.name}"
        if not isinstance(self.params, MechanismParams):
            raise ParameterError(where, f"{where}: params must be a MechanismParams")
        if isinstance(self.min_reports, bool) or not isinstance(self.min_reports, int) or not (
            1 <= self.min_reports <= 10**9
        ):
            raise ParameterError(
                f"{where}.min_reports",
                f"{where}.min_reports must be an integer in [1, 1000000000]. "
                f"Got {self.min_reports!r:.100} instead.",
            )
        for key in ("description", "note"):
            value = getattr(self, key)
            if not isinstance(value, str):
                raise ParameterError(f"{where}.{key}", f"{where}.{key} must be a string. "
                                                       f"Got {value!r:.100} instead.")
        if not isinstance(self.of, str):
            raise ParameterError(
                f"{where}.of", f"{where}.of must be the name of the string metric this channel "
                               f"belongs to. Got {self.of!r:.100} instead.")

    @property
    def kind(self) -> str:
        """The metric's kind (``string``, ``category``, ``boolean``, ``number`` or ``discovery``)."""
        return self.params.kind

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: kind, description, min_reports, the note and ``of`` if set, and the
        parameters."""
        params = self.params.to_dict()
        return {
            "kind": params.pop("kind"),
            **{key: getattr(self, key) for key in METRIC_KEYS
               if key not in _OPTIONAL_KEYS or getattr(self, key)},
            **{key: value for key, value in params.items() if value is not None},
        }

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> Metric:
        """Parse one ``[metrics.NAME]`` table; errors name the offending key."""
        if not isinstance(data, Mapping):
            raise ParameterError(
                f"metrics.{name}", f"metrics.{name} must be a table of settings ([metrics.{name}] "
                                   f"with its kind). Got {data!r:.100} instead.")
        settings = dict(data)
        kind = settings.pop("kind", None)
        if not isinstance(kind, str) or kind not in KINDS:
            raise ParameterError(
                f"metrics.{name}.kind",
                f"metrics.{name}.kind must be one of {', '.join(map(repr, KINDS))}. "
                f"Got {kind!r:.100} instead.",
            )
        if "of" in settings:
            _check_of(name, kind, settings["of"])
        own = {key: settings.pop(key) for key in METRIC_KEYS
               if key in settings and is_metric_key(key, settings[key])}
        try:
            params, note = parse_params({"kind": kind, **settings})
        except ParameterError as exc:
            raise ParameterError(f"metrics.{name}.{exc.field}", f"metrics.{name}: {exc}") from None
        except TypeError as exc:
            raise ParameterError(f"metrics.{name}", f"metrics.{name}: {exc}") from None
        if note:  # a choice made now replaces the note recorded with an earlier one
            own["note"] = note
        return cls(name=name, params=params, **own)


class Registry(Mapping[str, Metric]):
    """An immutable, versioned set of metrics, looked up by name."""

    def __init__(self, metrics: Mapping[str, Metric] | list[Metric], version: int = 1,
                 skipped: Mapping[str, str] | None = None) -> None:
        #: metrics a lenient parse left out (name -> why): defined by a newer Veil, say
        self.skipped: Mapping[str, str] = MappingProxyType(dict(skipped or {}))
        items = list(metrics.values()) if isinstance(metrics, Mapping) else list(metrics)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ParameterError("version", f"Registry version must be an integer >= 1. Got {version!r}.")
        by_name: dict[str, Metric] = {}
        for metric in items:
            if metric.name in by_name:
                raise ParameterError(f"metrics.{metric.name}", _twice(metric.name))
            by_name[metric.name] = metric
        for problem in _channel_problems(by_name).values():
            raise problem
        self._metrics = MappingProxyType(by_name)
        #: the channel of each metric that has one (at most one: _channel_problems)
        self._channels = {metric.of: metric for metric in by_name.values() if metric.of}
        self.version = version

    def __getitem__(self, name: str) -> Metric:
        try:
            return self._metrics[name]
        except KeyError:
            known = ", ".join(sorted(self._metrics)) or "none"
            raise KeyError(f"unknown metric {name!r}; this registry has: {known}") from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._metrics

    def get(self, name: object, default: Any = None) -> Any:
        """The metric called ``name``, or ``default`` (a fast lookup for hot paths)."""
        return self._metrics.get(name, default) if isinstance(name, str) else default

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Registry)
            and self.version == other.version
            and dict(self._metrics) == dict(other._metrics)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Registry(version={self.version}, metrics={sorted(self._metrics)})"

    def channel(self, name: str) -> Metric | None:
        """The channel of the metric ``name`` (a string metric's discovery channel), or
        ``None``. An installation reports ``name`` through exactly one of the two."""
        return self._channels.get(name)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document served at ``GET /v1/metrics``."""
        return {
            "version": self.version,
            "metrics": {name: metric.to_dict() for name, metric in self._metrics.items()},
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Registry:
        """:meth:`from_dict` of a registry a store or an archive recorded: the size limit
        (:data:`~veil.shared.kinds.base.MAX_COUNTERS`) bounds what is declared, not what an
        earlier version let a store record, so such a record is still read
        (:func:`~veil.shared.kinds.base.as_recorded`)."""
        with as_recorded():
            return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, lenient: bool = False) -> Registry:
        """Parse the mapping form (from TOML or JSON).

        ``lenient=True`` (what clients use for a registry served to them) leaves out a
        metric this version cannot read, such as one with a mechanism added later, and
        records why in :attr:`skipped`; the other metrics stay usable.
        """
        if not isinstance(data, Mapping):
            raise ParameterError("registry", "the registry must be a table/object")
        unknown = sorted(set(data) - {"version", "metrics"})
        if unknown:
            raise ParameterError(unknown[0], f"unknown top-level key {unknown[0]!r}; expected version, metrics")
        metrics = data.get("metrics", {})
        if not isinstance(metrics, Mapping) or not metrics:
            raise ParameterError("metrics", "the registry needs at least one [metrics.NAME] table")
        parsed: list[Metric] = []
        skipped: dict[str, str] = {}
        def add(name: str, build: Callable[[], Metric]) -> None:
            try:
                parsed.append(build())
            except ParameterError as exc:
                if not lenient:
                    raise
                skipped[name] = str(exc)

        for name, table in metrics.items():
            channel = None
            if isinstance(table, Mapping) and CHANNEL_KEY in table:
                table = dict(table)
                channel = table.pop(CHANNEL_KEY)
            build = functools.partial(Metric.from_dict, name, table)
            if isinstance(table, Mapping) and isinstance(table.get("of"), list) \
                    and "domains" not in table and _takes_variables(table.get("kind")):
                build = functools.partial(_with_domains, str(name), table, metrics)
            add(str(name), build)
            if channel is not None:
                add(f"{name}{CHANNEL_SUFFIX}",
                    functools.partial(_nested_channel, name, table.get("kind"), channel))
        if lenient:
            parsed = _usable(parsed, skipped)
        return cls(parsed, version=data.get("version", 1), skipped=skipped)

    @classmethod
    def from_toml(cls, text: str) -> Registry:
        """Parse TOML text; a byte-order mark at its start (some editors write one) is
        ignored."""
        try:
            data = tomllib.loads(text.removeprefix("\ufeff"))
        except tomllib.TOMLDecodeError as exc:
            raise ParameterError("registry", f"the registry is not valid TOML: {exc}") from None
        except ValueError as exc:  # an integer past Python's digit limit (4,300 digits)
            raise ParameterError("registry", f"the registry cannot be read: {exc}; no setting "
                                             "needs a number that long") from None
        except RecursionError:
            raise ParameterError(
                "registry", "the registry is not valid TOML: arrays or tables are nested too "
                            "deeply to read (a registry nests a few levels at most)") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> Registry:
        """Read a TOML registry file: UTF-8, at most :data:`MAX_REGISTRY_BYTES`. Every
        error is a :class:`ParameterError` that names the path."""
        path = Path(path)
        try:
            with path.open("rb") as file:
                raw = file.read(MAX_REGISTRY_BYTES + 1)
        except OSError as exc:
            raise ParameterError(
                "registry", f"cannot read registry file {path}: {exc.strerror or exc}") from None
        try:
            return cls.from_toml(_registry_text(raw))
        except ParameterError as exc:
            raise ParameterError(exc.field, f"{path}: {exc}") from None

    def to_toml(self) -> str:
        """Render as TOML (only the value types the registry uses)."""
        lines = [f"version = {self.version}", ""]
        for name, metric in self._metrics.items():
            # a discovery channel as the table inside its string metric's, as operators write it
            nested = bool(metric.of) and name == f"{metric.of}{CHANNEL_SUFFIX}"
            header = f"{_toml_key(metric.of)}.{CHANNEL_KEY}" if nested else _toml_key(name)
            lines.append(f"[metrics.{header}]")
            for key, value in metric.to_dict().items():
                lines.append(f"{key} = {_toml_value(value)}")
            lines.append("")
        return "\n".join(lines)

    def epsilon_total(self, per_metric: Mapping[str, float] | None = None) -> float:
        """Sequential composition over metrics (all reported by the same person), a string
        metric and its discovery channel counting as the larger of their epsilons: an
        installation reports through one of them only. ``per_metric`` (name -> epsilon)
        replaces each metric's ``epsilon_inf``; a name the registry lacks counts on its own."""
        values = per_metric if per_metric is not None else {
            name: metric.params.epsilon_inf for name, metric in self._metrics.items()
        }
        groups: dict[str, list[float]] = {}
        for name, epsilon in values.items():
            metric = self._metrics.get(name)
            groups.setdefault(metric.of if metric is not None and metric.of else name,
                              []).append(epsilon)
        return sequential(parallel(group) for group in groups.values())


def _channel_problems(metrics: Mapping[str, Metric]) -> dict[str, ParameterError]:
    """What is wrong with the channels among ``metrics``, by the name of the metric at fault:
    a discovery metric must belong to (``of``) a string metric of the registry, which has
    at most one; no other metric belongs to another."""
    problems: dict[str, ParameterError] = {}
    owners: dict[str, str] = {}
    for name, metric in metrics.items():
        of = metric.of
        owner_kind = metric.params.channel_of
        if not owner_kind:
            if of:
                problems[name] = ParameterError(
                    f"metrics.{name}.of",
                    f"metrics.{name}: only a discovery channel belongs to another metric; "
                    f"remove of = {of!r} from this {metric.kind} metric")
            continue
        owner = metrics.get(of) if of else None
        if not of:
            why = ("a discovery channel needs of, the string metric it belongs to; write it "
                   "as the table [metrics.NAME.discovery] of string metric NAME")
        elif owner is None:
            why = f"of = {of!r} names no metric of this registry"
        elif owner.kind != owner_kind:
            why = (f"of = {of!r} names a {owner.kind} metric; a {metric.kind} channel belongs "
                   f"to a {owner_kind} metric")
        elif of in owners:
            why = (f"string metric {of!r} has a discovery channel already, {owners[of]!r}; "
                   "it may have one")
        else:
            owners[of] = name
            continue
        problems[name] = ParameterError(f"metrics.{name}.of", f"metrics.{name}: {why}")
    return problems


def _registry_text(raw: bytes) -> str:
    """The text of a registry file's bytes ``raw`` (read up to one byte past
    :data:`MAX_REGISTRY_BYTES`); a :class:`ParameterError` when it is longer or not UTF-8."""
    if len(raw) > MAX_REGISTRY_BYTES:
        raise ParameterError(
            "registry", f"larger than {MAX_REGISTRY_BYTES // 2**20} MiB, the most a registry "
                        "file may hold; check that this is the registry")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        utf16 = raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        raise ParameterError(
            "registry", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}, line "
                        f"{line}{'; it starts with a UTF-16 byte-order mark' if utf16 else ''}); save the "
                        "registry as UTF-8") from None


def _takes_variables(kind: Any) -> bool:
    """Whether a metric of ``kind`` lists variables in ``of`` (a joint metric) rather than
    naming the metric it belongs to (a channel's ``of``)."""
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    return cls is not None and any(field.name == "of" for field in dataclasses.fields(cls))


def _check_of(name: str, kind: str, of: Any) -> None:
    """Refuse the ``of`` of the metric ``name`` (of ``kind``) when it has the wrong shape: a
    joint metric's lists its variables, a channel's names its metric, and no other metric
    has one."""
    where = f"metrics.{name}.of"
    got = f"Got {of!r:.100} instead."
    if _takes_variables(kind):
        if not isinstance(of, list | tuple):
            raise ParameterError(
                where, f"{where} must be a list of metric names, the joint metric's variables "
                       f"(of = [\"browser\", \"crashed\"]). {got}")
    elif KINDS[kind].channel_of:
        if not isinstance(of, str):
            raise ParameterError(
                where, f"{where} must be the name of the {KINDS[kind].channel_of} metric this "
                       f"channel belongs to (of = \"homepage\"). {got}")
    elif not isinstance(of, str):
        raise ParameterError(
            where, f"metrics.{name}: only a discovery channel belongs to another metric, and "
                   f"only a joint metric lists variables; remove of from this {kind} metric")


def _not_a_variable(name: str, variable: Any, tables: Mapping[str, Any]) -> str:
    """Why ``variable``, in the ``of`` of the joint metric ``name``, cannot be one of its
    variables, a metric of the registry (``tables``: each metric's table); "" when it may
    be (or names no metric: :func:`~veil.shared.kinds.joint.declared_domains` says so)."""
    instead = ("name a category or boolean metric, or give every variable's domain in "
               "domains")
    if not isinstance(variable, str):
        return f"is not a metric name; {instead}"
    if variable == name:
        return f"names this joint metric itself; a variable is another metric: {instead}"
    table = tables.get(variable)
    kind = table.get("kind") if isinstance(table, Mapping) else None
    # a channel written as the table inside its string metric's: [metrics.NAME.discovery]
    owner = tables.get(variable.removesuffix(CHANNEL_SUFFIX))
    nested = variable.endswith(CHANNEL_SUFFIX) and isinstance(owner, Mapping) \
        and CHANNEL_KEY in owner
    if nested or kind == DiscoveryParams.kind:
        return ("names a discovery channel, which cannot be a variable: an installation "
                "reports it in place of its string metric, and it has no finite domain; "
                + instead)
    if _takes_variables(kind):
        return ("names a joint metric, which cannot be a variable (its value is a tuple); "
                "name its variables instead, a category or boolean metric each, or give "
                "every variable's domain in domains")
    return ""


def _with_domains(name: str, table: Mapping[str, Any], tables: Mapping[str, Any]) -> Metric:
    """The joint metric ``name`` whose ``of`` names metrics of the registry, with the
    ``domains`` those metrics define (:func:`~veil.shared.kinds.joint.declared_domains`)."""
    for i, variable in enumerate(table["of"]):
        why = _not_a_variable(name, variable, tables)
        if why:
            raise ParameterError(f"metrics.{name}.of[{i}]",
                                 f"metrics.{name}: of[{i}] = {variable!r:.100} {why}")

    def params_of(variable: str) -> MechanismParams | None:
        other = tables.get(variable)
        if variable == name or not isinstance(other, Mapping):
            return None
        return Metric.from_dict(variable, {key: value for key, value in other.items()
                                           if key != CHANNEL_KEY}).params

    return Metric.from_dict(name, {**table,
                                   "domains": declared_domains(name, table["of"], params_of)})


def _nested_channel(name: str, kind: Any, table: Any) -> Metric:
    """The discovery channel a string metric ``name`` (of ``kind``) defines in its table:
    the metric ``NAME.discovery`` of kind ``discovery`` and ``of = NAME``."""
    channel = f"{name}{CHANNEL_SUFFIX}"
    where = f"metrics.{channel}"
    if kind != DiscoveryParams.channel_of:
        raise ParameterError(
            where, f"metrics.{name}: only a string metric may have a discovery channel; this one "
                   f"is of kind {kind!r}. Remove its [{where}] table")
    if not isinstance(table, Mapping):
        raise ParameterError(where, f"{where} must be a table of settings ([{where}]). "
                                    f"Got {table!r:.100} instead.")
    if len(channel) > MAX_NAME_LENGTH and METRIC_NAME.fullmatch(name):
        raise ParameterError(
            where, f"metrics.{name}: its discovery channel is the metric {channel!r}, "
                   f"{len(channel)} characters, more than the {MAX_NAME_LENGTH} a metric name "
                   f"may have; shorten the string metric's name to "
                   f"{MAX_NAME_LENGTH - len(CHANNEL_SUFFIX)} characters or fewer")
    settings = dict(table)
    if settings.setdefault("kind", DiscoveryParams.kind) != DiscoveryParams.kind:
        raise ParameterError(
            f"{where}.kind", f"{where}.kind must be 'discovery' (or left out). "
                             f"Got {settings['kind']!r} instead.")
    if settings.setdefault("of", name) != name:
        raise ParameterError(
            f"{where}.of", f"{where}.of must be {name!r}, the metric whose table holds it (or "
                           f"left out). Got {settings['of']!r} instead.")
    return Metric.from_dict(channel, settings)


def _usable(metrics: list[Metric], skipped: dict[str, str]) -> list[Metric]:
    """``metrics`` without those a lenient parse leaves out, noted in ``skipped``: a name
    defined twice (a channel both inside its string metric and beside it), and channels that
    do not fit (their string metric was left out, say), so that a broken channel never takes
    its string metric down."""
    by_name: dict[str, Metric] = {}
    twice: set[str] = set()
    for metric in metrics:
        if metric.name in by_name:
            twice.add(metric.name)
        by_name[metric.name] = metric
    for name in twice:
        skipped[name] = _twice(name)
        del by_name[name]
    while problems := _channel_problems(by_name):
        for name, problem in problems.items():
            skipped[name] = str(problem)
            del by_name[name]
    return list(by_name.values())


def _twice(name: str) -> str:
    return (f"metrics.{name} is defined twice (a discovery channel both inside its string "
            "metric's table and on its own, say); keep one")


def _shown_key(name: Any) -> str:
    """A metric's name as a registry's key, for a message: as TOML writes it (quoted, with
    escapes, when it must be), cut short when long."""
    shown = _toml_key(name) if isinstance(name, str) else repr(name)
    return shown if len(shown) <= 100 else f"{shown[:97]}..."


def _toml_key(key: str) -> str:
    """``key`` as a TOML key: bare when it can be, else quoted (a name with a dot in it)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'

