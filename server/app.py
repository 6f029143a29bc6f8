"""The collector's HTTP API as a Flask application factory.

``create_app(config)`` builds the app in a fixed order: defaults, the given
configuration, the registry and storage, then the routes. Nothing happens at
import time. Configuration keys:

``REGISTRY``              registry TOML path or a :class:`~veil.shared.registry.Registry` (required)
``DATABASE``              SQLite file path (required; created if missing)
``READ_TOKENS``           bearer tokens for read endpoints (a string or a list; none: reads refused)
``UPLOAD_TOKEN``          bearer token required to upload (default: uploads are open)
``MAX_CONTENT_LENGTH``    largest request body in bytes (default 8 MiB; larger gives 413)
``MAX_REPORTS_PER_BATCH`` largest batch (default 5,000 reports)
``RECENT_IDS_LIMIT``      new report ids kept before a merge into the id index (default 131,072)

Errors are JSON ``{"error": {"code", "field", "message"}}``. Request bodies are
parsed strictly: UTF-8 only, no NaN or Infinity, no duplicate keys, nesting
bounded by the parser's recursion limit and integers by Python's 4,300-digit
limit, so malformed input is a 4xx, never a 5xx. An unusable database gives 503
with ``Retry-After``. The app stores and logs no client address or user agent.
"""

from __future__ import annotations

import datetime as dt
import hmac
import io
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from veil.server.analysis.rappor_files import write_counts_document
from veil.server.openapi import openapi_document
from veil.server.storage import (
    RECENT_IDS_LIMIT,
    SQLiteStorage,
    StorageError,
    TooFewReportsError,
)
from veil.shared.errors import VeilError, WireFormatError
from veil.shared.registry import Registry
from veil.shared.wire import validate_batch

DEFAULTS: dict[str, Any] = {
    "READ_TOKENS": (),
    "UPLOAD_TOKEN": None,
    "MAX_CONTENT_LENGTH": 8 * 1024 * 1024,
    "MAX_REPORTS_PER_BATCH": 5000,
    "RECENT_IDS_LIMIT": RECENT_IDS_LIMIT,
}
EXTENSION = "veil"


class ApiError(Exception):
    """An error the API reports to the client as JSON with ``status_code``."""

    def __init__(
        self, status_code: int, code: str, field: str | None, message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.field = field
        self.message = message
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"code": self.code, "field": self.field, "message": self.message}}


class Collector:
    """What the routes need: registry served to clients, storage and limits."""

    def __init__(self, registry: Registry, storage: SQLiteStorage, read_tokens: Iterable[str],
                 upload_token: str | None, max_reports: int) -> None:
        self.registry = registry
        self.storage = storage
        self.read_tokens = [token.encode("utf-8") for token in read_tokens]
        self.upload_token = upload_token.encode("utf-8") if upload_token else None
        self.max_reports = max_reports
        self.registry_json = json.dumps(registry.to_dict())


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build a collector app; see the module docstring for the configuration keys."""
    app = Flask(__name__)
    app.config.update(DEFAULTS)
    app.config.update(config or {})
    for key in ("REGISTRY", "DATABASE"):
        if app.config.get(key) is None:
            raise VeilError(f"the collector needs the {key} setting")
    registry = app.config["REGISTRY"]
    if not isinstance(registry, Registry):
        registry = Registry.load(registry)
    tokens = app.config["READ_TOKENS"]
    tokens = [tokens] if isinstance(tokens, str) else [t for t in tokens if t]
    max_reports = app.config["MAX_REPORTS_PER_BATCH"]
    if isinstance(max_reports, bool) or not isinstance(max_reports, int) or max_reports < 1:
        raise VeilError(f"MAX_REPORTS_PER_BATCH must be a positive integer; got {max_reports!r}")
    storage = SQLiteStorage(Path(app.config["DATABASE"]), registry, create=True,
                            recent_ids_limit=app.config["RECENT_IDS_LIMIT"])
    app.extensions[EXTENSION] = Collector(
        registry, storage, tokens, app.config["UPLOAD_TOKEN"], max_reports
    )
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(sqlite3.OperationalError, _storage_unavailable)
    app.register_error_handler(StorageError, _storage_unavailable)
    app.register_blueprint(api)
    return app


def collector() -> Collector:
    """The :class:`Collector` of the current app."""
    return current_app.extensions[EXTENSION]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, headers=headers,
                    mimetype="application/json")


def _api_error(exc: ApiError) -> Response:
    return _json(exc.to_dict(), exc.status_code, exc.headers)


def _storage_unavailable(exc: Exception) -> Response:
    """The database cannot take the request now (disk full, I/O error, closing): 503, retry."""
    current_app.logger.error("storage unavailable: %s", exc)
    body = {"error": {"code": "unavailable", "field": None,
                      "message": "the collector cannot store or read reports right now; "
                                 "retry later (nothing from this request was stored)"}}
    return _json(body, 503, {"Retry-After": "5"})


_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
    408: "request_timeout", 413: "body_too_large", 415: "unsupported_media_type",
    429: "too_many_requests", 500: "internal_error", 503: "unavailable",
}


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    message = exc.description or exc.name
    if status == 413:
        limit = current_app.config["MAX_CONTENT_LENGTH"]
        message = f"the request body is larger than {limit} bytes; send smaller batches"
    body = {"error": {"code": _HTTP_CODES.get(status, "http_error"), "field": None,
                      "message": message}}
    headers = {"Allow": ", ".join(exc.valid_methods)} if getattr(exc, "valid_methods", None) else None
    return _json(body, status, headers)


def _check_bearer(tokens: list[bytes]) -> None:
    """Accept the request only with ``Authorization: Bearer <one of tokens>``."""
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="veil"'}
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "unauthorized", "Authorization",
                       "send the header 'Authorization: Bearer <token>'", challenge)
    given_bytes = given.strip().encode("utf-8", "surrogateescape")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(given_bytes, token)
    if not matched:
        raise ApiError(401, "unauthorized", "Authorization", "the bearer token is not valid",
                       challenge)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 64 else key[:64] + "..."
                raise ValueError(f"duplicate key {shown!r}")
            seen.add(key)
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON; send finite numbers only")


def parse_json_body() -> Any:
    """The request body as strict JSON; :class:`ApiError` (4xx) for anything else."""
    if request.mimetype != "application/json":
        raise ApiError(415, "unsupported_media_type", "Content-Type",
                       "send the batch with 'Content-Type: application/json'")
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, "unsupported_media_type", "Content-Type",
                       f"the body must be UTF-8 JSON; got charset {charset!r}")
    raw = request.get_data(cache=False)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "bad_json", "body",
                       f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "bad_json", "body", f"the body is not valid JSON: {exc}") from None
    except ValueError as exc:
        # raised by the strict hooks, or by int() for numbers beyond Python's digit limit
        message = str(exc) if "digits" not in str(exc) else "a number has too many digits"
        raise ApiError(400, "bad_json", "body", f"the body is not valid JSON: {message}") from None
    except RecursionError:
        raise ApiError(400, "bad_json", "body", "JSON nests too deeply") from None


api = Blueprint("api", __name__)


@api.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers."""
    return _json({"status": "ok"})


@api.get("/readyz")
def readyz() -> Response:
    """Readiness: the database answers a query."""
    try:
        collector().storage.ping()
    except StorageError as exc:
        raise ApiError(503, "unavailable", None, str(exc), {"Retry-After": "5"}) from None
    return _json({"status": "ready"})


@api.get("/v1/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3.1 description of this API."""
    return _json(openapi_document(current_app.config["MAX_CONTENT_LENGTH"],
                                  collector().max_reports))


@api.get("/v1/metrics")
def metrics() -> Response:
    """The public metric registry clients encode against."""
    return Response(collector().registry_json, mimetype="application/json")


@api.post("/v1/reports")
def reports() -> Response:
    """Validate a batch, durably store its valid reports, answer per-report outcomes."""
    state = collector()
    if state.upload_token is not None:
        _check_bearer([state.upload_token])
    body = parse_json_body()
    try:
        result = validate_batch(body, state.registry, max_reports=state.max_reports)
    except WireFormatError as exc:
        raise ApiError(400, exc.code, exc.field, exc.message) from None
    stored = state.storage.insert(result.reports)
    return _json({
        "batch_id": result.batch_id,
        "accepted": stored.accepted,
        "duplicates": stored.duplicates,
        "rejected": len(result.errors),
        "errors": [error.to_dict() for error in result.errors],
    })


@api.get("/v1/metrics/<name>/counts")
def counts(name: str) -> Response:
    """Sufficient statistics for a metric over a range of days (bearer token)."""
    state = collector()
    if not state.read_tokens:
        raise ApiError(403, "reads_disabled", None,
                       "this collector has no read token configured; set one to read counts")
    _check_bearer(state.read_tokens)
    if name not in state.storage.registry:
        raise ApiError(404, "unknown_metric", "name",
                       f"unknown metric {name[:64]!r}; GET /v1/metrics lists the metrics")
    metric = state.storage.registry[name]
    unknown = sorted(set(request.args) - {"start", "end", "format"})
    if unknown:
        raise ApiError(400, "unknown_parameter", unknown[0][:64],
                       "is not a query parameter (allowed: start, end, format)")
    fmt = request.args.get("format", "json")
    if fmt not in ("json", "csv"):
        raise ApiError(400, "bad_format", "format", "must be 'json' or 'csv'")
    if fmt == "csv" and metric.params.as_rappor() is None:
        raise ApiError(400, "bad_format", "format",
                       f"csv (google/rappor counts.csv) exists only for metrics reported with "
                       f"RAPPOR bits (strings, categories); {name!r} is a {metric.kind} metric: "
                       "use format=json")
    days = {}
    for field in ("start", "end"):
        value = request.args.get(field)
        if value is not None and not _is_day(value):
            raise ApiError(400, "bad_date", field, "must be a UTC day written YYYY-MM-DD")
        days[field] = value
    if days["start"] and days["end"] and days["start"] > days["end"]:
        raise ApiError(400, "bad_date", "start", "must not be after end")
    try:
        document = state.storage.counts(metric, days["start"], days["end"])
    except TooFewReportsError as exc:
        raise ApiError(409, "too_few_reports", None, str(exc)) from None
    if fmt == "csv":
        text = io.StringIO()
        write_counts_document(document, text)
        return Response(text.getvalue(), mimetype="text/csv")
    return _json(document)


def _is_day(value: str) -> bool:
    if len(value) != 10 or not value.isascii():
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True
