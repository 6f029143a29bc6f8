"""Durable storage of randomized reports and their per-cohort statistics, behind one interface.

:class:`Storage` (in :mod:`~veil.server.storage.base`) is everything the
collector, the command line and the analysis use; :func:`open_storage` picks a
backend from a URL or a path. The backends, SQLite and PostgreSQL, live in
subpackages (``sqlite``, ``postgres``) and register in :data:`BACKENDS`
(:mod:`~veil.server.storage.backends`) by their URL schemes. Policies that are
the same for every backend (registry compatibility, ``min_reports``, day
ranges) live in :mod:`~veil.server.storage.base`, above the backends.

The public names load lazily (:mod:`veil.server.lazy`), so importing this
package (as the ``veil`` command does to list ``veil check``) does not pull in NumPy.

>>> with open_storage("veil.db") as storage:                 # doctest: +SKIP
...     document = storage.counts("homepage", "2026-11-01", "2026-11-30")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.server.lazy import lazy_getattr

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first use
    from veil.server.storage.backends import (
        BACKENDS,
        check_storage,
        open_storage,
        pending_migrations,
    )
    from veil.server.storage.base import (
        CheckResult,
        DailyCap,
        DailyCapReached,
        DayCount,
        InsertResult,
        Migration,
        Storage,
        StoredReports,
    )
    from veil.server.storage.errors import (
        NoStoreError,
        RegistryMismatchError,
        SchemaOutdatedError,
        StorageError,
        StorageUnavailable,
        TooFewReportsError,
        UnknownMetricError,
    )
    from veil.server.storage.sqlite import MIN_FREE_BYTES, RECENT_IDS_LIMIT, SQLiteStorage

_EXPORTS = {
    "BACKENDS": "veil.server.storage.backends",
    "check_storage": "veil.server.storage.backends",
    "open_storage": "veil.server.storage.backends",
    "pending_migrations": "veil.server.storage.backends",
    "CheckResult": "veil.server.storage.base",
    "DailyCap": "veil.server.storage.base",
    "DailyCapReached": "veil.server.storage.base",
    "DayCount": "veil.server.storage.base",
    "InsertResult": "veil.server.storage.base",
    "Migration": "veil.server.storage.base",
    "NoStoreError": "veil.server.storage.errors",
    "RegistryMismatchError": "veil.server.storage.errors",
    "SchemaOutdatedError": "veil.server.storage.errors",
    "Storage": "veil.server.storage.base",
    "StorageError": "veil.server.storage.errors",
    "StorageUnavailable": "veil.server.storage.errors",
    "StoredReports": "veil.server.storage.base",
    "TooFewReportsError": "veil.server.storage.errors",
    "UnknownMetricError": "veil.server.storage.errors",
    "MIN_FREE_BYTES": "veil.server.storage.sqlite",
    "RECENT_IDS_LIMIT": "veil.server.storage.sqlite",
    "SQLiteStorage": "veil.server.storage.sqlite",
}

__all__ = [
    "BACKENDS",
    "MIN_FREE_BYTES",
    "RECENT_IDS_LIMIT",
    "CheckResult",
    "DailyCap",
    "DailyCapReached",
    "DayCount",
    "InsertResult",
    "Migration",
    "NoStoreError",
    "RegistryMismatchError",
    "SQLiteStorage",
    "SchemaOutdatedError",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "StoredReports",
    "TooFewReportsError",
    "UnknownMetricError",
    "check_storage",
    "open_storage",
    "pending_migrations",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
