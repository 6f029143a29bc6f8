"""The dashboard's Flask application factory, and its mounting in a collector.

``create_dashboard(config)`` builds a stand-alone app (``veil dashboard``) in a fixed
order: the settings, the source, the decodes, then the routes. ``mount(app, ...)`` adds
the same routes under ``/dashboard`` to a collector app (``veil serve --dashboard``),
reading the collector's own store with its read tokens. Nothing happens at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Flask

from veil.server.dashboard.decodes import Candidates, Decodes
from veil.server.dashboard.sources import DashboardSource
from veil.server.dashboard.views import EXTENSION, Dashboard, dashboard
from veil.shared.errors import VeilError

if TYPE_CHECKING:
    from veil.server.storage import Storage

#: where ``veil serve --dashboard`` serves the dashboard
MOUNT_PREFIX = "/dashboard"
#: the settings of :func:`create_dashboard` and their defaults
DEFAULTS: dict[str, Any] = {
    "DATABASE": None,        # a store's path or URL, or
    "SERVER": None,          # a collector's URL, read with
    "SERVER_TOKEN": None,    # its read token
    "READ_TOKENS": [],       # the tokens that open the dashboard
    "CANDIDATES": None,      # a directory of <metric>.txt candidate files
}


def create_dashboard(config: dict[str, Any] | None = None) -> Flask:
    """A stand-alone dashboard app; :data:`DEFAULTS` lists the settings."""
    app = Flask(__name__, static_folder=None)
    app.config.update(DEFAULTS)
    app.config.update(config or {})
    database, server = app.config["DATABASE"], app.config["SERVER"]
    if (database is None) == (server is None):
        raise VeilError("the dashboard reads one source: give --db (a collector's store) or "
                        "--server (a collector's URL, with its read token)")
    tokens = list(app.config["READ_TOKENS"] or [])
    if not tokens:
        raise VeilError("the dashboard shows nothing without a read token: give --read-token "
                        "(or set VEIL_READ_TOKEN)")
    if server is not None and not app.config["SERVER_TOKEN"]:
        raise VeilError("--server needs the collector's read token: give --token (or set "
                        "VEIL_READ_TOKEN)")
    source = DashboardSource(db=database, server=server, token=app.config["SERVER_TOKEN"])
    _install(app, source, tokens, app.config["CANDIDATES"])
    app.register_blueprint(dashboard)
    return app


def mount(app: Flask, storage: Storage, tokens: list[str], candidates: str | Path | None = None,
          exposition: Callable[[], bytes] | None = None) -> None:
    """Serve the dashboard at :data:`MOUNT_PREFIX` of a collector ``app``, over its open
    ``storage``, to its read ``tokens``; ``exposition`` gives its Prometheus text."""
    if not tokens:
        raise VeilError("--dashboard needs a read token (--read-token or VEIL_READ_TOKEN): the "
                        "dashboard shows nothing without one")
    _install(app, DashboardSource(storage=storage, exposition=exposition), tokens, candidates)
    app.register_blueprint(dashboard, url_prefix=MOUNT_PREFIX)


def _install(app: Flask, source: DashboardSource, tokens: list[str],
             candidates: str | Path | None) -> None:
    if candidates is not None and not Path(candidates).is_dir():
        raise VeilError(f"--candidates {candidates}: not a directory; give a directory holding "
                        "<metric>.txt files, one candidate string a line")
    app.extensions[EXTENSION] = Dashboard(Decodes(source, Candidates(candidates)), tokens)
