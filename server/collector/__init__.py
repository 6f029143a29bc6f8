"""The collector: HTTP ingestion of randomized reports into storage, and its commands.

The public names load lazily (:mod:`veil.server.lazy`), so importing this
package (as the ``veil`` command does to list its subcommands) does not pull in Flask or NumPy.

>>> from veil.server.collector import create_app
"""

from __future__ import annotations

from veil.server.lazy import lazy_getattr

_EXPORTS = {
    "create_app": "veil.server.collector.app",
    "DEFAULTS": "veil.server.collector.config",
    "Collector": "veil.server.collector.app_state",
    "EXTENSION": "veil.server.collector.app_state",
    "ApiError": "veil.server.collector.responses",
    "openapi_document": "veil.server.collector.openapi",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
