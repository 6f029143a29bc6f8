"""The backends by URL scheme, and the entry points that pick one: open, check and migrations."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from veil.server.storage.base import CheckResult, Migration, Storage
from veil.server.storage.errors import StorageError
from veil.shared.registry import Registry

#: each backend class (``module:Class``), the extra that installs its driver, and its URL
#: schemes: the one list of them (the table needs no backend imported)
_REGISTERED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("veil.server.storage.sqlite:SQLiteStorage", "server", ("sqlite",)),
    ("veil.server.storage.postgres:PostgresStorage", "postgres", ("postgresql", "postgres")),
)

#: the backend class of each URL scheme (``module:Class``), imported on first use so a
#: backend's driver is needed only by those who use it, and the extra that installs it
BACKENDS: dict[str, tuple[str, str]] = {
    scheme: (target, extra) for target, extra, schemes in _REGISTERED for scheme in schemes
}


def open_storage(url: str | Path, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, **options: Any) -> Storage:
    """Open the store at ``url``: ``sqlite:///path/veil.db`` or a plain file path (SQLite),
    or ``postgresql://user@host/dbname`` (PostgreSQL, the ``postgres`` extra).

    With ``registry``, record it in the store (refusing parameter changes for
    metrics with reports); without, use the registry stored by the collector.
    ``create`` allows making a new store (the collector does; readers should not);
    a new store has the current schema. A store with an older schema raises
    :class:`~veil.server.storage.errors.SchemaOutdatedError` unless ``migrate``, which
    upgrades it (each step logged on the ``veil.server.storage`` logger; the steps
    applied are :attr:`Storage.migrated`). Other keyword ``options`` go to the backend
    (SQLite: ``recent_ids_limit``, ``min_free_bytes``, ``fold_limit``; PostgreSQL: ``replay_window_days``,
    ``pool_size``).
    """
    return backend_for(str(url)).open(str(url), registry, create=create, migrate=migrate,
                                   **options)


def pending_migrations(url: str | Path) -> list[Migration]:
    """The schema steps the store at ``url`` needs, without changing it
    (:meth:`Storage.pending_migrations`)."""
    return backend_for(str(url)).pending_migrations(str(url))


def check_storage(url: str | Path) -> CheckResult:
    """Examine the store at ``url`` whole, without changing it (:meth:`Storage.check`)."""
    return backend_for(str(url)).check(str(url))


def backend_class(scheme: str) -> type[Storage]:
    """The backend class of URL ``scheme``; :class:`StorageError` naming the extra to install
    when its driver is missing, or the known schemes."""
    entry = BACKENDS.get(scheme)
    if entry is None:
        raise StorageError(
            f"no storage backend for {scheme!r} URLs (known: {', '.join(sorted(BACKENDS))}); "
            "give a file path, sqlite:///path or postgresql://user@host/dbname"
        )
    target, extra = entry
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StorageError(f"{scheme} URLs need {exc.name}: pip install 'veil[{extra}]'") from None
    backend: type[Storage] = getattr(module, class_name)
    return backend


def backend_for(url: str) -> type[Storage]:
    """The backend of ``url``'s scheme (a plain path is SQLite)."""
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else "sqlite"
    return backend_class(scheme)
