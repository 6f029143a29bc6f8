"""Where counts come from: a running collector over HTTP, or its database file.

:func:`collected_counts` gives one counts document for a range of days,
:func:`daily_counts` one per day; both take the same sources (``db`` or ``server``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.shared.errors import ParameterError, VeilError

if TYPE_CHECKING:
    from veil.server.storage import Storage

TIMEOUT_SECONDS = 60.0
DAY_FORMAT = "%Y-%m-%d"
#: the most days ``daily_counts`` asks a collector for one by one
MAX_DAYS = 3660


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
    return _get(server, f"/v1/metrics/{metric}/counts", token,
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
        document = _get(server, "/v1/stats", token,
                        {"metric": metric, "start": start, "end": end}, timeout)
    except NotFound:
        return None
    return [entry["day"] for metrics in document.get("metrics", []) if metrics["metric"] == metric
            for entry in metrics.get("days", []) if entry.get("reports")]


def _get(server: str, path: str, token: str | None, query: dict[str, str | None],
         timeout: float) -> dict[str, Any]:
    """GET ``path`` from the collector with the read token; its JSON document."""
    import requests

    url = f"{server.rstrip('/')}{path}"
    query = {key: value for key, value in query.items() if value}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(url, params=query, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        raise SourceError(f"cannot reach the collector at {server}: {exc}") from None
    if response.status_code != 200:
        try:
            error = response.json().get("error", {})
            code = error.get("code", "error")
            detail = f"{code}: {error.get('message', '')}"
        except ValueError:
            code, detail = "", response.text[:200]
        hint = " (check --token: it must be a read token)" if response.status_code == 401 else ""
        message = f"GET {url} answered {response.status_code} {detail}{hint}"
        if code == "too_few_reports":
            raise TooFewReports(message)
        raise (NotFound if response.status_code == 404 else SourceError)(message)
    try:
        document: dict[str, Any] = response.json()
    except ValueError:
        raise SourceError(f"GET {url} did not return JSON") from None
    return document


def db_counts(
    path: str,
    metric: str,
    start: str | None = None,
    end: str | None = None,
    *,
    force: bool = False,
) -> dict[str, Any]:
    """The counts document for ``metric`` from a collector's database file, with the
    ``days`` it covers (those of the range that hold reports).

    Like the collector, refuses fewer reports than the metric's ``min_reports``
    unless ``force`` (the operator's explicit override).
    """
    storage = _open(path, metric)
    try:
        document = storage.counts(metric, start, end, min_reports=0 if force else None)
        document.setdefault("days", _covered(storage.days(metric), document["start"],
                                             document["end"]))
        return document
    finally:
        storage.close()


def _open(path: str, metric: str) -> Storage:
    """The storage at ``path`` (a file path or a URL), which must hold ``metric``."""
    from veil.server.storage import open_storage

    if "://" not in path and not Path(path).is_file():
        raise ParameterError("db", f"no collector database at {path}")
    storage = open_storage(path)
    if metric not in storage.registry:
        storage.close()
        known = ", ".join(sorted(storage.registry)) or "none"
        raise ParameterError("metric", f"{path} has no metric {metric!r}; it has: {known}")
    return storage


def _covered(days: list[str], start: str | None, end: str | None) -> list[str]:
    """The ``days`` within ``start``..``end`` (either open)."""
    return [day for day in days if (not start or day >= start) and (not end or day <= end)]


def _check_source(db: str | Path | None, server: str | None, force: bool) -> None:
    if (db is None) == (server is None):
        raise ParameterError("source", "give exactly one source: db (a collector's database "
                                       "file) or server (a collector's URL)")
    if force and server is not None:
        raise ParameterError("force", "force applies to a database file; a collector "
                                      "always honours its metrics' min_reports")


def collected_counts(
    metric: str,
    *,
    db: str | Path | None = None,
    server: str | None = None,
    token: str | None = None,
    start: str | None = None,
    end: str | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], str]:
    """The counts document of ``metric`` over ``start``..``end`` from a collector's
    database file (``db``) or its HTTP API (``server`` with a read ``token``), and a
    description of where it came from. ``force`` (``db`` only) decodes below the
    metric's ``min_reports``."""
    _check_source(db, server, force)
    if not metric:
        raise ParameterError("metric", "name the metric to decode (--metric NAME)")
    if server is not None:
        document = fetch_counts(server, token, metric, start, end)
        if "days" not in document:
            days = fetch_days(server, token, metric, start, end)
            if days is not None:
                document["days"] = days
        return document, f"{server} metric {metric}"
    return db_counts(str(db), metric, start, end, force=force), f"{db} metric {metric}"


def daily_counts(
    metric: str,
    *,
    db: str | Path | None = None,
    server: str | None = None,
    token: str | None = None,
    start: str | None = None,
    end: str | None = None,
    force: bool = False,
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, str]]:
    """One counts document per UTC day of ``start``..``end`` that holds reports, oldest
    first, and the days left out because they hold fewer reports than the metric's
    ``min_reports`` (day -> why). Sources as :func:`collected_counts`.

    A database lists its days, and so does a collector serving ``GET /v1/stats``; an
    older collector is asked for every calendar day from ``start`` to ``end`` (which
    must then be given).
    """
    from veil.server.storage import TooFewReportsError

    _check_source(db, server, force)
    documents: list[tuple[str, dict[str, Any]]] = []
    skipped: dict[str, str] = {}
    if db is not None:
        storage = _open(str(db), metric)
        try:
            for day in _covered(storage.days(metric), start, end):
                try:
                    document = storage.counts(metric, day, day, min_reports=0 if force else None)
                except TooFewReportsError as exc:
                    skipped[day] = f"{exc.reports} reports, fewer than min_reports {exc.min_reports}"
                    continue
                documents.append((day, {**document, "days": [day]}))
        finally:
            storage.close()
        return documents, skipped
    assert server is not None
    days = fetch_days(server, token, metric, start, end)
    for day in _calendar_days(start, end) if days is None else days:
        try:
            document = fetch_counts(server, token, metric, day, day)
        except TooFewReports:
            skipped[day] = "fewer reports than the metric's min_reports (or none)"
            continue
        documents.append((day, {**document, "days": [day]}))
    return documents, skipped


def _calendar_days(start: str | None, end: str | None) -> list[str]:
    """Every day from ``start`` to ``end``, both given as YYYY-MM-DD."""
    if not (start and end):
        raise ParameterError(
            "start", "decoding a collector's counts day by day needs the days: give start and "
                     "end (--start and --end), as the collector's counts do not list them")
    try:
        first = dt.datetime.strptime(start, DAY_FORMAT).date()
        last = dt.datetime.strptime(end, DAY_FORMAT).date()
    except ValueError:
        raise ParameterError("start", f"start and end must be days written YYYY-MM-DD; got "
                                      f"{start!r} and {end!r}") from None
    count = (last - first).days + 1
    if not 1 <= count <= MAX_DAYS:
        raise ParameterError("end", f"give an end on or after start, at most {MAX_DAYS} days "
                                    f"later; got {start} to {end}")
    return [(first + dt.timedelta(days=offset)).strftime(DAY_FORMAT) for offset in range(count)]
