"""Outages of the collector as an installation sees them: logged once, counted, and kept across runs.

An outage begins with the first upload or registry fetch that cannot reach the
collector (a network error, a timeout, or a 408, 429 or 5xx answer after the
retries) and ends with the first answer from it. Its first failure is logged
as one WARNING (:func:`log_failure`); later ones at DEBUG level, and counted;
its end is one INFO line saying how long it lasted and how many attempts
failed (:func:`log_recovery`).

The outage lives in the ``meta`` table of the state database (``outage_since``,
an ISO 8601 UTC instant, and ``outage_failures``), not in memory: a program that
runs for a few seconds once a minute continues the outage the previous run
began instead of warning again, and processes sharing the state directory see
one outage (each update is one write transaction, so exactly one of them logs
its beginning and one its end). When the database cannot be used (the client
is closed, or it fails) the record is kept in memory for this process.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import sqlite3

from veil.client.state_dir import transaction

log = logging.getLogger("veil.client")

_SINCE = "outage_since"
_FAILURES = "outage_failures"


@dataclasses.dataclass(frozen=True)
class Outage:
    """An outage of the collector: ``since`` the first failed attempt (UTC, to the second),
    with ``failures`` failed uploads and registry fetches so far."""

    since: datetime.datetime
    failures: int

    def lasted(self, now: datetime.datetime | None = None) -> datetime.timedelta:
        """How long it has lasted at ``now`` (never negative, should the clock go back)."""
        now = now or _now()
        return max(now - self.since, datetime.timedelta(0))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


class OutageRecord:
    """The installation's current outage, in its state database (or in memory when the
    database cannot be used).

    Each method takes the state database's connection (``None``: the client is
    closed), and is called holding the lock that serializes it; it never raises
    :class:`sqlite3.Error`. Logging is left to the caller, outside that lock.
    """

    def __init__(self) -> None:
        #: the outage of this process while the database could not record it
        self._memory: Outage | None = None
        #: when the last outage this process began (and announced) began
        self.began: datetime.datetime | None = None

    def failed(self, connection: sqlite3.Connection | None) -> Outage:
        """Count one failed attempt, beginning an outage if none is under way; return it
        (``failures == 1``: this attempt began it)."""
        if connection is not None:
            try:
                with transaction(connection):
                    current = _read(connection)
                    outage = (Outage(_now(), 1) if current is None
                              else dataclasses.replace(current, failures=current.failures + 1))
                    connection.executemany(
                        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                        [(_SINCE, outage.since.isoformat()), (_FAILURES, str(outage.failures))],
                    )
                self._memory = None
                return self._note(outage)
            except sqlite3.Error as problem:
                log.debug("cannot record the outage in the state database: %s", problem)
        memory = self._memory
        self._memory = (Outage(_now(), 1) if memory is None
                        else dataclasses.replace(memory, failures=memory.failures + 1))
        return self._note(self._memory)

    def _note(self, outage: Outage) -> Outage:
        if outage.failures == 1:
            self.began = outage.since
        return outage

    def reached(self, connection: sqlite3.Connection | None) -> Outage | None:
        """The collector answered: end the outage under way and return it (``None``: there
        was none, or another process sharing the state directory ended it first)."""
        ended, self._memory = self._memory, None
        if connection is not None:
            try:
                if _read(connection) is None:  # the common case: one read, no write
                    return ended
                with transaction(connection):
                    stored = _read(connection)
                    connection.execute("DELETE FROM meta WHERE key IN (?, ?)",
                                       (_SINCE, _FAILURES))
                return stored or ended
            except sqlite3.Error as problem:
                log.debug("cannot record the end of the outage in the state database: %s",
                          problem)
        return ended

    def current(self, connection: sqlite3.Connection | None) -> Outage | None:
        """The outage under way, if any."""
        if connection is not None and self._memory is None:
            try:
                return _read(connection)
            except sqlite3.Error:
                return None
        return self._memory


def _read(connection: sqlite3.Connection) -> Outage | None:
    """The outage the database records, or ``None``; a damaged record counts as none."""
    values = dict(connection.execute(
        "SELECT key, value FROM meta WHERE key IN (?, ?)", (_SINCE, _FAILURES)
    ).fetchall())
    try:
        since = datetime.datetime.fromisoformat(values[_SINCE])
        return Outage(since if since.tzinfo else since.replace(tzinfo=datetime.UTC),
                      max(int(values[_FAILURES]), 1))
    except (KeyError, ValueError):
        return None


def duration(span: datetime.timedelta) -> str:
    """``45 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d``: a span in its largest unit and, when
    not zero, the next one."""
    seconds = max(int(span.total_seconds()), 0)
    units = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))
    for (name, size), (smaller, smaller_size) in itertools.pairwise(units):
        if seconds >= size:
            rest = seconds % size // smaller_size
            return f"{seconds // size} {name}" + (f" {rest} {smaller}" if rest else "")
    return f"{seconds} s"


def log_failure(outage: Outage, problem: str, consequence: str) -> None:
    """Log a failed attempt to reach the collector (``problem``: what failed, in one line): a
    WARNING saying ``consequence`` when it began the outage, DEBUG afterwards."""
    if outage.failures == 1:
        log.warning(
            "the collector is unreachable: %s. %s; further failed attempts are counted in "
            "client.outage (DEBUG logs each) until it answers again",
            problem, consequence,
        )
    else:
        log.debug("failed attempt %d of the outage since %s: %s",
                  outage.failures, outage.since.isoformat(), problem)


def log_recovery(outage: Outage) -> None:
    """Log the end of ``outage``: one INFO line, how long it lasted and how many attempts failed."""
    log.info(
        "the collector is reachable again after %s (%d failed attempt%s since %s)",
        duration(outage.lasted()), outage.failures, "" if outage.failures == 1 else "s",
        outage.since.isoformat(),
    )
