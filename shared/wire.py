"""The versioned wire format for a batch of randomized reports, and its validation.

A batch is a JSON object::

    {"version": 2,
     "batch_id": "<32 lowercase hex: random, new per batch>",
     "reports": [
        {"id": "<32 lowercase hex: random 16 bytes>", "metric": "homepage",
         "params": "<16 hex: the fingerprint of the parameters it was encoded with>",
         "cohort": 12, "payload": "<hex bit vector>"},
        {"id": "...", "metric": "dark_mode", "params": "...", "payload": 1}
     ]}

``cohort`` is present exactly for kinds that have cohorts (``string``).
``params`` is :attr:`MechanismParams.fingerprint` of the parameters the client
encoded the report with: a report whose fingerprint is not the metric's is
refused (``stale_params``), never decoded with parameters it was not made with.
Version 1 batches (reports without ``params``) are still accepted, unchecked,
for clients that predate version 2. A report carries nothing else: never a raw
value, never a device identifier, never a timestamp (the collector files reports
under the day it received them). Client and collector call the same
:func:`validate_batch`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from veil.shared.bits import HEX_DIGITS
from veil.shared.errors import WireFormatError
from veil.shared.registry import Registry

WIRE_VERSION = 2
#: versions a collector accepts: 1 has no parameter fingerprints
SUPPORTED_VERSIONS = (1, 2)
REPORT_KEYS = frozenset({"id", "metric", "params", "cohort", "payload"})
REQUIRED_KEYS = frozenset({"id", "metric", "params", "payload"})
#: what version 1 reports carry (no ``params``)
REPORT_KEYS_V1 = REPORT_KEYS - {"params"}
REQUIRED_KEYS_V1 = REQUIRED_KEYS - {"params"}
BATCH_KEYS = frozenset({"version", "batch_id", "reports"})
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class Report(NamedTuple):
    """A validated report: wire fields plus the parsed payload ``value``.

    A named tuple rather than a dataclass: the collector builds one per report
    it receives, and tuples are the cheapest immutable records to build.
    """

    id: str
    metric: str
    cohort: int
    payload: Any
    value: Any

    def to_wire(self, params: str | None, with_cohort: bool = True) -> dict[str, Any]:
        """The JSON object for this report, with the fingerprint ``params`` (``None``: version 1)."""
        return make_report(self.id, self.metric, self.cohort if with_cohort else None,
                           self.payload, params)


@dataclasses.dataclass(frozen=True, slots=True)
class ReportError:
    """Why report number ``index`` of a batch was refused."""

    index: int
    field: str
    code: str
    message: str
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BatchValidation:
    """The outcome of :func:`validate_batch`: valid reports and per-report errors."""

    batch_id: str
    reports: list[Report]
    errors: list[ReportError]


def shown_key(key: Any) -> str:
    """An unknown JSON key as an error names it: cut to 64 characters, so that a client
    sending a key of megabytes does not get it back."""
    text = str(key)
    return text if len(text) <= 64 else text[:61] + "..."


def make_report(report_id: str, metric: str, cohort: int | None, payload: Any,
                params: str | None) -> dict[str, Any]:
    """The wire object for one report (``cohort`` omitted when ``None``; ``params``, the
    fingerprint of the parameters it was encoded with, omitted when ``None``: version 1)."""
    out: dict[str, Any] = {"id": report_id, "metric": metric}
    if params is not None:
        out["params"] = params
    if cohort is not None:
        out["cohort"] = cohort
    out["payload"] = payload
    return out


def make_batch(batch_id: str, reports: Iterable[Mapping[str, Any]],
               version: int = WIRE_VERSION) -> dict[str, Any]:
    """The wire object for a batch (``version`` 1 only for reports without fingerprints)."""
    return {"version": version, "batch_id": batch_id, "reports": list(reports)}


def join_batch(batch_id: str, reports: Iterable[str]) -> str:
    """The compact JSON text of :func:`make_batch` for reports already serialized as JSON.

    The client's outbox stores each report as JSON text: joining those texts
    spares parsing and re-encoding every report of every batch it uploads.
    """
    envelope = make_batch(batch_id, ())
    del envelope["reports"]
    # '{"version":2,"batch_id":"..."}' without its closing brace, then the reports
    return f'{_COMPACT.encode(envelope)[:-1]},"reports":[{",".join(reports)}]}}'


def _is_id(value: Any) -> bool:
    return type(value) is str and len(value) == 32 and not value.strip(HEX_DIGITS)


def _check_id(value: Any, field: str) -> str:
    if not _is_id(value):
        raise WireFormatError(
            field, "must be 32 lowercase hex digits (16 random bytes)", "bad_id"
        )
    return str(value)


def validate_report(obj: Any, registry: Registry, field: str = "report",
                    version: int = WIRE_VERSION) -> Report:
    """Check one report against its metric; raise :class:`WireFormatError` naming the field.

    This runs once per report the collector receives, so the common case (a
    dict with the known keys) takes only cheap checks.
    """
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise WireFormatError(field, "must be a JSON object", "wrong_type")
    allowed, required = (REPORT_KEYS, REQUIRED_KEYS) if version >= 2 else (
        REPORT_KEYS_V1, REQUIRED_KEYS_V1)
    keys = obj.keys()
    if not required <= keys <= allowed:
        unknown = sorted(set(obj) - allowed, key=str)
        if unknown:
            raise WireFormatError(
                f"{field}.{shown_key(unknown[0])}",
                f"is not a report field of wire version {version} "
                f"(allowed: {', '.join(sorted(allowed))})",
                "unknown_field",
            )
        missing = next(key for key in ("id", "metric", "params", "payload")
                       if key in required and key not in obj)
        raise WireFormatError(f"{field}.{missing}", "is required", "missing")
    report_id = _check_id(obj["id"], f"{field}.id")
    name = obj["metric"]
    metric = registry.get(name)
    if metric is None:
        shown = name if isinstance(name, str) and len(name) <= 64 else "(invalid)"
        raise WireFormatError(
            f"{field}.metric",
            f"unknown metric {shown!r}; fetch the registry (GET /v1/metrics) for valid names",
            "unknown_metric",
        )
    params = metric.params
    if version < params.min_wire_version:
        raise WireFormatError(
            f"{field}.version",
            f"metric {name!r} ({params.mechanism_name}) takes reports of wire version "
            f"{params.min_wire_version} or later, whose fingerprint names the payload's shape",
            "unsupported_version",
        )
    if version >= 2 and obj["params"] != params.fingerprint:
        given = obj["params"]
        shown = given if isinstance(given, str) and len(given) <= 64 else "(invalid)"
        raise WireFormatError(
            f"{field}.params",
            f"the report was encoded with parameters {shown!r} but metric {name!r} has "
            f"{params.fingerprint!r}: fetch the registry (GET /v1/metrics) and encode anew; "
            "reports made with other parameters cannot be decoded",
            "stale_params",
        )
    if params.has_cohorts:
        cohort = obj.get("cohort")
        if type(cohort) is not int or not 0 <= cohort < params.cohorts:
            raise WireFormatError(
                f"{field}.cohort",
                f"must be an integer in [0, {params.cohorts - 1}] for metric {name!r}",
                "bad_cohort",
            )
    else:
        if "cohort" in obj:
            raise WireFormatError(
                f"{field}.cohort", f"metric {name!r} ({params.kind}) has no cohorts; omit it",
                "unknown_field",
            )
        cohort = 0
    payload = obj["payload"]
    return Report(report_id, name, cohort, payload, params.parse_payload(payload, f"{field}.payload"))


def validate_batch(
    obj: Any, registry: Registry, *, max_reports: int | None = None
) -> BatchValidation:
    """Validate a batch: batch-level faults raise, report-level faults are collected.

    One bad report does not sink the batch: it is listed in ``errors`` with its
    index and field, and the other reports are returned.
    """
    if not isinstance(obj, Mapping):
        raise WireFormatError("body", "must be a JSON object with version, batch_id, reports", "wrong_type")
    unknown = sorted(set(obj) - BATCH_KEYS, key=str)
    if unknown:
        raise WireFormatError(
            shown_key(unknown[0]), "is not a batch field (allowed: batch_id, reports, version)",
            "unknown_field")
    version = obj.get("version")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise WireFormatError(
            "version",
            f"must be {WIRE_VERSION} (or 1, without parameter fingerprints); this collector "
            f"speaks wire versions {', '.join(map(str, SUPPORTED_VERSIONS))}",
            "unsupported_version",
        )
    batch_id = _check_id(obj.get("batch_id"), "batch_id")
    reports = obj.get("reports")
    if not isinstance(reports, list):
        raise WireFormatError("reports", "must be a JSON array of reports", "wrong_type")
    if not reports:
        raise WireFormatError("reports", "must contain at least one report", "empty")
    if max_reports is not None and len(reports) > max_reports:
        raise WireFormatError(
            "reports", f"has {len(reports)} reports; the limit is {max_reports} per batch: split it",
            "too_many",
        )
    valid: list[Report] = []
    errors: list[ReportError] = []
    for index, item in enumerate(reports):
        try:
            valid.append(validate_report(item, registry, f"reports[{index}]", version))
        except WireFormatError as exc:
            raw_id = item.get("id") if isinstance(item, Mapping) else None
            report_id = raw_id if _is_id(raw_id) else None
            errors.append(ReportError(index, exc.field, exc.code, exc.message, report_id))
    return BatchValidation(batch_id=batch_id, reports=valid, errors=errors)
