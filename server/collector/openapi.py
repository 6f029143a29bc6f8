"""The OpenAPI 3.1 document served at ``GET /v1/openapi.json`` (written by hand, kept with the routes)."""

from __future__ import annotations

from typing import Any

from veil.shared.statistics import STATISTICS

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "field", "message"],
            "properties": {
                "code": {"type": "string", "examples": ["bad_json", "too_few_reports"]},
                "field": {"type": ["string", "null"], "examples": ["reports[3].payload"]},
                "message": {"type": "string"},
            },
        }
    },
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def json_of(schema: str) -> dict[str, Any]:
    """A JSON content entry referring to a component schema."""
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def openapi_document(max_body: int, max_reports: int) -> dict[str, Any]:
    """The API description with this collector's limits filled in."""
    report = {
        "type": "object",
        "required": ["id", "metric", "payload"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                   "description": "16 random bytes, lowercase hex; the idempotency key"},
            "metric": {"type": "string"},
            "cohort": {"type": "integer", "minimum": 0,
                       "description": "present exactly for string metrics"},
            "payload": {"description": "hex bit vector (string, category), 0/1 (boolean, "
                        "number/1bitmean) or a finite number (number/laplace, gaussian)",
                        "oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "number"}]},
        },
    }
    batch = {
        "type": "object",
        "required": ["version", "batch_id", "reports"],
        "additionalProperties": False,
        "properties": {
            "version": {"const": 1},
            "batch_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            "reports": {"type": "array", "minItems": 1, "maxItems": max_reports,
                        "items": {"$ref": "#/components/schemas/Report"}},
        },
    }
    receipt = {
        "type": "object",
        "required": ["batch_id", "accepted", "duplicates", "rejected", "errors"],
        "properties": {
            "batch_id": {"type": "string"},
            "accepted": {"type": "integer", "description": "newly stored reports"},
            "duplicates": {"type": "integer",
                           "description": "reports already stored (or repeated in the batch)"},
            "rejected": {"type": "integer"},
            "errors": {"type": "array", "items": {
                "type": "object",
                "required": ["index", "field", "code", "message", "id"],
                "properties": {
                    "index": {"type": "integer"}, "field": {"type": "string"},
                    "code": {"type": "string"}, "message": {"type": "string"},
                    "id": {"type": ["string", "null"]},
                },
            }},
        },
    }
    field_schemas = {"counts": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                     "count": {"type": "integer", "minimum": 0}, "real": {"type": "number"}}
    cohort = {
        "description": "one cohort's number of reports and the fields of the metric's "
                       "statistic, one variant per statistic",
        "oneOf": [
            {
                "title": statistic.name,
                "description": (type(statistic).__doc__ or "").splitlines()[0],
                "type": "object",
                "required": ["cohort", "reports", *(f.name for f in statistic.fields)],
                "additionalProperties": False,
                "properties": {
                    "cohort": {"type": "integer", "minimum": 0},
                    "reports": {"type": "integer", "minimum": 0},
                    **{f.name: field_schemas[f.type] for f in statistic.fields},
                },
            }
            for statistic in STATISTICS.values()
        ],
    }
    counts = {
        "type": "object",
        "required": ["metric", "kind", "params", "start", "end", "reports", "cohorts"],
        "properties": {
            "metric": {"type": "string"}, "kind": {"type": "string"},
            "params": {"type": "object"},
            "start": {"type": ["string", "null"], "format": "date"},
            "end": {"type": ["string", "null"], "format": "date"},
            "reports": {"type": "integer"},
            "cohorts": {"type": "array", "items": {"$ref": "#/components/schemas/Cohort"}},
        },
    }
    stats = {
        "type": "object",
        "required": ["start", "end", "reports", "metrics"],
        "properties": {
            "start": {"type": ["string", "null"], "format": "date"},
            "end": {"type": ["string", "null"], "format": "date"},
            "reports": {"type": "integer", "description": "all metrics' reports in the range"},
            "metrics": {"type": "array", "items": {
                "type": "object",
                "required": ["metric", "reports", "days"],
                "properties": {
                    "metric": {"type": "string"},
                    "reports": {"type": "integer"},
                    "days": {"type": "array", "description": "days with reports, oldest first",
                             "items": {"type": "object", "required": ["day", "reports"],
                                       "properties": {
                                           "day": {"type": "string", "format": "date"},
                                           "reports": {"type": "integer"}}}},
                },
            }},
        },
    }
    status = {"type": "object", "properties": {"status": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Veil collector", "version": "1",
                 "description": "Receives randomized (locally differentially private) reports "
                 "and serves their per-cohort sufficient statistics."},
        "paths": {
            "/healthz": {"get": {"summary": "Liveness", "responses": {
                "200": {"description": "the process answers",
                        "content": {"application/json": {"schema": status}}}}}},
            "/readyz": {"get": {"summary": "Readiness (writes can succeed)", "responses": {
                "200": {"description": "ready",
                        "content": {"application/json": {"schema": status}}},
                "503": _error("database unavailable")}}},
            "/metrics": {"get": {
                "summary": "The collector's own counters, in Prometheus' text format",
                "description": "Reports accepted, duplicate and rejected (by error code), batches "
                               "refused (by error code), batch latency, database size. Needs a "
                               "metrics token or a read token.",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {"description": "Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}},
                    "401": _error("missing or wrong bearer token"),
                    "403": _error("no metrics or read token configured on the collector"),
                },
            }},
            "/v1/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": {"description": "OpenAPI 3.1 document"}}}},
            "/v1/metrics": {"get": {"summary": "The metric registry clients encode against",
                                    "responses": {"200": {"description": "Registry.to_dict()",
                                                          "content": {"application/json": {
                                                              "schema": {"type": "object"}}}}}}},
            "/v1/reports": {"post": {
                "summary": "Upload a batch of randomized reports",
                "description": "200 only after accepted reports are committed to disk. Open "
                               "unless the collector is configured with an upload token.",
                "security": [{}, {"bearer": []}],
                "requestBody": {"required": True, "content": json_of("Batch")},
                "responses": {
                    "200": {"description": "per-report outcome", "content": json_of("Receipt")},
                    "400": _error("batch-level error (bad JSON, version, too many reports)"),
                    "401": _error("upload token required or wrong"),
                    "413": _error(f"body larger than {max_body} bytes"),
                    "415": _error("Content-Type is not application/json (UTF-8)"),
                    "503": _error("database unavailable; retry after Retry-After seconds"),
                },
            }},
            "/v1/stats": {"get": {
                "summary": "Reports per metric and UTC day of receipt (every stored metric, "
                           "or one)",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "metric", "in": "query", "schema": {"type": "string"}},
                    {"name": "start", "in": "query", "schema": {"type": "string", "format": "date"}},
                    {"name": "end", "in": "query", "schema": {"type": "string", "format": "date"}},
                ],
                "responses": {
                    "200": {"description": "stats document", "content": json_of("Stats")},
                    "400": _error("bad date or unknown query parameter"),
                    "401": _error("missing or wrong bearer token"),
                    "403": _error("no read token configured on the collector"),
                    "404": _error("unknown metric"),
                    "503": _error("database unavailable; retry after Retry-After seconds"),
                },
            }},
            "/v1/metrics/{name}/counts": {"get": {
                "summary": "Sufficient statistics of a metric over UTC days of receipt",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "start", "in": "query", "schema": {"type": "string", "format": "date"}},
                    {"name": "end", "in": "query", "schema": {"type": "string", "format": "date"}},
                    {"name": "format", "in": "query",
                     "schema": {"enum": ["json", "csv"], "default": "json"}},
                ],
                "responses": {
                    "200": {"description": "counts document, or google/rappor counts.csv",
                            "content": {**json_of("Counts"),
                                        "text/csv": {"schema": {"type": "string"}}}},
                    "400": _error("bad date or format"),
                    "401": _error("missing or wrong bearer token"),
                    "403": _error("no read token configured on the collector"),
                    "404": _error("unknown metric"),
                    "409": _error("fewer reports than the metric's min_reports (too_few_reports)"),
                    "503": _error("database unavailable; retry after Retry-After seconds"),
                },
            }},
            "/v1/metrics/{name}/reports": {"get": {
                "summary": "Stored reports of a metric whose analysis reads them raw (a "
                           "discovery channel), over UTC days of receipt",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "start", "in": "query", "schema": {"type": "string", "format": "date"}},
                    {"name": "end", "in": "query", "schema": {"type": "string", "format": "date"}},
                ],
                "responses": {
                    "200": {"description": "records of X-Veil-Record-Bytes bytes each: the "
                                           "cohort (2 bytes, big-endian), then the payload's bytes",
                            "content": {"application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}}}},
                    "400": _error("bad date, unknown query parameter, or a metric analysed "
                                  "from its counts (counts_suffice)"),
                    "401": _error("missing or wrong bearer token"),
                    "403": _error("no read token configured on the collector"),
                    "404": _error("unknown metric"),
                    "409": _error("fewer reports than the metric's min_reports (too_few_reports)"),
                    "503": _error("database unavailable; retry after Retry-After seconds"),
                },
            }},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR, "Report": report, "Batch": batch, "Receipt": receipt,
                        "Cohort": cohort, "Counts": counts, "Stats": stats},
        },
    }
