"""Where counts come from: a running collector over HTTP, or its SQLite file."""

from __future__ import annotations

from typing import Any

from veil.shared.errors import ParameterError, VeilError

TIMEOUT_SECONDS = 60.0


class SourceError(VeilError):
    """The counts could not be fetched (network, authentication, too few reports)."""


def fetch_counts(
    server: str,
    token: str | None,
    metric: str,
    start: str | None = None,
    end: str | None = None,
    timeout: float = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """GET ``/v1/metrics/<metric>/counts`` (JSON) from a collector with a read token."""
    import requests

    url = f"{server.rstrip('/')}/v1/metrics/{metric}/counts"
    query = {"format": "json"}
    if start:
        query["start"] = start
    if end:
        query["end"] = end
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(url, params=query, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        raise SourceError(f"cannot reach the collector at {server}: {exc}") from None
    if response.status_code != 200:
        try:
            error = response.json().get("error", {})
            detail = f"{error.get('code', 'error')}: {error.get('message', '')}"
        except ValueError:
            detail = response.text[:200]
        hint = " (check --token: it must be a read token)" if response.status_code == 401 else ""
        raise SourceError(f"GET {url} answered {response.status_code} {detail}{hint}")
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
    """The counts document for ``metric`` from a collector's SQLite file.

    Like the collector, refuses fewer reports than the metric's ``min_reports``
    unless ``force`` (the operator's explicit override).
    """
    from pathlib import Path

    from veil.server.storage import open_storage

    if not Path(path).is_file():
        raise ParameterError("db", f"no collector database at {path}")
    storage = open_storage(path)
    try:
        if metric not in storage.registry:
            known = ", ".join(sorted(storage.registry)) or "none"
            raise ParameterError("metric", f"{path} has no metric {metric!r}; it has: {known}")
        return storage.counts(metric, start, end, min_reports=0 if force else None)
    finally:
        storage.close()
