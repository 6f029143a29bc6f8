"""The collector (HTTP ingestion and storage) and the offline analysis.

Importing this package is cheap; Flask, NumPy and SciPy load only with the
modules that need them. ``veil.server.create_app`` is resolved on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from veil.server.app import create_app

        return create_app
    raise AttributeError(f"module 'veil.server' has no attribute {name!r}")
