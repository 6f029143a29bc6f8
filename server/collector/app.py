"""The collector's Flask application factory.

``create_app(config)`` builds the app in a fixed order: the defaults of
:mod:`veil.server.collector.config`, the given configuration, the registry and
storage, the error handlers, then the routes. Nothing happens at import time.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response

from veil.server.collector.app_state import EXTENSION, Collector
from veil.server.collector.config import DEFAULTS, storage_options
from veil.server.collector.proxies import TrustedProxyFix, trusted_networks
from veil.server.collector.rate_limits import upload_limits
from veil.server.collector.responses import json_response, register_error_handlers
from veil.server.collector.routes import api
from veil.server.storage import open_storage
from veil.server.tokens import checked_tokens
from veil.shared.errors import VeilError
from veil.shared.registry import Registry


class CollectorFlask(Flask):
    """Flask, answering ``OPTIONS`` in JSON like every other request."""

    def make_default_options_response(self) -> Response:
        """``{"allow": [methods]}`` and the ``Allow`` header, for any route."""
        methods = sorted(super().make_default_options_response().allow)
        return json_response({"allow": methods}, headers={"Allow": ", ".join(methods)})


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build a collector app; :mod:`veil.server.collector.config` lists the settings."""
    app = CollectorFlask(__name__)
    app.config.update(DEFAULTS)
    app.config.update(config or {})
    for key in ("REGISTRY", "DATABASE"):
        if app.config.get(key) is None:
            raise VeilError(f"the collector needs the {key} setting")
    registry = app.config["REGISTRY"]
    if not isinstance(registry, Registry):
        registry = Registry.load(registry)
    tokens = checked_tokens(app.config["READ_TOKENS"], "READ_TOKENS")
    upload_tokens = checked_tokens(app.config["UPLOAD_TOKEN"], "UPLOAD_TOKEN")
    metrics_tokens = checked_tokens(app.config["METRICS_TOKENS"], "METRICS_TOKENS")
    max_reports = app.config["MAX_REPORTS_PER_BATCH"]
    if isinstance(max_reports, bool) or not isinstance(max_reports, int) or max_reports < 1:
        raise VeilError(f"MAX_REPORTS_PER_BATCH must be a positive integer; got {max_reports!r}")
    storage = open_storage(app.config["DATABASE"], registry, create=True,
                           **storage_options(app.config))
    app.extensions[EXTENSION] = Collector(
        registry, storage, tokens, upload_tokens, max_reports, upload_limits(app.config),
        metrics_tokens=metrics_tokens,
    )
    proxies = trusted_networks(app.config["TRUSTED_PROXIES"], "TRUSTED_PROXIES",
                               "TRUSTED_PROXIES")
    if proxies and not app.config["PROXY_HOPS"]:
        raise VeilError("TRUSTED_PROXIES is set but PROXY_HOPS is 0, so no forwarded header is "
                        "read: set PROXY_HOPS (--proxy-hops) to the number of proxies in front")
    if app.config["PROXY_HOPS"]:
        app.wsgi_app = TrustedProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, app.config["PROXY_HOPS"], proxies)
    register_error_handlers(app)
    app.register_blueprint(api)
    return app
