"""The insert path of the SQLite storage: group commit, replay rejection and daily caps.

:meth:`SQLiteWrites.insert` prepares a call's rows and statements before the write
lock, then commits them together with every insert queued behind the lock
(:mod:`~veil.server.storage.sqlite.commit`); replayed ids are recognized by
:mod:`~veil.server.storage.sqlite.ids`, and a call with a :class:`DailyCap` is counted
under it in the same transaction. It returns once the transaction is committed
(fsynced); any SQLite failure raises
:class:`~veil.server.storage.errors.StorageUnavailable`. The aggregates count the new
reports when enough are waiting (:mod:`~veil.server.storage.sqlite.tail`).
"""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from veil.server.storage.base import (
    DailyCap,
    DailyCapReached,
    InsertResult,
    parse_day,
    seconds_left_in_day,
    today,
)
from veil.server.storage.errors import StorageError
from veil.server.storage.sqlite import rows as sql
from veil.server.storage.sqlite import tail
from veil.server.storage.sqlite.commit import Pending, Statement
from veil.server.storage.sqlite.files import SQLiteFile
from veil.server.storage.sqlite.ids import RecentIds
from veil.shared.registry import Metric
from veil.shared.statistics import Statistic
from veil.shared.wire import Report

#: ids appended to ``recent_ids`` before they are merged into ``report_ids``. Each worker
#: process keeps a copy of them in memory (its size per id: docs/operations.md, Durability); a
#: larger limit merges less often (fewer index pages written per id) in longer pauses
RECENT_IDS_LIMIT = 131_072

logger = logging.getLogger("veil.server.storage")


class SQLiteWrites(SQLiteFile):
    """:class:`~.files.SQLiteFile` with the insert path: :meth:`insert` and the group
    commit it leads or joins. Each process keeps a copy of ``recent_ids``
    (:class:`~.ids.RecentIds`) of at most ``recent_ids_limit`` ids, and folds the reports
    past the fold mark into the aggregates once ``fold_limit`` of them are waiting."""

    def __init__(self, path: str | Path, *, create: bool, min_free_bytes: int,
                 recent_ids_limit: int, fold_limit: int) -> None:
        for name, limit in (("recent_ids_limit", recent_ids_limit), ("fold_limit", fold_limit)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise StorageError(f"{name} must be a positive integer; got {limit!r}")
        self._recent = RecentIds(recent_ids_limit)
        self._fold_limit = fold_limit
        self._fold_retry = tail.FoldRetry()
        super().__init__(path, create=create, min_free_bytes=min_free_bytes)

    def insert(self, reports: Sequence[Report], day: dt.date | str | None = None, *,
               cap: DailyCap | None = None) -> InsertResult:
        """Store validated reports under ``day`` (default: today, UTC); every count includes
        them from then on (the aggregates count them when folded, readers until then).

        Reports whose id is already stored, or repeats an earlier report of the
        same call, are duplicates: acknowledged, not counted again. Returns after
        the transaction is committed (fsynced). With a ``cap``, the new reports are
        counted under it in that transaction, or the call alone is refused
        (:class:`~veil.server.storage.base.DailyCapReached`, nothing stored).
        """
        day_text = parse_day(day, "day") or today()
        rows: list[tuple[bytes, str, str, int, Any]] = []
        metrics: dict[str, tuple[Metric, Statistic]] = {}
        for report in reports:
            known = metrics.get(report.metric)
            if known is None:
                known = metrics[report.metric] = self._metric(report.metric)
            metric, statistic = known
            payload = statistic.stored_payload(metric.params, report.payload, report.value)
            rows.append((bytes.fromhex(report.id), report.metric, day_text, report.cohort, payload))
        if not rows:
            return InsertResult(0, 0)
        first: dict[bytes, tuple[Any, ...]] = {}
        for row in rows:
            first.setdefault(row[0], row)  # a repeated id within the call is a duplicate
        unique = list(first.values())
        groups = sql.group_by_metric_day(unique)
        pending = Pending(unique, list(first), b"".join(first), self._insert_statements(groups),
                          cap)
        self._commit(pending)
        if pending.refused is not None:
            raise pending.refused
        return InsertResult(pending.accepted, len(rows) - pending.accepted)

    def _commit(self, pending: Pending) -> None:
        """Store ``pending`` in a write transaction, together with any other calls waiting."""
        self.commits.enqueue(pending)
        with self.commits.lock:
            if not pending.done:  # no earlier holder of the lock took it: lead a group
                group: list[Pending] = []
                fold_waiting = 0
                try:
                    with self._transaction() as conn:
                        # take the queue once the transaction has begun, so the group also
                        # holds every call that arrived while waiting for other processes
                        group = self.commits.take()
                        new_ids, last_rowid, fold_waiting = self._store(conn, group)
                    # committed: only now may this process's copy of recent_ids hold them
                    self._recent.committed(new_ids, last_rowid)
                except BaseException as exc:
                    self._recent.invalidate()
                    group = group or self.commits.take()
                    for other in [*group, pending]:
                        other.error = exc
                    if not isinstance(exc, sqlite3.Error | sql.DamagedRow):
                        raise
                finally:
                    for other in group:
                        other.done = True
                if self._recent.full:
                    self._merge_recent_ids()
                if fold_waiting:
                    self._fold(fold_waiting)
        if pending.error is not None:
            raise self._failure("commit the write transaction", pending.error) from pending.error

    def _store(self, conn: sqlite3.Connection, group: list[Pending],
               ) -> tuple[list[bytes], int, int]:
        """Insert the reports of ``group`` whose ids are new (counted when folded).

        An id is new unless the file holds it already or it is earlier in the group
        (in a call the group stores: a call refused by its cap stores nothing).
        Returns the new ids, the last rowid of ``recent_ids`` once they are appended, and
        how many reports wait past the fold mark if they are due to be folded after the
        commit (0 if not).
        """
        self._recent.sync(conn)
        waiting = tail.waiting(conn)
        group_ids = [report_id for pending in group for report_id in pending.id_list]
        joined = b"".join(pending.ids for pending in group)
        known = self._recent.known(conn, group_ids, joined)
        # some ids were stored before or repeat an earlier call of the group: store exactly
        # the new rows, each call in order, so a later call sees an earlier one's
        repeats = bool(known) or (len(group) > 1 and len(set(group_ids)) < len(group_ids))
        new_ids: list[bytes] = []
        stored: list[tuple[Any, ...]] = []
        for pending in group:
            fresh = ([row for row in pending.unique if row[0] not in known] if repeats
                     else pending.unique)
            if pending.cap is not None and fresh and not self._charge_cap(conn, pending,
                                                                          len(fresh)):
                pending.statements = []
                continue
            if len(fresh) < len(pending.unique):
                pending.statements = self._insert_statements(sql.group_by_metric_day(fresh))
            if repeats:
                known.update(row[0] for row in fresh)
            new_ids.extend(row[0] for row in fresh)
            stored.extend(fresh)
            pending.accepted = len(fresh)
        if len(new_ids) < len(group_ids):
            joined = b"".join(new_ids)
        last_rowid = self._recent.append(conn, joined)
        for pending in group:
            for statement in pending.statements:
                sql.execute(conn, statement)
        if tail.count_now(conn, waiting, stored, self._metric):
            return new_ids, last_rowid, 0
        days = [pending.unique[0][2] for pending in group if pending.accepted]
        due = waiting.fold_due(len(new_ids), days, self._fold_limit) \
            and self._fold_retry.allows(waiting.after(len(new_ids)), time.monotonic())
        return new_ids, last_rowid, waiting.after(len(new_ids)) if due else 0

    @staticmethod
    def _charge_cap(conn: sqlite3.Connection, pending: Pending, reports: int) -> bool:
        """Count ``reports`` new reports of ``pending`` under its cap and day in the group's
        transaction; ``False`` (and ``pending.refused`` set, nothing counted) if they would
        exceed it."""
        assert pending.cap is not None
        key, limit, day = pending.cap.key, pending.cap.limit, pending.unique[0][2]
        row = conn.execute("SELECT reports FROM cap_counts WHERE key = ? AND day = ?",
                           (key, day)).fetchone()
        stored = int(row[0]) if row else 0
        if stored + reports > limit:
            pending.refused = DailyCapReached(limit, day, stored,
                                              seconds_left_in_day(day, time.time()))
            return False
        conn.execute("INSERT INTO cap_counts (key, day, reports) VALUES (?, ?, ?) "
                     "ON CONFLICT (key, day) DO UPDATE SET reports = reports + excluded.reports",
                     (key, day, reports))
        return True

    def _merge_recent_ids(self) -> None:
        """Merge ``recent_ids`` into the index in one transaction (the caller holds the lock).

        The caller's reports are already committed: a failed merge is logged and
        tried again after a later commit, and loses nothing (the ids stay in
        ``recent_ids``).
        """
        try:
            with self._transaction() as conn:
                self._recent.merge(conn)
        except (sqlite3.Error, sql.DamagedRow, StorageError) as exc:
            logger.warning("merging recent report ids into the index failed (will retry): %s",
                           self._failure("merge recent ids", exc))
        finally:
            self._recent.invalidate()

    def _fold(self, waiting: int) -> None:
        """Count the ``waiting`` reports past the fold mark into the aggregates in one
        transaction (:mod:`~veil.server.storage.sqlite.tail`); the caller holds the write lock.

        The insert path calls it once enough reports wait, after their commit: a failed
        fold is logged and tried again after a later commit once twice as many wait, or a
        minute later (:class:`~.tail.FoldRetry`), and loses nothing (readers count the
        reports past the mark meanwhile).
        """
        try:
            with self._transaction() as conn:
                tail.fold(conn, sql.stored_metrics(conn))
        except (sqlite3.Error, sql.DamagedRow, StorageError) as exc:
            self._fold_retry.failed(waiting, time.monotonic())
            logger.warning("folding %d new reports into the aggregates failed (tried again "
                           "once %d wait, or in %d s): %s", waiting, 2 * waiting,
                           tail.RETRY_SECONDS, self._failure("fold reports into the aggregates", exc))
        else:
            self._fold_retry.succeeded()

    def _insert_statements(self, groups: dict[tuple[str, str], list[tuple[Any, ...]]],
                           ) -> list[Statement]:
        """One statement per (metric, day) group that appends its rows to ``reports``."""
        return [sql.insert_statement(self._metric(name)[1], name, day, group)
                for (name, day), group in groups.items()]
