"""From a reported value to a randomized report in the durable outbox.

:class:`Recorder` is a client's hold on its state database: one SQLite
connection, the lock that serializes it, the :class:`~veil.client.outbox.Outbox`
and the :class:`~veil.client.accounting.PrivacyLedger` on it, the drop counts
(:class:`~veil.client.outbox.DropCounter`) and the record of the collector's
outage under way (:class:`~veil.client.outage.OutageRecord`). :meth:`Recorder.submit`
looks the metric up in the registry its
:class:`~veil.client.registry_source.RegistryLoader` holds (or lets the value
wait for one), encodes the value with the metric's encoder, and queues the
report in the transaction that charges the ledger. A value that cannot be
queued raises (``strict``) or is dropped, counted and logged.

``os.fork()`` waits until no thread of the process is using a client's connection (the
fork handlers hold every live recorder's lock), and the child closes the connection it
inherited, idle, at once: SQLite keeps per-process lock state for a database file, and a
connection opened in a child beside an inherited one shares the parent's, so the child
held no lock in the eyes of the operating system and a parent closing its last
connection checkpointed and truncated the write-ahead log under the child's writes (a
malformed database). The child opens its own connection when it first uses the client
(:meth:`Recorder.check_process`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import sqlite3
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from veil.client.accounting import PrivacyLedger, PrivacySpent
from veil.client.encoders import make_encoder
from veil.client.encoders.base import Encoder
from veil.client.errors import (
    BudgetExceededError,
    ClientClosedError,
    StateError,
    UnknownMetricError,
    shown_metric,
)
from veil.client.options import ClientOptions, Location
from veil.client.outage import Outage, OutageRecord, log_failure, log_recovery
from veil.client.outbox import DROP_CAUSES, DropCounter, Outbox
from veil.client.randomness import HmacStream
from veil.client.registry_source import Metrics, RegistryLoader
from veil.client.state_dir import cohort_seed, ledger_lost_at, open_database, transaction
from veil.client.transport import Transport
from veil.shared.bits import realize
from veil.shared.errors import ParameterError, VeilError, type_name
from veil.shared.registry import Metric, Registry
from veil.shared.wire import make_report, validate_report

log = logging.getLogger("veil.client")

_JSON = json.JSONEncoder(separators=(",", ":"))
#: the recorders of this process, which ``os.fork()`` waits for and the child detaches
_LIVE: weakref.WeakSet[Recorder] = weakref.WeakSet()


#: the recorders whose locks the fork in progress holds
_FORKING: list[Recorder] = []


def _before_fork() -> None:
    _FORKING[:] = sorted(_LIVE, key=id)  # one fixed order
    for recorder in _FORKING:
        recorder.before_fork()


def _after_fork_in_parent() -> None:
    for recorder in _FORKING:
        recorder.after_fork_in_parent()
    _FORKING.clear()


def _after_fork_in_child() -> None:
    for recorder in _FORKING:
        recorder.after_fork_in_child()
    _FORKING.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
#: what :meth:`Recorder.submit` turns into a counted drop (``strict``: raises) ...
_REPORT_ERRORS = (VeilError, sqlite3.Error)
#: ... and the cause it is counted under (the first match)
_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (UnknownMetricError, "unknown_metric"),
    (BudgetExceededError, "budget"),
    (ClientClosedError, "closed"),
    (StateError, "state"),
    (sqlite3.Error, "state"),
    (VeilError, "invalid_value"),
)


def reporting_channel(registry: Registry, metric: str, secret: bytes) -> Metric:
    """The metric an installation with ``secret`` reports the string metric ``metric`` as:
    ``registry[metric]`` itself, or its discovery channel (:meth:`Registry.channel
    <veil.shared.registry.Registry.channel>`) for the installations whose ``u < N``, where
    ``u`` is the first word (:meth:`~veil.client.randomness.RandomStream.u32`) of the
    :class:`~veil.client.randomness.HmacStream` with purpose ``channel``, the metric's name
    and an empty context, and ``N / 2**32`` the channel's realized ``share``. The choice is
    made once for all: every value of ``metric`` goes out through the same channel."""
    channel = registry.channel(metric)
    if channel is not None:
        u = HmacStream(secret, b"channel", metric, b"").u32()
        if u < realize(channel.params.channel_share):
            return channel
    return registry[metric]


class Recorder:
    """Encodes a client's values and queues the reports in its state database.

    ``connection`` and ``secret`` are the open state of ``directory``; the
    registry comes through :attr:`loader`, made here with ``transport`` and
    ``location`` (``hold`` is the client's exit hook: see
    :class:`~veil.client.registry_source.RegistryLoader`). :attr:`lock`
    serializes every use of the connection; :attr:`on_queue`, when set, is
    called after each report is queued (the background worker wakes on it).
    """

    def __init__(
        self, options: ClientOptions, location: Location, transport: Transport, directory: Path,
        connection: sqlite3.Connection, secret: bytes, hold: Callable[[bool], None],
    ) -> None:
        self.options = options
        self.directory = directory
        self.secret = secret
        self.lock = threading.Lock()
        self.closed = False
        self.drops = DropCounter(debug=options.debug)
        self.outages = OutageRecord()
        self.on_queue: Callable[[], None] | None = None
        self._pid = os.getpid()
        self._drops_at_close = dict.fromkeys(DROP_CAUSES, 0)
        self._outage_at_close: Outage | None = None
        self._attach(connection, recover=True)
        self.cohort_seed = cohort_seed(connection, secret)
        self.loader = RegistryLoader(
            transport, location.url, directory, token=location.token, timeout=options.timeout,
            limits=options.limits, submit=functools.partial(self.submit, strict=False),
            drop=self.drop, hold=hold, unreachable=self.unreachable, reached=self.reached,
        )
        _LIVE.add(self)  # set up: a fork from another thread now finds it whole

    def _attach(self, connection: sqlite3.Connection, *, recover: bool) -> None:
        """Use ``connection`` (to the state database) for the outbox and the ledger."""
        self.connection = connection
        self.outbox = Outbox(connection)
        self.ledger = PrivacyLedger(
            connection, self.secret, self.options.budget, ledger_lost_at(connection)
        )
        if recover:
            returned = self.outbox.recover()
            if returned:
                log.info("%d reports whose upload was interrupted are queued again", returned)

    @property
    def forked(self) -> bool:
        """Whether this process is a fork of the one that made the client, and has not used it."""
        return self._pid != os.getpid()

    def check_process(self) -> None:
        """Raise if closed; after ``os.fork()`` give the child its own connection.

        (The worker and the default transport notice the fork themselves.) The
        values waiting for the registry stay the parent's to encode.
        """
        if self.closed:
            raise ClientClosedError("this Client is closed; create a new one")
        if self.forked:
            self._pid = os.getpid()
            self.drops.forked()
            self.loader.forked()
            # the inherited connection was closed at the fork (after_fork_in_child)
            self._attach(open_database(self.directory), recover=False)

    def before_fork(self) -> None:
        """Hold the lock across ``os.fork()``: the connection is idle when it is copied."""
        self.lock.acquire()

    def after_fork_in_parent(self) -> None:
        self.lock.release()

    def after_fork_in_child(self) -> None:
        """In the child: a fresh lock, and the inherited connection closed (idle: the fork
        waited for the lock), before any connection to the database is opened here."""
        self.lock = threading.Lock()
        with contextlib.suppress(sqlite3.Error):  # a closed one closes again as a no-op
            self.connection.close()

    def submit(self, metric: Any, value: Any, *, strict: bool) -> None:
        """Report a value (for :meth:`Client.report <veil.client.Client.report>`, or one that
        waited for the registry); one that cannot be queued raises if ``strict``, else it is
        dropped, counted and logged.

        Any exception (not only Veil's) is turned into a drop: a value or metric name
        that breaks when it is looked at (a raising ``__hash__`` or ``__eq__``) is
        ``invalid_value``, and with ``strict`` a :class:`ParameterError` naming the
        metric, the exception chained. Messages never show the value.
        """
        try:
            self._report(metric, value)
        except _REPORT_ERRORS as problem:
            if strict:
                raise
            cause = next(cause for kind, cause in _CAUSES if isinstance(problem, kind))
            self.drop(cause, f"dropped a report of {shown_metric(metric)}: {problem}")
        except Exception as problem:
            error = ParameterError("value", f"metric {shown_metric(metric)}: the report "
                                            f"failed: {type_name(problem)}")
            if strict:
                raise error from problem
            self.drop("invalid_value", f"dropped a report of {shown_metric(metric)}: {error}")

    def _report(self, metric: Any, value: Any) -> None:
        self.check_process()
        metrics = self.loader.metrics
        try:
            spec, encoder = metrics.prepared[metric]
        except (KeyError, TypeError):
            prepared = self._prepare(metrics, metric, value)
            if prepared is None:
                return
            spec, encoder = prepared
        key = self._check(metric, encoder, value)
        wire = make_report(secrets.token_hex(16), spec.name, encoder.cohort,
                           encoder.finish(encoder.memoized(key)), spec.params.fingerprint)
        validate_report(wire, metrics.registry)
        queued = self._queue_charged(spec, key, _JSON.encode(wire))
        if queued and self.on_queue is not None:
            self.on_queue()

    @staticmethod
    def _check(metric: Any, encoder: Encoder[Any], value: Any) -> bytes:
        """The memo key of ``value`` (:meth:`Encoder.memo_key`), or a :class:`ParameterError`
        (field ``value``) naming ``metric``: the encoder's message, or the exception the value
        raised when it was checked (chained, and named by its type only)."""
        try:
            return encoder.memo_key(value)
        except ParameterError as problem:
            raise ParameterError(
                "value", f"metric {shown_metric(metric)}: value {problem.message}") from None
        except Exception as problem:
            raise ParameterError(
                "value", f"metric {shown_metric(metric)}: value cannot be checked: "
                         f"{type_name(problem)} raised") from problem

    def _queue_charged(self, spec: Metric, key: bytes, body: str) -> bool:
        """Queue ``body`` and charge the ledger for it in one transaction (a report whose value
        is charged already costs nothing more, and is counted); return whether it was queued.

        A budget refuses the report by the number of reports queued so far alone
        (:meth:`~veil.client.accounting.PrivacyLedger.charged_after`), never by whether its
        value was reported before: the collector sees which reports arrive.
        """
        budget = self.options.budget
        charge = None
        with self.lock:
            with transaction(self.connection):
                queued, evicted = self._queue(body)
                if queued:
                    if budget is not None:
                        would_be = self.ledger.charged_after(spec)
                        if would_be > budget:
                            raise BudgetExceededError(spec.name, self.ledger.spent().charged,
                                                      would_be, budget, self._budget_note())
                    charge = self.ledger.charge(spec, key)
                    if charge is None:
                        self.ledger.count(spec)
                    else:
                        self.ledger.write(charge)
            if charge is not None:
                self.ledger.committed(charge)
            self.drops.outbox_full(self.outbox, evicted + (not queued),
                                   max_outbox=self.options.max_outbox,
                                   drop_oldest=self.options.drop_oldest)
        return queued

    def _queue(self, body: str) -> tuple[bool, int]:
        """Insert ``body`` into the outbox, if it has room or (``drop-oldest``) the oldest ready
        report makes room; return whether it was queued, and how many reports were evicted.
        Call it holding the lock, inside the caller's transaction."""
        limit = self.options.max_outbox
        if self.outbox.insert(body, limit):
            return True, 0
        if not self.options.drop_oldest:
            return False, 0
        evicted = self.outbox.evict_oldest(limit)
        return self.outbox.insert(body, limit), evicted

    def _prepare(
        self, metrics: Metrics, metric: Any, value: Any
    ) -> tuple[Metric, Encoder[Any]] | None:
        """The first report of ``metric``: the metric its reports go out as (itself, or the
        discovery channel this installation reports a string metric through:
        :func:`reporting_channel`) and that one's encoder, or ``None`` when the value waits for
        the registry or that metric is refused (dropped); unknown metrics, and a channel
        named directly, raise."""
        registry = metrics.registry
        if not isinstance(metric, str) or metric not in registry:
            if not metrics.loaded or self.loader.fetching:
                if not self.loader.wait(metrics, metric, value):
                    self._report(metric, value)  # the registry arrived meanwhile
                return None
            raise UnknownMetricError(metric, [name for name, spec in registry.items()
                                              if not spec.of])
        owner = registry[metric].of
        if owner:
            raise UnknownMetricError(
                metric, [],
                f"metric {shown_metric(metric)} is the discovery channel of {owner!r}, not a "
                f"metric to report to: report to {owner!r} (each installation reports it "
                "through one channel, chosen from its secret)")
        spec = reporting_channel(registry, metric, self.secret)
        why = metrics.refused.get(spec.name)
        if why is not None:
            self.drop("privacy_limit", f"dropped a report of {shown_metric(metric)}: {why}")
            return None
        with self.lock:
            layout = self.ledger.stream_layout(spec)
        prepared = (spec, make_encoder(spec, self.secret, self.cohort_seed, layout=layout))
        metrics.prepared[metric] = prepared
        return prepared

    def _budget_note(self) -> str:
        """Why the spend is what it is, for :class:`BudgetExceededError` after a ledger loss."""
        if self.ledger.lost_at is None:
            return ""
        return (
            f" (the privacy ledger was lost, noticed {self.ledger.lost_at}: the spend before "
            "that is unknown and counts as the whole budget)"
        )

    def drop(
        self, cause: str, message: str, count: int = 1, *, warn: bool = False, quiet: bool = False
    ) -> None:
        """Count ``count`` reports dropped for ``cause`` and log it (WARNING the first time, or
        with ``warn``; DEBUG with ``quiet``). The count is durable, unless the client is closed
        or the state database fails: then it is kept in memory."""
        with self.lock:
            self.drops.count(None if self.closed else self.outbox, cause, count)
        self.drops.log(cause, message, warn=warn, quiet=quiet)

    def drop_counts(self) -> dict[str, int]:
        """Reports dropped over the installation's lifetime, per cause (those at close, once
        closed)."""
        if self.closed:
            durable = self._drops_at_close
        else:
            self.check_process()
            with self.lock:
                durable = self.outbox.drops()
        return self.drops.totals(durable)

    def unreachable(self, problem: str, consequence: str) -> bool:
        """An upload or fetch could not reach the collector (``problem`` says how): count it in
        the outage under way, or begin one, and log it (a WARNING saying ``consequence`` when it
        begins the outage, else DEBUG). After close (a fetch that outlived it) only DEBUG.

        Returns whether the outage was announced by another run (or process): what it
        costs this run is then logged at DEBUG level too."""
        with self.lock:
            if self.closed:
                log.debug("cannot reach the collector: %s", problem)
                return True
            outage = self.outages.failed(self.connection)
            earlier = outage.since != self.outages.began
        log_failure(outage, problem, consequence)
        return earlier

    def reached(self) -> None:
        """The collector answered: end the outage under way, if any, with one INFO line."""
        with self.lock:
            ended = None if self.closed else self.outages.reached(self.connection)
        if ended is not None:
            log_recovery(ended)

    def outage(self) -> Outage | None:
        """The outage of the collector under way (the one at close, once closed)."""
        if self.closed:
            return self._outage_at_close
        self.check_process()
        with self.lock:
            return self.outages.current(self.connection)

    def spent(self) -> PrivacySpent:
        """The privacy ledger's spend."""
        self.check_process()
        with self.lock:
            return self.ledger.spent()

    def pending(self) -> int:
        """The outbox's reports and the values waiting for the registry, counted while no value
        moves from one to the other (so none is counted twice or not at all)."""
        with self.loader.waiting.settling, self.lock:
            return self.outbox.pending() + len(self.loader.waiting)

    def stop(self) -> int | None:
        """Mark the client closed (later drops are counted in memory) and keep the drop counts
        readable; return how many reports the outbox keeps for the next start (``None`` if the
        state database cannot say)."""
        try:
            with self.lock:
                self.closed = True
                self._outage_at_close = self.outages.current(self.connection)
                self._drops_at_close = self.outbox.drops()
                return self.outbox.pending()
        except sqlite3.Error as problem:
            log.warning("cannot read the drop counts at close: %s", problem)
            return None

    def close(self) -> None:
        """Close the connection to the state database."""
        with self.lock:
            self.connection.close()
