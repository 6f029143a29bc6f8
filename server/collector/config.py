"""The collector's settings and their one table of defaults.

``create_app`` starts from :data:`DEFAULTS` and ``veil serve`` takes its
option defaults from it, so a default is written once. Importing this module
is cheap (no Flask, no NumPy): the ``veil`` command reads it to list options.

App settings (read by ``create_app``):

``REGISTRY``              registry TOML path or a :class:`~veil.shared.registry.Registry` (required)
``DATABASE``              storage URL or SQLite file path (required; created if missing)
``READ_TOKENS``           bearer tokens for read endpoints (a string or a list; none: reads refused)
``UPLOAD_TOKEN``          bearer token required to upload (default: uploads are open)
``MAX_CONTENT_LENGTH``    largest request body in bytes (default 8 MiB; larger gives 413)
``MAX_REPORTS_PER_BATCH`` largest batch (default 5,000 reports)
``RECENT_IDS_LIMIT``      new report ids kept before a merge into the id index
                          (SQLite only; default ``None``: the backend's own, ``veil.server.storage.RECENT_IDS_LIMIT``)

Serving settings (read by ``veil serve``, ignored by the app):

``HOST``, ``PORT``        where to listen (default 127.0.0.1:8080; port 0 picks a free one)
``THREADS``               threads serving requests in each worker process (default 4)
``WORKERS``               server processes sharing the listening socket (default 1)
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    "READ_TOKENS": (),
    "UPLOAD_TOKEN": None,
    "MAX_CONTENT_LENGTH": 8 * 1024 * 1024,
    "MAX_REPORTS_PER_BATCH": 5000,
    "RECENT_IDS_LIMIT": None,
    "HOST": "127.0.0.1",
    "PORT": 8080,
    "THREADS": 4,
    "WORKERS": 1,
}
