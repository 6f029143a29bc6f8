"""The durable outbox: randomized reports waiting in SQLite until the collector acknowledges them.

Each row holds one wire report as JSON text (id, metric, params, cohort, payload:
the randomized output, never the raw value) and a state: ``READY`` or
``IN_FLIGHT`` (claimed by an upload in progress). A report leaves the table
only when the collector has acknowledged it or refused it for good; rows
claimed by a process that died are put back to ``READY`` on start-up
(:meth:`Outbox.recover`), and resending them is safe because the collector
deduplicates by report id.

Reports the collector refuses for good leave the table too, and are counted
in the ``counters`` table (:meth:`Outbox.count_dropped`), so that none is lost
silently; so are the reports dropped before they were queued (:data:`DROP_CAUSES`).

The table holds at most the client's ``max_outbox`` reports: while it is full,
new reports are dropped (the client's default, ``outbox_policy="drop-newest"``:
the queued ones were charged to the privacy ledger already, and a report
dropped before it is queued costs nothing), or the oldest ready report makes
room (``"drop-oldest"``, :meth:`Outbox.evict_oldest`). Triggers keep the count
of rows in ``counters`` (``queued``), so that checking the cap costs no table scan.

Methods run single statements or short transactions on a connection the caller
serializes (the client holds a lock around every call). :class:`DropCounter`
keeps the drop counts the database cannot (the client is closed, or the
database fails) and logs the drops.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading

from veil.client.state_dir import transaction

log = logging.getLogger("veil.client")

READY = 0
IN_FLIGHT = 1

#: why a report was dropped -> the name of its durable counter
DROP_CAUSES = {
    "rejected": "dropped",  # refused for good by the collector
    "outbox_full": "dropped_outbox_full",  # the outbox held max_outbox reports
    "privacy_limit": "dropped_privacy_limit",  # not encoded: the metric breaks the app's limits
    "invalid_value": "dropped_invalid_value",  # a value of the wrong type or outside the domain
    "unknown_metric": "dropped_unknown_metric",  # a metric the registry does not define
    "budget": "dropped_budget",  # it would have spent more than the installation's budget
    "no_registry": "dropped_no_registry",  # waited in memory for a registry that did not come
    "closed": "dropped_closed",  # reported to a closed client (kept in memory: the file is shut)
    "state": "dropped_state",  # the state database failed (disk full, damaged)
}


class Outbox:
    """Queue operations on the ``outbox`` table of the state database."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def recover(self) -> int:
        """Put every in-flight row back to ready (their upload never finished); return how many."""
        cursor = self.connection.execute(
            "UPDATE outbox SET state = ? WHERE state = ?", (READY, IN_FLIGHT)
        )
        return cursor.rowcount

    def insert(self, body: str, limit: int) -> bool:
        """Queue one serialized wire report unless ``limit`` reports are queued; say whether it was.

        One statement, so the cap holds when several processes share the outbox.
        """
        cursor = self.connection.execute(
            "INSERT INTO outbox (body) SELECT ? "
            "WHERE (SELECT value FROM counters WHERE name = 'queued') < ?",
            (body, limit),
        )
        return cursor.rowcount == 1

    def evict_oldest(self, limit: int) -> int:
        """Delete the oldest ready report if ``limit`` reports are queued; return how many went.

        Run it in the transaction that inserts the new report, so the cap holds.
        """
        cursor = self.connection.execute(
            "DELETE FROM outbox WHERE seq = (SELECT MIN(seq) FROM outbox WHERE state = ?) "
            "AND (SELECT value FROM counters WHERE name = 'queued') >= ?",
            (READY, limit),
        )
        return cursor.rowcount

    def claim(self, limit: int, max_bytes: int) -> list[tuple[int, str]]:
        """Mark up to ``limit`` oldest ready reports (at most ``max_bytes`` of JSON) in flight.

        At least one report is returned when any is ready, whatever its size, so
        an oversized report is never stuck (the collector refuses it and it is dropped).
        """
        connection = self.connection
        with transaction(connection):
            rows = connection.execute(
                "SELECT seq, body FROM outbox WHERE state = ? ORDER BY seq LIMIT ?", (READY, limit)
            ).fetchall()
            total = 0
            for count, (_, body) in enumerate(rows):
                total += len(body) + 1
                if total > max_bytes and count > 0:
                    rows = rows[:count]
                    break
            connection.executemany(
                "UPDATE outbox SET state = ? WHERE seq = ?", [(IN_FLIGHT, seq) for seq, _ in rows]
            )
        return rows

    def delete(self, seqs: list[int]) -> None:
        """Remove acknowledged (or finally refused) reports."""
        self._many("DELETE FROM outbox WHERE seq = ?", [(seq,) for seq in seqs])

    def release(self, seqs: list[int]) -> None:
        """Put claimed reports back to ready after a failed upload."""
        self._many("UPDATE outbox SET state = ? WHERE seq = ?", [(READY, seq) for seq in seqs])

    def pending(self) -> int:
        """Reports still in the outbox (ready or in flight)."""
        (count,) = self.connection.execute(
            "SELECT value FROM counters WHERE name = 'queued'"
        ).fetchone()
        return int(count)

    def held(self) -> int:
        """Reports in flight: claimed by an upload in progress (or one whose process died)."""
        (count,) = self.connection.execute(
            "SELECT COUNT(*) FROM outbox WHERE state = ?", (IN_FLIGHT,)
        ).fetchone()
        return int(count)

    def count_dropped(self, cause: str, count: int = 1) -> None:
        """Add ``count`` reports dropped for ``cause`` (a key of :data:`DROP_CAUSES`) to its tally."""
        self.connection.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            (DROP_CAUSES[cause], count),
        )

    def drops(self) -> dict[str, int]:
        """Reports dropped over the installation's lifetime, per cause."""
        counters = dict(self.connection.execute("SELECT name, value FROM counters").fetchall())
        return {cause: int(counters.get(name, 0)) for cause, name in DROP_CAUSES.items()}

    def _many(self, sql: str, rows: list[tuple[int, ...]]) -> None:
        with transaction(self.connection):
            self.connection.executemany(sql, rows)


#: the share of ``max_outbox`` a full outbox must drain to before it is said to have room
#: again (:meth:`DropCounter.outbox_full`)
ROOM_AGAIN = 0.9

class DropCounter:
    """What the client drops, per cause (:data:`DROP_CAUSES`), beside the outbox that keeps the
    durable counts.

    A drop is counted in the outbox's ``counters`` table (:meth:`count`), or in
    memory when the client is closed or the state database fails, and the two
    add up in :meth:`totals`. The first drop of each cause is logged at WARNING
    level, later ones at DEBUG (:meth:`log`), so that a flood of bad values
    does not flood the application's log; a full outbox is logged once when it
    starts dropping reports and once when it has room again (:meth:`outbox_full`).
    """

    def __init__(self, *, debug: bool) -> None:
        self.debug = debug
        #: drops that could not be written to the state database (it was closed or failing)
        self._unsaved: collections.Counter[str] = collections.Counter()
        #: reports dropped since the outbox was last found full (logged once per episode)
        self._full_drops = 0
        #: drop causes already logged at WARNING level (once each)
        self._warned: set[str] = set()
        self.forked()

    def forked(self) -> None:
        """A fresh lock for this process (at creation, and in a forked child: a thread of the
        parent may have held it)."""
        self._lock = threading.Lock()

    def count(self, outbox: Outbox | None, cause: str, count: int = 1) -> None:
        """Count ``count`` reports dropped for ``cause`` in ``outbox`` (call it holding the
        lock that serializes its connection), or in memory when ``outbox`` is ``None`` (the
        client is closed) or the state database fails."""
        if outbox is not None:
            try:
                outbox.count_dropped(cause, count)
                return
            except sqlite3.Error:
                pass
        self._unsaved[cause] += count

    def totals(self, durable: dict[str, int]) -> dict[str, int]:
        """The ``durable`` counts (:meth:`Outbox.drops`) with the ones kept in memory added."""
        return {cause: durable[cause] + self._unsaved[cause] for cause in DROP_CAUSES}

    def log(self, cause: str, message: str, *, warn: bool = False, quiet: bool = False) -> None:
        """Log a drop: at WARNING level the first time for ``cause`` (or with ``warn``), at DEBUG
        afterwards, or with ``quiet`` (a drop that an earlier WARNING announced, such as the
        outage's)."""
        if quiet:
            log.debug("%s", message)
            return
        with self._lock:
            first = cause not in self._warned or warn
            self._warned.add(cause)
        if not first:
            log.debug("%s", message)
            return
        log.warning(
            "%s%s Further drops of this kind are counted in client.drops[%r] and logged at debug "
            "level%s", message, "" if message.endswith(".") else ".", cause,
            "" if self.debug else " (debug=True shows them)",
        )

    def outbox_full(
        self, outbox: Outbox, dropped: int, *, max_outbox: int, drop_oldest: bool
    ) -> None:
        """Count the reports a full outbox dropped (the new one, or the oldest it evicted; call
        it holding the connection's lock); log once when the outbox starts dropping reports,
        and once when it has room again: down to :data:`ROOM_AGAIN` of ``max_outbox``, so that
        reports arriving faster than uploads drain them (each upload making room for a few)
        are one episode, not two warnings per upload."""
        if dropped:
            outbox.count_dropped("outbox_full", dropped)
            if not self._full_drops:
                which = ("new reports are dropped" if not drop_oldest
                         else "the oldest queued reports are dropped to make room")
                log.warning(
                    "the outbox holds max_outbox=%d reports that the collector has not taken: "
                    "%s (counted in client.drops['outbox_full']) until an upload makes room",
                    max_outbox, which,
                )
            self._full_drops += dropped
        elif self._full_drops and outbox.pending() <= ROOM_AGAIN * max_outbox:
            log.warning(
                "the outbox has room again; %d reports were dropped while it was full",
                self._full_drops,
            )
            self._full_drops = 0
