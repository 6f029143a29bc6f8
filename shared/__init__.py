"""The contract the client and the collector both obey.

Parameters and privacy math per kind of metric, the Bloom hashing
specification, the metric registry, and the wire format. Pure and I/O-free:
it imports nothing else from Veil.
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
