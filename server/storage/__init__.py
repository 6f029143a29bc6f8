"""Durable storage of randomized reports and their per-cohort statistics, behind one interface.

:class:`Storage` (in :mod:`~veil.server.storage.base`) is everything the
collector, the command line and the analysis use; :func:`open_storage` picks a
backend from a URL or a path. Backends live in subpackages (``sqlite``) and
register in :data:`BACKENDS` by their URL schemes. Policies that are the same
for every backend (registry compatibility, ``min_reports``, day ranges) live in
:mod:`~veil.server.storage.base`, above the backends.

>>> with open_storage("veil.db") as storage:                 # doctest: +SKIP
...     document = storage.counts("homepage", "2026-11-01", "2026-11-30")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from veil.server.storage.base import (
    InsertResult,
    RegistryMismatchError,
    Storage,
    StorageError,
    StorageUnavailable,
    TooFewReportsError,
)
from veil.server.storage.sqlite import RECENT_IDS_LIMIT, SQLiteStorage
from veil.shared.registry import Registry

#: the backend of each URL scheme, from the backends' own ``schemes``
BACKENDS: dict[str, type[Storage]] = {
    scheme: backend for backend in (SQLiteStorage,) for scheme in backend.schemes
}


def open_storage(url: str | Path, registry: Registry | None = None, *, create: bool = False,
                 **options: Any) -> Storage:
    """Open the store at ``url``: ``sqlite:///path/veil.db`` or a plain file path (SQLite).

    With ``registry``, record it in the store (refusing parameter changes for
    metrics with reports); without, use the registry stored by the collector.
    ``create`` allows making a new store (the collector does; readers should not).
    Other keyword ``options`` go to the backend (SQLite: ``recent_ids_limit``).
    """
    text = str(url)
    scheme = text.split("://", 1)[0].split("+", 1)[0] if "://" in text else "sqlite"
    backend = BACKENDS.get(scheme)
    if backend is None:
        raise StorageError(
            f"no storage backend for {scheme!r} URLs (known: {', '.join(sorted(BACKENDS))}); "
            "give a file path or sqlite:///path"
        )
    return backend.open(text, registry, create=create, **options)


__all__ = [
    "BACKENDS",
    "RECENT_IDS_LIMIT",
    "InsertResult",
    "RegistryMismatchError",
    "SQLiteStorage",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "TooFewReportsError",
    "open_storage",
]
