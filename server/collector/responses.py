"""JSON responses: the body helper, :class:`ApiError` and the app's error handlers.

Errors are JSON ``{"error": {"code", "field", "message"}}``; an unusable
database gives 503 with ``Retry-After``. There is no catch-all handler: a bug
stays a 500 with its traceback in the log.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Flask, Response, current_app
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from veil.server.storage import StorageUnavailable


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


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` serialized as an ``application/json`` response."""
    return Response(json.dumps(body), status=status, headers=headers,
                    mimetype="application/json")


def register_error_handlers(app: Flask) -> None:
    """Answer API errors, HTTP errors and storage failures (:data:`ANSWERED`) as JSON."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(StorageUnavailable, _storage_unavailable)


#: the exceptions the app's error handlers answer in the JSON error shape
ANSWERED: tuple[type[Exception], ...] = (ApiError, HTTPException, StorageUnavailable)


def error_code(exc: Exception) -> str:
    """The error code of the app's answer to ``exc``: its own for an :class:`ApiError`, that of
    its status for an HTTP error (``unavailable`` for a storage failure, a 503), else
    ``internal_error`` (a bug: a 500)."""
    if isinstance(exc, ApiError):
        return exc.code
    if isinstance(exc, StorageUnavailable):
        return http_error_code(503)
    if isinstance(exc, HTTPException):
        return http_error_code(exc.code or 500)
    return http_error_code(500)


def _api_error(exc: ApiError) -> Response:
    return json_response(exc.to_dict(), exc.status_code, exc.headers)


def _storage_unavailable(exc: StorageUnavailable) -> Response:
    """The database cannot take the request now (disk full, I/O error, closing): 503, retry."""
    current_app.logger.error("storage unavailable: %s", exc)
    return _api_error(ApiError(503, error_code(exc), None,
                               "the collector cannot store or read reports right now; "
                               "retry later (nothing from this request was stored)",
                               {"Retry-After": "5"}))


_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
    408: "request_timeout", 413: "body_too_large", 415: "unsupported_media_type",
    429: "too_many_requests", 431: "headers_too_large", 500: "internal_error",
    501: "not_implemented", 503: "unavailable",
}


def http_error_code(status: int) -> str:
    """The error code of an HTTP error ``status`` that has no more specific code."""
    return _HTTP_CODES.get(status, "http_error")


def http_error_body(status: int, message: str) -> dict[str, Any]:
    """The JSON error body for an HTTP error ``status`` that has no more specific code."""
    return {"error": {"code": http_error_code(status), "field": None, "message": message}}


def too_large_message(limit: int) -> str:
    """The message of a 413 answer to a body over ``limit`` bytes."""
    return f"the request body is larger than {limit} bytes; send smaller batches"


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    message = exc.description or exc.name
    if status == 413:
        message = too_large_message(current_app.config["MAX_CONTENT_LENGTH"])
    body = http_error_body(status, message)
    allowed = exc.valid_methods if isinstance(exc, MethodNotAllowed) else None
    headers = {"Allow": ", ".join(allowed)} if allowed else None
    return json_response(body, status, headers)
