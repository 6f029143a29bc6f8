"""A collector's HTTP read API, from outside: its counts, stats and raw reports.

:func:`get_json` asks any read endpoint with a read token and turns every failure into
a :class:`SourceError` that says what went wrong (:class:`NotFound`,
:class:`TooFewReports`); :func:`fetch_counts`, :func:`fetch_days` and
:func:`fetch_reports` read the endpoints the analysis, ``veil stats``, the simulations
and the benchmarks need. ``requests`` and NumPy load at the first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from veil.shared.errors import VeilError

if TYPE_CHECKING:
    import numpy as np

TIMEOUT_SECONDS = 60.0


class SourceError(VeilError):
    """The counts could not be fetched (network, authentication, too few reports)."""


class TooFewReports(SourceError):
    """The collector holds fewer reports in the range than the metric's ``min_reports``."""


class NotFound(SourceError):
    """The collector has no such metric, or does not serve the path asked for."""


def fetch_counts(
    server: str,
    token: str | None,
    metric: str,
    start: str | None = None,
    end: str | None = None,
    timeout: float = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """GET ``/v1/metrics/<metric>/counts`` (JSON) from a collector with a read token."""
    return get_json(server, f"/v1/metrics/{metric}/counts", token,
                    {"format": "json", "start": start, "end": end}, timeout)


def fetch_days(
    server: str,
    token: str | None,
    metric: str,
    start: str | None = None,
    end: str | None = None,
    timeout: float = TIMEOUT_SECONDS,
) -> list[str] | None:
    """The UTC days of ``start``..``end`` on which ``metric`` has reports, from the
    collector's ``GET /v1/stats``; None from a collector that does not serve it (404)."""
    try:
        document = get_json(server, "/v1/stats", token,
                            {"metric": metric, "start": start, "end": end}, timeout)
    except NotFound:
        return None
    return [entry["day"] for metrics in document.get("metrics", []) if metrics["metric"] == metric
            for entry in metrics.get("days", []) if entry.get("reports")]


def get_json(server: str, path: str, token: str | None, query: dict[str, str | None],
             timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    """GET ``path`` from the collector at ``server`` with a read ``token`` and the ``query``
    (empty values left out); its JSON object. Otherwise a :class:`SourceError` saying what
    went wrong: :class:`NotFound` for a 404, :class:`TooFewReports` for a range holding
    fewer reports than the metric's ``min_reports``."""
    response, url = _get(server, path, token, query, timeout)
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise SourceError(f"GET {url} did not return a JSON object")
    return body


def _get(server: str, path: str, token: str | None, query: dict[str, str | None],
         timeout: float, stream: bool = False) -> tuple[Any, str]:
    """The answer to GET ``path`` (a ``requests`` response, streamed with ``stream``) and its
    URL; a :class:`SourceError` as :func:`get_json` says unless it is 200."""
    import requests

    url = f"{server.rstrip('/')}{path}"
    query = {key: value for key, value in query.items() if value}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(url, params=query, headers=headers, timeout=timeout,
                                stream=stream)
    except requests.RequestException as exc:
        raise SourceError(f"cannot reach the collector at {server} ({network_reason(exc)}); "
                          "is it running, and is the URL right (--server or $VEIL_URL)?"
                          ) from None
    if response.status_code == 200:
        return response, url
    with response:
        try:
            body = response.json()
        except ValueError:
            body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "error"))
        detail = f"{code}: {error.get('message', '')}"
    else:
        code, detail = "", response.text[:200]
    hint = ""
    if response.status_code == 401:
        hint = " (give a read token: --token or $VEIL_READ_TOKEN)"
    elif response.status_code == 404 and code in ("", "not_found"):
        hint = f" (is {server} a Veil collector recent enough to serve GET {path}?)"
    message = f"GET {url} answered {response.status_code} {detail}{hint}"
    if code == "too_few_reports":
        raise TooFewReports(message)
    raise (NotFound if response.status_code == 404 else SourceError)(message)


def fetch_reports(
    server: str,
    token: str | None,
    metric: str,
    payload_size: int,
    start: str | None = None,
    end: str | None = None,
    timeout: float = TIMEOUT_SECONDS,
    chunk_reports: int = 262_144,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(cohorts, payloads)`` chunks of a metric's stored reports from the collector's
    ``GET /v1/metrics/<metric>/reports`` (records of a 2-byte big-endian cohort and
    ``payload_size`` bytes), streamed; errors as :func:`get_json` raises them."""
    import requests

    response, url = _get(server, f"/v1/metrics/{metric}/reports", token,
                         {"start": start, "end": end}, timeout, stream=True)
    with response:
        width = 2 + payload_size
        stated = response.headers.get("X-Veil-Record-Bytes")
        if stated not in (None, str(width)):
            raise SourceError(f"GET {url} sends records of {stated} bytes; this registry's "
                              f"parameters make them {width}")
        pending = b""
        try:
            for block in response.iter_content(chunk_size=width * chunk_reports):
                pending += block
                whole = len(pending) - len(pending) % width
                if whole >= width * chunk_reports:
                    yield _records(pending[:whole], width)
                    pending = pending[whole:]
        except requests.RequestException as exc:
            raise SourceError(f"reading {url} failed ({network_reason(exc)}); "
                              "run the command again") from None
        if len(pending) % width:
            raise SourceError(f"GET {url} ended inside a record")
        if pending:
            yield _records(pending, width)


def network_reason(exc: BaseException) -> str:
    """What went wrong under a ``requests`` error, in the operating system's words
    ("Connection refused", "Name or service not known"), or its kind ("timed out"),
    instead of urllib3's nested representation of its connection pool."""
    import requests

    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        if isinstance(cause, requests.exceptions.SSLError):
            return "the TLS handshake failed"
        nested = [cause.__cause__, cause.__context__, getattr(cause, "reason", None),
                  *(arg for arg in cause.args if isinstance(arg, BaseException))]
        cause = next((item for item in nested if isinstance(item, BaseException)), None)
    return type(exc).__name__


def _records(data: bytes, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Cohorts and payloads of whole records."""
    import numpy as np

    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    cohorts = (rows[:, 0].astype(np.int64) << 8) | rows[:, 1]
    return cohorts, rows[:, 2:]
