"""The collector's per-app state, kept in ``app.extensions`` (no module globals)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from flask import current_app

from veil.server.collector.prometheus import ServerMetrics
from veil.server.collector.rate_limits import UploadLimits
from veil.server.storage import Storage
from veil.shared.registry import Registry

EXTENSION = "veil"


class Collector:
    """What the routes need: registry served to clients, storage, tokens, limits and the
    collector's own metrics (``GET /metrics``)."""

    def __init__(self, registry: Registry, storage: Storage, read_tokens: Iterable[str],
                 upload_tokens: Iterable[str], max_reports: int,
                 limits: UploadLimits | None = None, *, metrics_tokens: Iterable[str] = ()) -> None:
        self.registry = registry
        self.storage = storage
        self.read_tokens = [token.encode("utf-8") for token in read_tokens]
        self.upload_tokens = [token.encode("utf-8") for token in upload_tokens]
        #: tokens that may scrape ``GET /metrics``: the metrics tokens and the read tokens
        self.scrape_tokens = [token.encode("utf-8") for token in metrics_tokens] + self.read_tokens
        self.server_metrics = ServerMetrics(storage.location)
        self.max_reports = max_reports
        self.limits = limits or UploadLimits()
        self.registry_json = json.dumps(registry.to_dict())


def current_collector() -> Collector:
    """The :class:`Collector` of the current app."""
    collector: Collector = current_app.extensions[EXTENSION]
    return collector
