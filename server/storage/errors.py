"""The errors of the stores: what a caller did wrong, and what went wrong with the store.

Those that are the caller's input (:class:`DayError`, :class:`NoStoreError`,
:class:`UnknownMetricError`) are also :class:`~veil.shared.errors.ParameterError`, so a
command exits with its usage-error code and the API answers 400.
"""

from __future__ import annotations

from collections.abc import Iterable

from veil.shared.errors import ParameterError, VeilError


class StorageError(VeilError):
    """The store cannot be opened or used as asked (wrong file, newer schema, unknown metric)."""


class DayError(StorageError, ParameterError):
    """A day is not written ``YYYY-MM-DD``, or a range ends before it starts: the caller's
    input (a usage error of a command, a 400 of the API), not the store's state."""


class NoStoreError(StorageError, ParameterError):
    """``--db`` names no Veil store (a missing, empty or foreign file, a database without
    Veil's tables): the caller's input, a usage error of a command; nothing was done."""

    def __init__(self, message: str) -> None:
        super().__init__("db", message)


class UnknownMetricError(StorageError, ParameterError):
    """The store holds no metric of the name asked: a usage error of a command."""

    def __init__(self, location: str, name: str, known: Iterable[str]) -> None:
        names = sorted(known)
        listed = ", ".join(names[:MAX_LISTED]) + (
            f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")
        super().__init__("metric", f"{location} has no metric {name!r}; it has: "
                                   f"{listed or 'none'}")


#: metric names an :class:`UnknownMetricError` lists at most
MAX_LISTED = 40


class StorageUnavailable(StorageError):
    """The store cannot take or answer a request now (I/O error, disk full, locked, closed):
    nothing of the request was stored; retrying later may succeed. HTTP answers 503."""


class SchemaOutdatedError(StorageError):
    """The store has an older schema than this Veil's: it is migrated only when asked
    (``veil migrate``, ``veil serve --migrate``), never silently on open."""

    def __init__(self, location: str, version: int, current: int) -> None:
        super().__init__(
            f"{location} has schema version {version}, older than this Veil's ({current}). "
            f"Back it up (veil backup), then migrate it: veil migrate --db {location} "
            "(--dry-run lists the steps first), or start the collector with veil serve --migrate"
        )


class RegistryMismatchError(StorageError):
    """A registry changes a metric's parameters although reports under the old ones are stored."""


class TooFewReportsError(VeilError):
    """Fewer reports than the metric's ``min_reports`` in the requested range.

    Small batches of reports leak more about each person, so counts are
    refused; an operator may override with ``min_reports=0`` (``--force``).
    """

    def __init__(self, metric: str, reports: int, min_reports: int) -> None:
        self.metric = metric
        self.reports = reports
        self.min_reports = min_reports
        super().__init__(
            f"metric {metric!r} has {reports} reports in the requested range; at least "
            f"{min_reports} (its min_reports) are needed before counts or reports are "
            "released. Widen the date range or wait for more reports."
        )


class SchemaNewerError(StorageError):
    """The store has a newer schema than this Veil's: open it with the Veil that wrote it,
    or a newer one."""
