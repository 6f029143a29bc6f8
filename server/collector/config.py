"""The collector's settings and their one table of defaults.

``create_app`` starts from :data:`DEFAULTS` and ``veil serve`` takes its
option defaults from it, so a default is written once. Importing this module
is cheap (no Flask, no NumPy): the ``veil`` command reads it to list options.

App settings (read by ``create_app``):

``REGISTRY``              registry TOML path or a :class:`~veil.shared.registry.Registry` (required)
``DATABASE``              storage URL or SQLite file path (required; created if missing)
``READ_TOKENS``           bearer tokens for read endpoints (a string or a list; none: reads refused)
``UPLOAD_TOKEN``          bearer token(s) required to upload (a string or a list; default: uploads
                          are open)
``METRICS_TOKENS``        bearer tokens that may scrape ``GET /metrics`` and nothing else (a string
                          or a list); a read token may scrape it too; with neither, it answers 403
``NETWORK_RATE``          reports a second each source network (/24, /48) may upload on average,
                          in bursts of ``RATE_BURST_SECONDS`` worth (default 0: no limit)
``TOKEN_RATE``            the same for each upload token (default 0: no limit)
``TOKEN_DAILY_CAP``       reports each upload token may have stored per UTC day, counted in the store
                          (so across workers and collectors); at least ``MAX_REPORTS_PER_BATCH``
                          and only with ``UPLOAD_TOKEN`` (default 0: no cap)
``RATE_BURST_SECONDS``    how many seconds of a rate a burst may use (default 10; a burst is never
                          smaller than ``MAX_REPORTS_PER_BATCH``)
``PROXY_HOPS``            reverse proxies in front whose ``X-Forwarded-For`` names the client
                          (default 0: the peer address is the client's)
``TRUSTED_PROXIES``       addresses or CIDR networks of those proxies: a request from any other
                          peer has its forwarded headers removed (default empty: any peer is
                          trusted, so bind the collector where only the proxies reach it)
``MAX_CONTENT_LENGTH``    largest request body in bytes (default 2 MiB; larger gives 413): twice
                          the SDK's default batch (1,000,000 bytes), room for 5,000 reports of up
                          to about 1,000 bits; the SDK halves a batch answered 413
``MAX_REPORTS_PER_BATCH`` largest batch (default 5,000 reports); it also bounds the JSON values a
                          body may hold before it is parsed (400 ``too_many`` above)
``RECENT_IDS_LIMIT``      new report ids kept before a merge into the id index
                          (SQLite only; default ``None``: the backend's own, ``veil.server.storage.RECENT_IDS_LIMIT``)
``FOLD_LIMIT``            new reports waiting before they are counted into the aggregates in bulk
                          (SQLite only; default ``None``: the backend's own, 32,768,
                          ``veil.server.storage.sqlite.tail.FOLD_LIMIT``)
``MIN_FREE_BYTES``        ``/readyz`` answers 503 while the database's filesystem has less free space
                          (SQLite only; default ``None``: the backend's own, 64 MiB,
                          ``veil.server.storage.MIN_FREE_BYTES``)

Serving settings (read by ``veil serve``, ignored by the app):

``HOST``, ``PORT``        where to listen (default 127.0.0.1:8080; port 0 picks a free one)
``THREADS``               threads serving requests in each worker process (default 4)
``WORKERS``               server processes sharing the listening socket (default 1)
``CONNECTION_LIMIT``      open connections each worker serves at once; more wait in the listen
                          backlog (default 1,000; waitress's is 100). Near the limit, idle
                          keep-alive connections are closed, longest idle first
``CHANNEL_TIMEOUT``       seconds a connection may stay silent (no request in progress, nothing
                          received or sent) before it is closed (default 30; waitress's is 120)
``RECEIVE_TIMEOUT``       seconds a client may take to send one request, headers and body, from
                          its first byte; a slower one is disconnected, so connections that trickle
                          bytes cannot hold the connection limit (default 30)
``DASHBOARD``             also serve the read-only dashboard at ``/dashboard`` to the read tokens
                          (default off; docs/dashboard.md)
``DASHBOARD_CANDIDATES``  with ``DASHBOARD``: a directory of ``<metric>.txt`` candidate files for
                          string metrics (default none)
``LOG_FORMAT``            ``text`` (default) or ``json``: one JSON object a line
``LOG_LEVEL``             ``debug``, ``info`` (default), ``warning`` or ``error``
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veil.shared.errors import ParameterError

#: the settings that tune a SQLite store, with the storage option and ``veil serve`` flag of each
SQLITE_SETTINGS = (("RECENT_IDS_LIMIT", "recent_ids_limit"), ("FOLD_LIMIT", "fold_limit"),
                   ("MIN_FREE_BYTES", "min_free_bytes"))

DEFAULTS: dict[str, Any] = {
    "READ_TOKENS": (),
    "UPLOAD_TOKEN": (),
    "METRICS_TOKENS": (),
    "NETWORK_RATE": 0.0,
    "TOKEN_RATE": 0.0,
    "TOKEN_DAILY_CAP": 0,
    "RATE_BURST_SECONDS": 10.0,
    "PROXY_HOPS": 0,
    "TRUSTED_PROXIES": (),
    "MAX_CONTENT_LENGTH": 2 * 1024 * 1024,
    "MAX_REPORTS_PER_BATCH": 5000,
    "RECENT_IDS_LIMIT": None,
    "FOLD_LIMIT": None,
    "MIN_FREE_BYTES": None,
    "HOST": "127.0.0.1",
    "PORT": 8080,
    "THREADS": 4,
    "WORKERS": 1,
    "CONNECTION_LIMIT": 1000,
    "CHANNEL_TIMEOUT": 30,
    "RECEIVE_TIMEOUT": 30,
    "DASHBOARD": False,
    "DASHBOARD_CANDIDATES": None,
    "LOG_FORMAT": "text",
    "LOG_LEVEL": "info",
}


def storage_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The storage options of ``config`` (the SQLite settings given), for ``open_storage``;
    :class:`ParameterError` naming the ``veil serve`` flag and the setting when one is given
    for a database that is not SQLite (its backend takes no such option)."""
    from veil.server.storage.backends import backend_for
    from veil.server.storage.sqlite import SQLiteStorage

    options = {option: config[key] for key, option in SQLITE_SETTINGS
               if config.get(key) is not None}
    url = str(config["DATABASE"])
    if options and backend_for(url) is not SQLiteStorage:
        key, option = next((k, o) for k, o in SQLITE_SETTINGS if o in options)
        raise ParameterError(option, f"--{option.replace('_', '-')} applies to SQLite stores only; "
                                     f"leave it out for {url.split('://', 1)[0]} databases "
                                     f"(setting {key})")
    return options
