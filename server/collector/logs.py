"""The collector's log: timestamped, levelled lines on stderr, as text or one JSON object a line.

``veil serve`` calls :func:`configure_logging` once, before the app exists, so
Flask, waitress and Veil's own loggers all write through the one handler it
installs on the root logger (Flask then adds no handler of its own). Nothing
here logs a request: the collector writes no access log, and no client address
or user agent ever reaches a log line (waitress's connection descriptions are
written without the peer's address, see :mod:`veil.server.collector.serving`).

waitress warns ``Task queue depth is N`` each time a request has to wait for a
free thread, which under load is dozens of lines a second. :class:`QueueDepthFilter`
keeps them as DEBUG and reports them at INFO at most once every
:data:`QUEUE_REPORT_SECONDS`, with the deepest queue seen meanwhile.

Importing this module is cheap (standard library only): ``veil --help`` reads its
choices.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
import sys
import threading
import time
from typing import IO

__all__ = [
    "FORMATS",
    "LEVELS",
    "QUEUE_REPORT_SECONDS",
    "JsonFormatter",
    "QueueDepthFilter",
    "TextFormatter",
    "configure_logging",
]

#: the values of ``--log-format``
FORMATS = ("text", "json")
#: the values of ``--log-level``, most verbose first
LEVELS = ("debug", "info", "warning", "error")
#: at most one INFO line about waitress's request queue in this many seconds
QUEUE_REPORT_SECONDS = 60.0

#: waitress's message (``waitress.task.ThreadedTaskDispatcher.add_task``)
_QUEUE_MESSAGE = "Task queue depth is %d"


def one_line(message: str) -> str:
    """``message`` as one line: runs of whitespace (a library's tab-indented second line, a
    newline inside a quoted error) become one space, and a sentence's period is not doubled
    where a message ends a quoted reason that brought its own (``...failed: reason..``)."""
    return _DOUBLE_PERIOD.sub(".", " ".join(message.split()))


#: two periods ending a sentence (not an ellipsis, not ``../``)
_DOUBLE_PERIOD = re.compile(r"(?<=[^.\s/])\.\.(?=\s|$)")


def _timestamp(record: logging.LogRecord) -> str:
    """The record's time in UTC, ISO 8601 to the millisecond: ``2026-11-22T08:15:02.123Z``."""
    moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger[pid]: message`` (:func:`one_line`), then the traceback if there is
    one."""

    def format(self, record: logging.LogRecord) -> str:
        """One line (more with a traceback)."""
        line = (f"{_timestamp(record)} {record.levelname:<7} {record.name}[{record.process}]: "
                f"{one_line(record.getMessage())}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time``, ``level``, ``logger``, ``pid``, ``message`` and, with
    a traceback, ``exception``; for log shippers (Loki, Elasticsearch, CloudWatch)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        entry = {"time": _timestamp(record), "level": record.levelname, "logger": record.name,
                 "pid": record.process, "message": one_line(record.getMessage())}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class QueueDepthFilter(logging.Filter):
    """Turns waitress's ``Task queue depth is N`` warnings into DEBUG records, and one INFO
    record every ``interval`` seconds at most, with the deepest queue and how many requests
    waited since the last such record. Attach it to the ``waitress.queue`` logger."""

    def __init__(self, interval: float = QUEUE_REPORT_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self._lock = threading.Lock()
        self._last = -math.inf
        self._waited = 0
        self._deepest = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's level (and, for the INFO one, its message); keep every record."""
        if record.msg != _QUEUE_MESSAGE or not isinstance(record.args, tuple):
            return True
        depth = record.args[0]
        if not isinstance(depth, int):
            return True
        now = time.monotonic()
        with self._lock:
            self._waited += 1
            self._deepest = max(self._deepest, depth)
            if now - self._last < self.interval:
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
                return True
            waited, deepest = self._waited, self._deepest
            self._last, self._waited, self._deepest = now, 0, 0
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = ("requests are waiting for a free thread: %d waited since the last report "
                      "(at most %.0f s ago), up to %d at once; if this persists, raise --threads "
                      "or --workers (DEBUG logs each)")
        record.args = (waited, self.interval, deepest)
        return True


def configure_logging(fmt: str = "text", level: str = "info", stream: IO[str] | None = None,
                      ) -> logging.Handler:
    """Send every log record of ``level`` or above to ``stream`` (default stderr) in ``fmt``
    (``text`` or ``json``); return the handler. Replaces the root logger's handlers."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}; got {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # on the handler too: a filter may lower a record's level after the logger let it through
    handler.setLevel(level.upper())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    queue = logging.getLogger("waitress.queue")
    for old_filter in queue.filters[:]:
        if isinstance(old_filter, QueueDepthFilter):
            queue.removeFilter(old_filter)
    queue.addFilter(QueueDepthFilter())
    logging.captureWarnings(True)
    return handler
