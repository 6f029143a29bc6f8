"""The contract the client and the collector both obey.

Parameters and privacy math per kind of metric, the registries of each
mechanism's faces (:mod:`veil.shared.faces`), the Bloom hashing specification,
the metric registry, and the wire format. It imports nothing else from Veil and
does no I/O except reading the metric registry's TOML file when asked
(:meth:`Registry.load`).
"""

from veil.shared.errors import ParameterError, VeilError, WireFormatError
from veil.shared.kinds import (
    KINDS,
    BooleanParams,
    CategoryParams,
    MechanismParams,
    NumberParams,
    StringParams,
)
from veil.shared.registry import Metric, Registry
from veil.shared.wire import WIRE_VERSION, BatchValidation, Report, ReportError, validate_batch

__all__ = [
    "KINDS",
    "WIRE_VERSION",
    "BatchValidation",
    "BooleanParams",
    "CategoryParams",
    "MechanismParams",
    "Metric",
    "NumberParams",
    "ParameterError",
    "Registry",
    "Report",
    "ReportError",
    "StringParams",
    "VeilError",
    "WireFormatError",
    "validate_batch",
]
