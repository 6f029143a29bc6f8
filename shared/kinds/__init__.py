"""One module per kind of metric (and per oracle of a category metric).

Each parameter class registers itself where it is defined
(:class:`~veil.shared.kinds.base.MechanismParams`'s subclass hook):
:data:`MECHANISMS` maps a mechanism's name (its kind, or ``kind/oracle``) to its
parameter class; :data:`KINDS` maps a kind to its default mechanism; the
encoder, decoder and simulation registries key on ``params.mechanism_name``, the
statistics (:mod:`veil.shared.statistics`) on ``params.statistic``.
:func:`parse_params` reads a registry's or counts document's parameters, picking
the class from ``kind`` and ``oracle``.

This package imports the built-in mechanisms' modules, so importing any part of it
registers them all; the order of the imports below is the order in which messages
list the kinds and ``oracle = "auto"`` weighs the oracles.
"""

from collections.abc import Mapping
from typing import Any

from veil.shared.errors import ParameterError
from veil.shared.kinds.base import KINDS, MECHANISMS, MechanismParams, implements

# isort: off
from veil.shared.kinds.string import StringParams
from veil.shared.kinds.string_oracles import (
    STRING_ORACLES,
    FlhParams,
    HcmsParams,
    StringOracleParams,
    choose_string_oracle,
)
from veil.shared.kinds.category import CategoryParams
from veil.shared.kinds.oracles import (
    ORACLES,
    GrrParams,
    HadamardParams,
    OlhParams,
    OracleParams,
    OueParams,
    check_report_cap,
    choose_oracle,
)
from veil.shared.kinds.boolean import BooleanParams
from veil.shared.kinds.number import NumberParams
from veil.shared.kinds.discovery import DiscoveryParams
from veil.shared.kinds.joint import JointParams
# isort: on


#: the ``oracle = "auto"`` of kinds that choose with settings of their own, by kind
AUTO_CHOICES = {StringParams.kind: choose_string_oracle}


def parse_params(data: Mapping[str, Any]) -> tuple[MechanismParams, str]:
    """Parameters from a mapping with ``kind`` (and, for categories, ``oracle``), plus a
    note saying which oracle ``oracle = "auto"`` chose and why, or how a kind's own
    settings were turned into parameters (:meth:`~MechanismParams.from_settings`: a string
    metric's privacy targets); "" otherwise.

    Raises :class:`ParameterError` naming the offending key, also for parameters whose
    statistic would hold more than :data:`~veil.shared.kinds.base.MAX_COUNTERS` counters
    (:meth:`~MechanismParams.check_counters`).
    """
    params, note = _parse(data)
    params.check_counters()
    return params, note


def _parse(data: Mapping[str, Any]) -> tuple[MechanismParams, str]:
    """:func:`parse_params` before the size of the statistic is checked."""
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ParameterError(
            "kind", f"kind must be one of {', '.join(map(repr, KINDS))}. Got {kind!r} instead.")
    settings = {key: value for key, value in data.items() if key != "kind"}
    default = KINDS[kind]
    oracle = settings.get("oracle", default.oracle)
    if oracle == default.oracle:
        return default.from_settings(settings)
    choices = [name for name, cls in MECHANISMS.items() if cls.kind == kind]
    if len(choices) == 1:
        raise ParameterError("oracle", f"a {kind} metric has no oracle to choose; omit it")
    if oracle == "auto" and kind in AUTO_CHOICES:
        settings.pop("oracle")
        return AUTO_CHOICES[kind](settings)
    if oracle == "auto":
        settings.pop("oracle")
        reject = sorted(set(settings) - {"categories", "epsilon", "report_epsilon",
                                          "max_report_bytes"})
        if reject:
            raise ParameterError(reject[0], f"oracle = 'auto' takes categories, epsilon, "
                                            f"report_epsilon and max_report_bytes; not {reject[0]!r}")
        if "epsilon" not in settings:
            raise ParameterError("epsilon", "oracle = 'auto' needs the epsilon to choose for")
        return choose_oracle(settings.get("categories", ()), settings["epsilon"],
                             settings.get("report_epsilon"), settings.get("max_report_bytes"))
    cls = MECHANISMS.get(f"{kind}/{oracle}")
    if cls is None:
        names = [default.oracle, *(MECHANISMS[n].oracle for n in choices if n != kind), "auto"]
        raise ParameterError(
            "oracle", f"oracle must be one of {', '.join(map(repr, names))}. Got {oracle!r} instead.")
    cap = check_report_cap(settings.pop("max_report_bytes", None))
    params = cls.from_dict(settings)
    size = getattr(params, "report_bytes", None)  # every named oracle states it
    if cap is not None and size is not None and size > cap:
        over = f" over {params.d} categories" if isinstance(params, OracleParams) else ""
        raise ParameterError(
            "max_report_bytes",
            f"{oracle} reports{over} take {size} bytes, more than max_report_bytes={cap!r}")
    return params, ""


def params_from_dict(data: Mapping[str, Any]) -> MechanismParams:
    """:func:`parse_params` without the note."""
    return parse_params(data)[0]


__all__ = [
    "KINDS",
    "MECHANISMS",
    "ORACLES",
    "STRING_ORACLES",
    "BooleanParams",
    "CategoryParams",
    "DiscoveryParams",
    "FlhParams",
    "GrrParams",
    "HadamardParams",
    "HcmsParams",
    "JointParams",
    "MechanismParams",
    "NumberParams",
    "OlhParams",
    "OracleParams",
    "OueParams",
    "StringOracleParams",
    "StringParams",
    "choose_oracle",
    "choose_string_oracle",
    "implements",
    "params_from_dict",
    "parse_params",
]
