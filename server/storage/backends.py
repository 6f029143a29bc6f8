"""The backends by URL scheme, and the entry points that pick one: open, check and migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from veil.server.storage.base import CheckResult, Migration, Storage, StorageError
from veil.server.storage.sqlite import SQLiteStorage
from veil.shared.registry import Registry

#: the backend of each URL scheme, from the backends' own ``schemes``
BACKENDS: dict[str, type[Storage]] = {
    scheme: backend for backend in (SQLiteStorage,) for scheme in backend.schemes
}


def open_storage(url: str | Path, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, **options: Any) -> Storage:
    """Open the store at ``url``: ``sqlite:///path/veil.db`` or a plain file path (SQLite).

    With ``registry``, record it in the store (refusing parameter changes for
    metrics with reports); without, use the registry stored by the collector.
    ``create`` allows making a new store (the collector does; readers should not);
    a new store has the current schema. A store with an older schema raises
    :class:`~veil.server.storage.base.SchemaOutdatedError` unless ``migrate``, which
    upgrades it (each step logged on the ``veil.server.storage`` logger; the steps
    applied are :attr:`Storage.migrated`). Other keyword ``options`` go to the backend
    (SQLite: ``recent_ids_limit``, ``min_free_bytes``).
    """
    return _backend(str(url)).open(str(url), registry, create=create, migrate=migrate,
                                   **options)


def pending_migrations(url: str | Path) -> list[Migration]:
    """The schema steps the store at ``url`` needs, without changing it
    (:meth:`Storage.pending_migrations`)."""
    return _backend(str(url)).pending_migrations(str(url))


def check_storage(url: str | Path) -> CheckResult:
    """Examine the store at ``url`` whole, without changing it (:meth:`Storage.check`)."""
    return _backend(str(url)).check(str(url))


def _backend(url: str) -> type[Storage]:
    """The backend of ``url``'s scheme (a plain path is SQLite)."""
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else "sqlite"
    backend = BACKENDS.get(scheme)
    if backend is None:
        raise StorageError(
            f"no storage backend for {scheme!r} URLs (known: {', '.join(sorted(BACKENDS))}); "
            "give a file path or sqlite:///path"
        )
    return backend
