"""The collector's per-app state, kept in ``app.extensions`` (no module globals)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from flask import current_app

from veil.server.storage import Storage
from veil.shared.registry import Registry

EXTENSION = "veil"


class Collector:
    """What the routes need: registry served to clients, storage and limits."""

    def __init__(self, registry: Registry, storage: Storage, read_tokens: Iterable[str],
                 upload_token: str | None, max_reports: int) -> None:
        self.registry = registry
        self.storage = storage
        self.read_tokens = [token.encode("utf-8") for token in read_tokens]
        self.upload_token = upload_token.encode("utf-8") if upload_token else None
        self.max_reports = max_reports
        self.registry_json = json.dumps(registry.to_dict())


def current_collector() -> Collector:
    """The :class:`Collector` of the current app."""
    collector: Collector = current_app.extensions[EXTENSION]
    return collector
