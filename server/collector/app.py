"""The collector's Flask application factory.

``create_app(config)`` builds the app in a fixed order: the defaults of
:mod:`veil.server.collector.config`, the given configuration, the registry and
storage, the error handlers, then the routes. Nothing happens at import time.
"""

from __future__ import annotations

import re
from typing import Any

from flask import Flask

from veil.server.collector.config import DEFAULTS
from veil.server.collector.responses import register_error_handlers
from veil.server.collector.routes import api
from veil.server.collector.state import EXTENSION, Collector
from veil.server.storage import open_storage
from veil.shared.errors import VeilError
from veil.shared.registry import Registry

#: RFC 6750's b64token: what a bearer token may be made of
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build a collector app; :mod:`veil.server.collector.config` lists the settings."""
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
    for setting, values in (("READ_TOKENS", tokens), ("UPLOAD_TOKEN", [app.config["UPLOAD_TOKEN"]])):
        for token in values:
            if token is not None and not _TOKEN.fullmatch(token):
                raise VeilError(
                    f"{setting}: a bearer token may hold only letters, digits and - . _ ~ + / "
                    "(then = padding), as RFC 6750 says; HTTP headers carry nothing else "
                    "reliably. Generate one with: python3 -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))'"
                )
    max_reports = app.config["MAX_REPORTS_PER_BATCH"]
    if isinstance(max_reports, bool) or not isinstance(max_reports, int) or max_reports < 1:
        raise VeilError(f"MAX_REPORTS_PER_BATCH must be a positive integer; got {max_reports!r}")
    options = {} if app.config["RECENT_IDS_LIMIT"] is None else {
        "recent_ids_limit": app.config["RECENT_IDS_LIMIT"]}
    storage = open_storage(app.config["DATABASE"], registry, create=True, **options)
    app.extensions[EXTENSION] = Collector(
        registry, storage, tokens, app.config["UPLOAD_TOKEN"], max_reports
    )
    register_error_handlers(app)
    app.register_blueprint(api)
    return app
