"""The :class:`Client` applications embed: report values, flush them, see the privacy spent.

The client is a facade over its parts: the encoders randomize values, the
:class:`~veil.client.outbox.Outbox` and the
:class:`~veil.client.accounting.PrivacyLedger` keep reports and epsilon in the
state database, a :class:`~veil.client.transport.Transport` carries batches to
the collector, and a :class:`~veil.client.worker.BackgroundWorker` flushes
from a daemon thread when ``background=True``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from veil.client.accounting import PrivacyLedger, PrivacySpent
from veil.client.encoders import make_encoder
from veil.client.encoders.base import Encoder
from veil.client.errors import BudgetExceededError, ClientClosedError, UnknownMetricError
from veil.client.limits import DEFAULT_MAX_EPSILON_PER_VALUE, PrivacyLimits
from veil.client.outbox import Outbox
from veil.client.registry_source import resolve_registry
from veil.client.state import (
    cohort_seed,
    ledger_lost_at,
    open_database,
    open_state,
    prepare_directory,
    transaction,
)
from veil.client.transport import RequestsTransport, RetryPolicy, Transport
from veil.client.worker import BackgroundWorker
from veil.shared.errors import ParameterError
from veil.shared.registry import Metric, Registry
from veil.shared.wire import join_batch, make_report, validate_report

log = logging.getLogger("veil.client")

MAX_BATCH_SIZE = 10_000
#: default cap of the outbox, in reports (115 to 520 bytes each on disk, by kind and k)
DEFAULT_MAX_OUTBOX = 100_000
_JSON = json.JSONEncoder(separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What one :meth:`Client.flush` did.

    ``sent`` reports were answered by the collector: ``accepted`` new ones,
    ``duplicates`` it already had (both leave the outbox), and ``rejected`` ones
    it refused for good (dropped from the outbox, counted in
    :attr:`Client.dropped`, and logged). ``remaining`` reports are still queued;
    ``error`` says why the flush stopped early (``None`` when it emptied the outbox).
    """

    batches: int = 0
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing went wrong (every claimed batch was acknowledged)."""
        return self.error is None


def _positive(name: str, value: Any, *, integer: bool = False, upper: float = math.inf) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value <= upper:
        what = "an integer" if integer else "a number"
        bound = f" and at most {upper:g}" if math.isfinite(upper) else ""
        raise ParameterError(name, f"{name} must be {what} greater than 0{bound}; got {value!r}")


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ParameterError(
            "url",
            f"url must be the collector's base URL, like 'https://veil.example.org'; got {url!r}",
        )
    return url.rstrip("/")


class Client:
    """Records values privately and uploads the randomized reports to a Veil collector.

    ``Client(url, state_dir)`` fetches the metric registry from the collector
    (or takes ``registry=``: a :class:`~veil.shared.registry.Registry` or a
    TOML path) and keeps its installation secret, outbox and privacy ledger in
    ``state_dir``. :meth:`report` never touches the network; :meth:`flush`
    uploads, or ``background=True`` lets a daemon thread do it every
    ``flush_interval`` seconds or ``batch_size`` reports. ``budget`` caps the
    installation's total worst-case epsilon; ``max_epsilon_per_value``,
    ``max_epsilon_per_report`` and ``pinned`` are the application's own limits on
    what the collector's registry may ask (metrics beyond them are refused:
    :attr:`refused_metrics`). ``max_outbox`` caps the reports kept while the
    collector is unreachable. ``transport`` replaces the default
    :class:`~veil.client.transport.RequestsTransport`; :meth:`close` closes it.
    """

    def __init__(
        self,
        url: str,
        state_dir: str | os.PathLike[str],
        *,
        registry: Registry | str | os.PathLike[str] | None = None,
        token: str | None = None,
        budget: float | None = None,
        background: bool = False,
        batch_size: int = 500,
        timeout: float = 10.0,
        max_retries: int = 5,
        flush_interval: float = 5.0,
        max_batch_bytes: int = 1_000_000,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        transport: Transport | None = None,
        max_outbox: int = DEFAULT_MAX_OUTBOX,
        max_epsilon_per_value: float | None = DEFAULT_MAX_EPSILON_PER_VALUE,
        max_epsilon_per_report: float | None = None,
        pinned: Mapping[str, str] | None = None,
    ) -> None:
        self.url = _check_url(url)
        if token is not None and (not isinstance(token, str) or not token or "\n" in token):
            raise ParameterError(
                "token", "token must be a non-empty string (or None for open collectors)"
            )
        if budget is not None:
            _positive("budget", budget)
        if not isinstance(background, bool):
            raise ParameterError(
                "background", f"background must be True or False; got {background!r}"
            )
        _positive("batch_size", batch_size, integer=True, upper=MAX_BATCH_SIZE)
        _positive("timeout", timeout, upper=3600)
        _positive("flush_interval", flush_interval, upper=86400)
        _positive("max_batch_bytes", max_batch_bytes, integer=True)
        _positive("backoff_base", backoff_base, upper=3600)
        _positive("backoff_cap", backoff_cap, upper=3600)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ParameterError(
                "max_retries", f"max_retries must be an integer >= 0; got {max_retries!r}"
            )
        _positive("max_outbox", max_outbox, integer=True)
        self._limits = PrivacyLimits.checked(max_epsilon_per_report, max_epsilon_per_value, pinned)
        if transport is not None and not isinstance(transport, Transport):
            raise ParameterError(
                "transport",
                "transport must be a veil.client.Transport, or None for the default "
                f"RequestsTransport; got {type(transport).__name__}",
            )
        self.token = token
        self.budget = budget
        self.background = background
        self.batch_size = batch_size
        self._batch_limit = batch_size
        self.timeout = float(timeout)
        self.flush_interval = float(flush_interval)
        self.max_batch_bytes = max_batch_bytes
        self.max_outbox = max_outbox
        self.retry_policy = RetryPolicy(max_retries, float(backoff_base), float(backoff_cap))

        self.state_dir: Path = prepare_directory(state_dir)
        self.transport: Transport = RequestsTransport() if transport is None else transport
        connection: sqlite3.Connection | None = None
        try:
            self.registry: Registry = resolve_registry(
                registry, self.url, self.state_dir, self.transport,
                token=self.token, timeout=self.timeout,
            )
            connection, self._secret = open_state(self.state_dir)
            self._attach(connection, recover=True)
            self._cohort_seed = cohort_seed(connection, self._secret)
        except BaseException:
            if connection is not None:
                connection.close()
            if transport is None:  # a transport the caller passed in stays theirs until we exist
                self.transport.close()
            raise
        #: metrics this application's limits refuse, with why: never encoded, reports dropped
        self.refused_metrics: dict[str, str] = self._limits.refusals(self.registry)
        for why in self.refused_metrics.values():
            log.error("%s", why)
        for name in sorted(set(self._limits.pinned) - set(self.registry)):
            log.warning("pinned metric %r is not in the registry", name)
        #: reports dropped since the outbox was last found full (logged once per episode)
        self._outbox_full_drops = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned: list[sqlite3.Connection] = []
        self._encoders: dict[str, Encoder[Any]] = {}
        self._worker = (
            BackgroundWorker(self._flush_in_background, batch_size=batch_size,
                             interval=self.flush_interval, at_exit=self._close_at_exit)
            if background else None
        )

    # ---------------------------------------------------------------- set-up

    @property
    def session(self) -> requests.Session:
        """The default transport's ``requests.Session``: set proxies, CA bundles or headers there."""
        if not isinstance(self.transport, RequestsTransport):
            raise AttributeError(
                f"this client sends through {type(self.transport).__name__}; "
                "only the default RequestsTransport has a session"
            )
        return self.transport.session

    def _attach(self, connection: sqlite3.Connection, *, recover: bool) -> None:
        """Use ``connection`` (to the state database) for the outbox and the ledger."""
        self._connection = connection
        self._outbox = Outbox(connection)
        self._ledger = PrivacyLedger(
            connection, self._secret, self.budget, ledger_lost_at(connection)
        )
        if recover:
            returned = self._outbox.recover()
            if returned:
                log.info("%d reports whose upload was interrupted are queued again", returned)

    def _check_process(self) -> None:
        """Raise if closed; after ``os.fork()`` give the child its own connection.

        (The worker and the default transport notice the fork themselves.)
        """
        if self._closed:
            raise ClientClosedError("this Client is closed; create a new one")
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            # never close the parent's SQLite connection in the child: closing it would
            # release this process's POSIX locks on the database (SQLite's fork caveat)
            self._abandoned.append(self._connection)
            self._attach(open_database(self.state_dir), recover=False)

    def _metric(self, name: Any) -> Metric:
        if not isinstance(name, str) or name not in self.registry:
            raise UnknownMetricError(name, list(self.registry))
        return self.registry[name]

    def _encoder(self, metric: Metric) -> Encoder[Any]:
        encoder = self._encoders.get(metric.name)
        if encoder is None:
            encoder = make_encoder(metric, self._secret, self._cohort_seed)
            self._encoders[metric.name] = encoder
        return encoder

    # ---------------------------------------------------------------- reporting

    def report(self, metric: str, value: Any) -> None:
        """Randomize ``value`` for ``metric`` and queue the report durably.

        When this returns, the report (randomized; the raw value is never stored)
        is committed to the outbox: it survives the application crashing. Raises
        :class:`UnknownMetricError`, :class:`~veil.shared.errors.ParameterError`
        (a value of the wrong type or outside the category list) or
        :class:`BudgetExceededError`; in each case nothing is queued.

        Two drops never raise; they are counted in :attr:`drops` and logged: a
        metric this application's limits refuse (:attr:`refused_metrics`) is
        never encoded, and while the outbox holds ``max_outbox`` reports a new
        one is not queued (nor charged to the ledger).
        """
        self._check_process()
        spec = self._metric(metric)
        if spec.name in self.refused_metrics:
            with self._lock:
                self._outbox.count_dropped("privacy_limit")
            return
        encoder = self._encoder(spec)
        key = encoder.memo_key(value)
        wire = make_report(secrets.token_hex(16), spec.name, encoder.cohort,
                           encoder.finish(encoder.memoized(key)), spec.params.fingerprint)
        validate_report(wire, self.registry)
        body = _JSON.encode(wire)
        with self._lock:
            if self._ledger.saturated(spec, key):
                # costs nothing more: a single autocommitted insert
                queued = self._outbox.insert(body, self.max_outbox)
            else:
                with transaction(self._connection):
                    queued = self._outbox.insert(body, self.max_outbox)
                    charge = self._ledger.charge(spec, key) if queued else None
                    if charge is not None:
                        if self.budget is not None:
                            total = self._ledger.total_after(charge)
                            if total > self.budget:
                                raise BudgetExceededError(
                                    spec.name, self._ledger.spent().total, total, self.budget,
                                    self._budget_note(),
                                )
                        self._ledger.write(charge)
                if charge is not None:
                    self._ledger.committed(charge)
            self._note_outbox(queued)
        if queued and self._worker is not None:
            self._worker.nudge()

    def _budget_note(self) -> str:
        """Why the spend is what it is, for :class:`BudgetExceededError` after a ledger loss."""
        if self._ledger.lost_at is None:
            return ""
        return (
            f" (the privacy ledger was lost, noticed {self._ledger.lost_at}: the spend before "
            "that is unknown and counts as the whole budget)"
        )

    def _note_outbox(self, queued: bool) -> None:
        """Count a report the full outbox did not take; log once when the outbox starts
        dropping reports, and once when it has room again."""
        if not queued:
            self._outbox.count_dropped("outbox_full")
            if not self._outbox_full_drops:
                log.warning(
                    "the outbox holds max_outbox=%d reports that the collector has not taken: "
                    "new reports are dropped (counted in client.drops['outbox_full']) until an "
                    "upload makes room", self.max_outbox,
                )
            self._outbox_full_drops += 1
        elif self._outbox_full_drops:
            log.warning(
                "the outbox has room again; %d reports were dropped while it was full",
                self._outbox_full_drops,
            )
            self._outbox_full_drops = 0

    def privacy_spent(self) -> PrivacySpent:
        """The worst-case epsilon spent so far, per metric and in total."""
        self._check_process()
        with self._lock:
            return self._ledger.spent()

    @property
    def pending(self) -> int:
        """Reports waiting in the outbox."""
        self._check_process()
        with self._lock:
            return self._outbox.pending()

    @property
    def dropped(self) -> int:
        """Reports dropped over the installation's lifetime, whatever the cause (see :attr:`drops`)."""
        return sum(self.drops.values())

    @property
    def drops(self) -> dict[str, int]:
        """Reports dropped over the installation's lifetime, per cause: ``rejected`` (refused for
        good by the collector), ``outbox_full`` and ``privacy_limit`` (a refused metric)."""
        self._check_process()
        with self._lock:
            return self._outbox.drops()

    @property
    def cohort_seed(self) -> int:
        """The installation's cohort seed, derived from its secret (each string metric uses it
        modulo ``m``; a state database from an SDK older than that keeps its random one)."""
        return self._cohort_seed

    # ---------------------------------------------------------------- uploading

    def flush(self, timeout: float | None = None) -> FlushResult:
        """Upload every queued report in batches; ``timeout`` bounds the whole call (seconds).

        Reports leave the outbox only once the collector acknowledged them
        (accepted or duplicate) or refused them for good (counted as dropped).
        On network failure they stay queued and ``error`` says why.
        """
        self._check_process()
        if timeout is not None:
            _positive("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._flush(deadline, None, self.retry_policy)

    def _flush(
        self, deadline: float | None, stop: threading.Event | None, policy: RetryPolicy
    ) -> FlushResult:
        totals = {"batches": 0, "sent": 0, "accepted": 0, "duplicates": 0, "rejected": 0}
        error: str | None = None
        while True:
            limit = self._batch_limit
            with self._lock:
                rows = self._outbox.claim(limit, self.max_batch_bytes)
            if not rows:
                break
            seqs = [seq for seq, _ in rows]
            body = join_batch(secrets.token_hex(16), [text for _, text in rows]).encode()
            try:
                outcome = self.transport.send(
                    self.url, body, len(rows), token=self.token, timeout=self.timeout,
                    policy=policy, deadline=deadline, stop=stop,
                )
            except BaseException:
                with self._lock:
                    self._outbox.release(seqs)
                raise
            if outcome.kind == "acknowledged":
                answer = outcome.answer or {}
                rejected = answer["rejected"]
                with self._lock:
                    self._outbox.delete(seqs)
                    if rejected:
                        self._outbox.count_dropped("rejected", rejected)
                for item in answer.get("errors", [])[:20]:
                    log.warning("the collector refused a report (dropped): %s", item)
                totals["batches"] += 1
                totals["sent"] += len(rows)
                totals["accepted"] += answer["accepted"]
                totals["duplicates"] += answer["duplicates"]
                totals["rejected"] += rejected
                continue
            if outcome.kind == "too_large" and len(rows) == 1:
                with self._lock:
                    self._outbox.delete(seqs)
                    self._outbox.count_dropped("rejected")
                log.warning(
                    "dropped a report the collector refuses as too large: %s", outcome.message
                )
                totals["batches"] += 1
                totals["sent"] += 1
                totals["rejected"] += 1
                continue
            with self._lock:
                self._outbox.release(seqs)
            if outcome.kind == "too_large":
                # the collector's limit holds for later flushes too
                self._batch_limit = max(1, len(rows) // 2)
                continue
            error = outcome.message
            if outcome.kind == "refused":
                log.error("the collector refused a batch; the reports stay queued: %s", error)
            else:
                log.warning("upload failed; the reports stay queued: %s", error)
            break
        with self._lock:
            remaining = self._outbox.pending()
        return FlushResult(remaining=remaining, error=error, **totals)

    def _flush_in_background(self, stop: threading.Event) -> None:
        """The background worker's flush: retries as configured, waits end when ``stop`` is set."""
        self._flush(None, stop, self.retry_policy)

    # ---------------------------------------------------------------- closing

    def close(self, timeout: float = 5.0) -> FlushResult | None:
        """Stop the background uploader, then try one final flush of at most ``timeout`` seconds.

        The final flush makes one attempt per batch (no backoff waits), so closing
        is quick when the collector is down; undelivered reports stay in the
        outbox for the next start. Returns that flush's result, or ``None`` if the
        client was already closed or an upload in progress outlived ``timeout``.
        """
        if self._closed:
            return None
        _positive("timeout", timeout)
        if self._pid != os.getpid():
            # a forked child that never used the client: the parent's connection is not ours
            self._closed = True
            return None
        deadline = time.monotonic() + timeout
        stopped = self._worker is None or self._worker.stop(max(deadline - time.monotonic(), 0.0))
        self._closed = True
        if not stopped:
            log.warning("closing while an upload is still in progress; its reports stay queued")
            return None
        policy = dataclasses.replace(self.retry_policy, max_retries=0)
        try:
            result = self._flush(deadline, None, policy)
        finally:
            with self._lock:
                self._connection.close()
            self.transport.close()
        return result

    def _close_at_exit(self) -> None:
        """Close at interpreter exit, unless already closed or inherited through a fork unused."""
        if not self._closed and self._pid == os.getpid():
            self.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, state_dir={str(self.state_dir)!r})"
