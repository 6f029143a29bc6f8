"""The collector's HTTP API: one blueprint, registered by ``create_app``.

Request bodies are parsed strictly: UTF-8 only, no NaN or Infinity, no
duplicate keys, nesting bounded by the parser's recursion limit and integers
by Python's 4,300-digit limit, so malformed input is a 4xx, never a 5xx. The
number of JSON values is bounded before parsing (:func:`max_json_values`), so a
body of tiny values (``[{},{},...]``) cannot cost tens of bytes of memory per
byte sent. The routes store and log no client address or user agent, and count batches
in the collector's own metrics (``GET /metrics``) by outcome only.
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from veil.server.collector.app_state import Collector, current_collector
from veil.server.collector.openapi import openapi_document
from veil.server.collector.prometheus import CONTENT_TYPE
from veil.server.collector.rate_limits import network_of
from veil.server.collector.responses import (
    ANSWERED,
    ApiError,
    error_code,
    json_response,
    too_large_message,
)
from veil.server.counts import write_counts_document
from veil.server.storage import DailyCapReached, StorageUnavailable, TooFewReportsError
from veil.server.tokens import bearer_token, matching_token
from veil.shared.errors import WireFormatError
from veil.shared.registry import Metric
from veil.shared.wire import BATCH_KEYS, REPORT_KEYS, validate_batch

api = Blueprint("api", __name__)


@api.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers."""
    return json_response({"status": "ok"})


@api.get("/readyz")
def readyz() -> Response:
    """Readiness: writes can be expected to succeed (``Storage.ping``)."""
    try:
        current_collector().storage.ping()
    except StorageUnavailable as exc:
        raise ApiError(503, error_code(exc), None, str(exc), {"Retry-After": "5"}) from None
    return json_response({"status": "ready"})


@api.get("/v1/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3.1 description of this API."""
    return json_response(openapi_document(current_app.config["MAX_CONTENT_LENGTH"],
                                          current_collector().max_reports))


@api.get("/v1/metrics")
def metrics() -> Response:
    """The public metric registry clients encode against."""
    return Response(current_collector().registry_json, mimetype="application/json")


@api.get("/metrics")
def prometheus_metrics() -> Response:
    """The collector's own counters in Prometheus' text format (a metrics or read token)."""
    state = current_collector()
    if not state.scrape_tokens:
        raise ApiError(403, "metrics_disabled", None,
                       "this collector has no metrics or read token configured; start it with "
                       "--metrics-token (or --read-token) and scrape with that bearer token")
    _check_bearer(state.scrape_tokens)
    return Response(state.server_metrics.exposition(), content_type=CONTENT_TYPE)


@api.post("/v1/reports")
def reports() -> Response:
    """Validate a batch, durably store its valid reports, answer per-report outcomes; count
    the outcome in the collector's metrics (``GET /metrics``)."""
    state = current_collector()
    started = time.perf_counter()
    try:
        receipt = _store_batch(state)
    except ANSWERED as exc:
        state.server_metrics.batch_refused(error_code(exc))
        raise
    state.server_metrics.batch_stored(receipt["accepted"], receipt["duplicates"],
                                      (error["code"] for error in receipt["errors"]),
                                      time.perf_counter() - started)
    return json_response(receipt)


def _store_batch(state: Collector) -> dict[str, Any]:
    """The receipt of the request's batch, once its valid reports are durably stored;
    :class:`ApiError` for a batch refused whole."""
    token = _check_bearer(state.upload_tokens) if state.upload_tokens else None
    body = parse_json_body(state.max_reports)
    try:
        result = validate_batch(body, state.registry, max_reports=state.max_reports)
    except WireFormatError as exc:
        raise ApiError(400, exc.code, exc.field, exc.message) from None
    refused = state.limits.check(network_of(request.remote_addr),
                                 None if token is None else token.decode(),
                                 len(result.reports) + len(result.errors))
    if refused is not None:
        raise _rate_limited(*refused)
    try:
        stored = state.storage.insert(result.reports, cap=state.limits.daily_cap(token))
    except DailyCapReached as exc:
        raise _rate_limited(exc.retry_after, (
            f"this batch would take its upload token over its cap of {exc.limit} reports a "
            f"day ({exc.stored} stored on {exc.day}, UTC)")) from None
    return {
        "batch_id": result.batch_id,
        "accepted": stored.accepted,
        "duplicates": stored.duplicates,
        "rejected": len(result.errors),
        "errors": [error.to_dict() for error in result.errors],
    }


def _rate_limited(wait: float, why: str) -> ApiError:
    """429 ``rate_limited`` for a batch refused whole by a limit: ``why``, and ``Retry-After``
    ``wait`` seconds (rounded up)."""
    seconds = math.ceil(wait)
    return ApiError(429, "rate_limited", None,
                    f"{why}; retry after {seconds} s (nothing was stored)",
                    {"Retry-After": str(seconds)})


@api.get("/v1/metrics/<name>/counts")
def counts(name: str) -> Response:
    """Sufficient statistics for a metric over a range of days (bearer token)."""
    state = _require_read("counts")
    metric = _metric_or_404(state, name, "name")
    _only_parameters("start", "end", "format")
    fmt = request.args.get("format", "json")
    if fmt not in ("json", "csv"):
        raise ApiError(400, "bad_format", "format", "must be 'json' or 'csv'")
    if fmt == "csv" and metric.params.as_rappor() is None:
        raise ApiError(400, "bad_format", "format",
                       f"csv (google/rappor counts.csv) exists only for metrics reported with "
                       f"RAPPOR bits (strings, RAPPOR categories); {name!r} is a "
                       f"{metric.params.mechanism_name} metric: "
                       "use format=json")
    start, end = _day_args()
    try:
        document = state.storage.counts(metric, start, end)
    except TooFewReportsError as exc:
        raise ApiError(409, "too_few_reports", None, str(exc)) from None
    if fmt == "csv":
        text = io.StringIO()
        write_counts_document(document, text)
        return Response(text.getvalue(), mimetype="text/csv")
    return json_response(document)


#: bytes of a raw report's cohort in ``GET /v1/metrics/<name>/reports``
RECORD_COHORT_BYTES = 2


@api.get("/v1/metrics/<name>/reports")
def raw_reports(name: str) -> Response:
    """A metric's stored reports over a range of days, for analyses that read them raw
    (discovery channels): fixed-size records of the cohort (2 bytes, big-endian) and the
    payload's bytes, streamed (bearer token and ``min_reports``, as counts)."""
    state = _require_read("reports")
    metric = _metric_or_404(state, name, "name")
    _only_parameters("start", "end")
    if not metric.params.reads_raw_reports:
        raise ApiError(400, "counts_suffice", "name",
                       f"{name!r} is analysed from its counts: GET /v1/metrics/{name}/counts")
    start, end = _day_args()
    try:  # min_reports >= 1, so at least one chunk, read before the 200
        chunks = state.storage.raw_reports(name, start, end)
    except TooFewReportsError as exc:
        raise ApiError(409, "too_few_reports", None, str(exc)) from None
    first = next(chunks)

    def records() -> Iterator[bytes]:
        for chunk in itertools.chain([first], chunks):
            cohorts = chunk.cohorts.astype(">u2").view(np.uint8).reshape(-1, RECORD_COHORT_BYTES)
            yield np.hstack([cohorts, chunk.payloads]).tobytes()

    width = RECORD_COHORT_BYTES + first.payloads.shape[1]
    return Response(records(), mimetype="application/octet-stream",
                    headers={"X-Veil-Record-Bytes": str(width)})


@api.get("/v1/stats")
def stats() -> Response:
    """Reports per metric and UTC day, from the aggregates (bearer token, as counts)."""
    state = _require_read("stats")
    _only_parameters("metric", "start", "end")
    name = request.args.get("metric")
    if name is not None:
        _metric_or_404(state, name, "metric")
    start, end = _day_args()
    return json_response(state.storage.stats(name, start, end))


def _require_read(what: str) -> Collector:
    """The collector, once the request carries one of its read tokens: 403 ``reads_disabled``
    if it has none (``what`` names what cannot be read), else 401 without a valid one."""
    state = current_collector()
    if not state.read_tokens:
        raise ApiError(403, "reads_disabled", None,
                       f"this collector has no read token configured; set one to read {what}")
    _check_bearer(state.read_tokens)
    return state


def _metric_or_404(state: Collector, name: str, field: str) -> Metric:
    """The metric called ``name``; 404 ``unknown_metric`` naming ``field`` if there is none."""
    metric: Metric | None = state.storage.registry.get(name)
    if metric is None:
        raise ApiError(404, "unknown_metric", field,
                       f"unknown metric {name[:64]!r}; GET /v1/metrics lists the metrics")
    return metric


def _only_parameters(*allowed: str) -> None:
    """400 ``unknown_parameter`` naming the first query parameter not in ``allowed``."""
    unknown = sorted(set(request.args) - set(allowed))
    if unknown:
        raise ApiError(400, "unknown_parameter", unknown[0][:64],
                       f"is not a query parameter (allowed: {', '.join(allowed)})")


def _day_args() -> tuple[str | None, str | None]:
    """The ``start`` and ``end`` query parameters (``None`` when absent); 400 ``bad_date``
    unless each is a UTC day written YYYY-MM-DD and start is not after end."""
    days = {field: request.args.get(field) for field in ("start", "end")}
    for field, value in days.items():
        if value is not None and not _is_day(value):
            raise ApiError(400, "bad_date", field, "must be a UTC day written YYYY-MM-DD")
    start, end = days["start"], days["end"]
    if start and end and start > end:
        raise ApiError(400, "bad_date", "start", "must not be after end")
    return start, end


def max_json_values(max_reports: int) -> int:
    """The objects, arrays and commas allowed in a batch body of at most ``max_reports`` reports.

    A valid batch has at most one object and one comma per report field (and one
    comma between reports), plus the batch's own: twice that is allowed, so that
    reports with stray fields still get their own errors.
    """
    return 2 * (max_reports * (len(REPORT_KEYS) + 1) + len(BATCH_KEYS) + 1)


def parse_json_body(max_reports: int) -> Any:
    """The body of a batch of at most ``max_reports`` reports as strict JSON; :class:`ApiError`
    (4xx) for anything else, and ``too_many`` for more objects, arrays and commas than
    :func:`max_json_values` (counted in the raw bytes, before any object is built)."""
    if request.mimetype != "application/json":
        raise ApiError(415, "unsupported_media_type", "Content-Type",
                       "send the batch with 'Content-Type: application/json'")
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, "unsupported_media_type", "Content-Type",
                       f"the body must be UTF-8 JSON; got charset {charset!r}")
    coding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise ApiError(415, "unsupported_media_type", "Content-Encoding",
                       f"the collector takes uncompressed JSON; got Content-Encoding {coding!r}: "
                       "send the batch without compressing it")
    raw = request.get_data(cache=False)
    _refuse_a_cut_body(raw)
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    max_values = max_json_values(max_reports)
    if values > max_values:
        raise ApiError(400, "too_many", "body",
                       f"the body has {values} JSON objects, arrays and commas; a batch of at most "
                       f"{max_reports} reports has at most {max_values}: split it")
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


def _refuse_a_cut_body(raw: bytes) -> None:
    """413 for a body without ``Content-Length`` (chunked) that ran past the limit: a WSGI
    server that does not buffer it (waitress does) hands the application a stream that werkzeug
    stops at the limit without a word, so the body read may be its first ``MAX_CONTENT_LENGTH``
    bytes only. One more byte says whether it was whole."""
    limit = current_app.config.get("MAX_CONTENT_LENGTH")
    if request.content_length is not None or limit is None or len(raw) < limit:
        return
    try:
        more = request.stream.read(1)
    except RequestEntityTooLarge:
        more = b"?"
    if more:
        raise ApiError(413, "body_too_large", None, too_large_message(limit))


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


def _check_bearer(tokens: list[bytes]) -> bytes:
    """Accept the request only with ``Authorization: Bearer <one of tokens>``; return it."""
    given = bearer_token(request.headers.get("Authorization"))
    challenge = {"WWW-Authenticate": 'Bearer realm="veil"'}
    if given is None:
        raise ApiError(401, "unauthorized", "Authorization",
                       "send the header 'Authorization: Bearer <token>'", challenge)
    matched = matching_token(given, tokens)
    if matched is None:
        raise ApiError(401, "unauthorized", "Authorization", "the bearer token is not valid",
                       challenge)
    return matched


def _is_day(value: str) -> bool:
    if len(value) != 10 or not value.isascii():
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True
