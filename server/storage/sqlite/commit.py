"""Group commit: inserts that queue while the write lock is held are committed together.

Whichever thread gets the lock stores every insert queued meanwhile in one
transaction. Rows that land on the same pages (the appended ids and reports)
are then written to the WAL once per group rather than once per call, and the
commit's fsync is shared. The calls of a group
succeed or fail together, and each returns only after the commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

from veil.server.storage.base import DailyCap, DailyCapReached

#: SQL, its parameters, and whether they are a sequence of rows for ``executemany``
Statement = tuple[str, Any, bool]


@dataclasses.dataclass(eq=False)
class Pending:
    """One insert call waiting for a write transaction.

    ``unique`` holds the call's ``(id, metric, day, cohort, payload)`` rows with
    distinct ids, ``id_list`` their ids and ``ids`` the ids joined; ``statements``
    store them all, prepared before the write lock for the common case that every
    id is new. With a ``cap``, the group counts the call's new
    reports under it, or refuses the call alone (``refused``) when they would exceed it.
    """

    unique: list[tuple[Any, ...]]
    id_list: list[bytes]
    ids: bytes
    statements: list[Statement]
    cap: DailyCap | None = None
    accepted: int = 0
    done: bool = False
    error: BaseException | None = None
    refused: DailyCapReached | None = None


class GroupCommit:
    """The write lock and the queue of :class:`Pending` inserts waiting for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._queue: list[Pending] = []
        self._queue_lock = threading.Lock()

    def enqueue(self, pending: Pending) -> None:
        """Queue an insert; its thread then takes :attr:`lock` and leads a group unless
        an earlier holder of the lock already stored it (``pending.done``)."""
        with self._queue_lock:
            self._queue.append(pending)

    def take(self) -> list[Pending]:
        """Every queued insert, in queue order; the queue is left empty."""
        with self._queue_lock:
            group, self._queue = self._queue, []
        return group

    @property
    def waiting(self) -> int:
        """How many inserts are queued."""
        with self._queue_lock:
            return len(self._queue)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the write lock (no group commits meanwhile): inserts queue up behind it."""
        with self.lock:
            yield
