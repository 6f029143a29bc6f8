"""A PostgreSQL outage in the log: one line when it starts, one when it ends.

psycopg's pool logs two WARNING lines for every failed connection attempt (libpq's
reason, then its tab-indented hint) under its own logger, several times a second
while the server is down, and nothing when it is back. :class:`OutageLog`, attached
to the ``psycopg.pool`` logger, turns the first failure of an outage into one
WARNING line of ``veil.server.storage`` with PostgreSQL's reason, demotes the
pool's further lines to DEBUG (counted), and :meth:`OutageLog.recovered`, called by
the storage after its next successful use of the database, logs the end of the
outage with how long it lasted and how many attempts failed.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["OUTAGE_LOG", "OutageLog", "libpq_reason"]

#: the logger of Veil's own lines about the outage
LOGGER_NAME = "veil.server.storage"
#: the pool's message for a failed connection attempt (``psycopg_pool.pool``)
_CONNECT_FAILED = "error connecting in %r: %s"


def libpq_reason(text: str) -> str:
    """PostgreSQL's reason on one line, without libpq's preamble (``connection failed:
    connection to server at ... failed:``) and its second line (``Is the server running``)."""
    text = " ".join(text.split())
    reason = next((text.rpartition(mark)[2] for mark in ("FATAL:", " failed: ") if mark in text),
                  text)
    return reason.split(" Is the server running")[0].strip().rstrip(".")


class OutageLog(logging.Filter):
    """Rewrites the ``psycopg.pool`` logger's records: see the module's description."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """The first failed attempt of an outage as Veil's WARNING; the rest as DEBUG."""
        if record.msg == _CONNECT_FAILED and isinstance(record.args, tuple) and record.args:
            with self._lock:
                self._failures += 1
                first = self._since is None
                if first:
                    self._since = time.monotonic()
            reason = libpq_reason(str(record.args[-1]))
            if first:
                record.name = LOGGER_NAME
                record.msg = ("PostgreSQL is unreachable (%s): uploads and /readyz answer 503 "
                              "until it is back; further failed attempts are counted (DEBUG "
                              "logs each)")
                record.args = (reason,)
                return True
            record.msg, record.args = "failed connection attempt: %s", (reason,)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True

    def recovered(self) -> None:
        """Called after a successful use of the database: logs the end of an outage, once."""
        if self._since is None:
            return
        with self._lock:
            if self._since is None:
                return
            lasted, failures = time.monotonic() - self._since, self._failures
            self._since, self._failures = None, 0
        logging.getLogger(LOGGER_NAME).warning(
            "PostgreSQL is reachable again after %.0f s (%d failed connection attempt%s)",
            lasted, failures, "" if failures == 1 else "s")

    def install(self) -> None:
        """Attach to the ``psycopg.pool`` logger (once per process)."""
        pool_logger = logging.getLogger("psycopg.pool")
        if self not in pool_logger.filters:
            pool_logger.addFilter(self)


#: the process's one outage log: every pool of the process shares PostgreSQL's fate
OUTAGE_LOG = OutageLog()
