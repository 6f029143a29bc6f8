"""The collector: HTTP ingestion of randomized reports into storage, and its commands.

The public names load lazily, so importing this package (as the ``veil``
command does to list its subcommands) does not pull in Flask or NumPy.

>>> from veil.server.collector import create_app
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "veil.server.collector.app",
    "DEFAULTS": "veil.server.collector.config",
    "Collector": "veil.server.collector.state",
    "EXTENSION": "veil.server.collector.state",
    "ApiError": "veil.server.collector.responses",
    "openapi_document": "veil.server.collector.openapi",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
