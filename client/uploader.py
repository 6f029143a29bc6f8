"""Uploading: claim reports from the outbox, send them through the transport, settle the answer.

:class:`Uploader` is the client's upload loop, on the model of sentry-python's
split between the client, its ``Transport`` and the transport's
``BackgroundWorker``: it claims batches from the outbox (at most
``batch_size`` reports and ``max_batch_bytes``, fewer once the collector said a
batch was too large), hands each to the :class:`~veil.client.transport.Transport`,
and settles the outcome: acknowledged or finally refused reports leave the
outbox (the refused ones counted as dropped), the others are released for a
later flush. With ``background=True`` it owns the
:class:`~veil.client.worker.BackgroundWorker` that flushes from a daemon thread.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import secrets
import sqlite3
import threading
import time

from veil.client.options import ClientOptions, Location
from veil.client.recorder import Recorder
from veil.client.registry_source import counted_values
from veil.client.transport import Outcome, RetryPolicy, Transport
from veil.client.worker import BackgroundWorker
from veil.shared.wire import join_batch

log = logging.getLogger("veil.client")


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What one :meth:`Client.flush <veil.client.Client.flush>` did.

    ``sent`` reports were answered by the collector: ``accepted`` new ones,
    ``duplicates`` it already had (both leave the outbox), and ``rejected`` ones
    it refused for good (dropped from the outbox, counted in
    :attr:`Client.dropped`, and logged). ``remaining`` reports are still queued
    (values waiting in memory for the registry included); ``held`` of them are
    being uploaded by another thread or process sharing the state directory, so
    this flush could not send them. ``dropped`` values were given up by
    :meth:`Client.close`: they waited in memory for a registry that did not
    come (counted as ``no_registry``; ``remaining`` then counts only what the
    outbox keeps for the next start). ``error`` says why the flush did not empty
    the outbox (``None`` when it did).
    """

    batches: int = 0
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None
    held: int = 0
    dropped: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing went wrong (every claimed batch was acknowledged)."""
        return self.error is None


class Uploader:
    """Uploads what ``recorder`` queued to the collector at ``location``, through ``transport``."""

    def __init__(
        self, recorder: Recorder, transport: Transport, options: ClientOptions, location: Location
    ) -> None:
        self.recorder = recorder
        self.transport = transport
        self.options = options
        self.location = location
        #: the most reports per batch: ``batch_size``, halved each time the collector found a
        #: batch too large (its limit holds for later flushes too)
        self._batch_limit = options.batch_size
        #: whether the collector refused the last batch it answered (logged once until one passes)
        self._refused = False
        #: ``time.monotonic()`` before which the collector asked not to be sent anything
        #: (its ``Retry-After``, when longer than the retry policy waits)
        self._not_before = 0.0
        self.worker: BackgroundWorker | None = None
        if options.background:
            self.worker = BackgroundWorker(
                self._flush_in_background, batch_size=options.batch_size,
                interval=options.flush_interval,
            )
            recorder.on_queue = self.worker.nudge

    def flush(
        self, deadline: float | None, stop: threading.Event | None, policy: RetryPolicy,
        *, closing: bool = False, upload: bool = True,
    ) -> FlushResult:
        """Upload until the outbox is empty, an upload fails, or ``deadline``, with a failing
        state database reported in the result (``strict``: raised).

        ``stop`` set: the background worker's (it does not wait for the
        registry); ``closing``: fetch the registry in this thread (the last
        chance, and at exit no thread may start); ``upload=False``: use no
        network at all (a timeout of 0), only count what is pending.
        """
        try:
            return self._flush(deadline, stop, policy, closing=closing, upload=upload)
        except sqlite3.Error as problem:
            if self.options.strict:
                raise
            log.error("the state database failed during an upload: %s", problem)
            try:
                remaining = self.recorder.pending()
            except sqlite3.Error:
                remaining = len(self.recorder.loader.waiting)  # at least these are not uploaded
            return FlushResult(remaining=remaining, error=f"the state database failed: {problem}")

    def _flush(
        self, deadline: float | None, stop: threading.Event | None, policy: RetryPolicy,
        *, closing: bool, upload: bool,
    ) -> FlushResult:
        loader, recorder = self.recorder.loader, self.recorder
        if upload and stop is None:
            loader.await_registry(deadline, inline=closing)
        elif upload and not loader.metrics.loaded:
            loader.start_fetch()
        totals: collections.Counter[str] = collections.Counter()
        failed: Outcome | None = None
        asked = self._not_before - time.monotonic()
        if upload and asked > 0:
            failed = Outcome("unreachable", message=f"the collector asked to be sent nothing for "
                                                    f"{asked:.0f} s more (Retry-After)")
        while upload and failed is None:
            with recorder.lock:
                rows = recorder.outbox.claim(self._batch_limit, self.options.max_batch_bytes)
            if not rows:
                break
            failed = self._upload(rows, totals, deadline, stop, policy)
        with loader.waiting.settling, recorder.lock:
            remaining = recorder.outbox.pending()
            held = recorder.outbox.held() if remaining else 0
            waiting = len(loader.waiting)
        error = None if failed is None else failed.message
        if not upload and remaining + waiting:
            error = (f"{counted_values(remaining + waiting, 'report')} not uploaded: a timeout "
                     "of 0 or less uses no network")
        elif error is None and waiting:
            error = (f"{counted_values(waiting)} waiting in memory for the metric registry: "
                     f"{loader.problem or 'the fetch is still under way'}")
        elif error is None and held:
            error = (f"{held} reports are held by another upload in progress (another thread, "
                     "or another process sharing the state directory)")
        return FlushResult(remaining=remaining + waiting, error=error, held=held, **totals)

    def _upload(
        self, rows: list[tuple[int, str]], totals: collections.Counter[str],
        deadline: float | None, stop: threading.Event | None, policy: RetryPolicy,
    ) -> Outcome | None:
        """Send the claimed ``rows`` as one batch and settle the collector's answer, adding to
        ``totals``; return the outcome if uploading cannot go on (``None``: it can)."""
        recorder = self.recorder
        seqs = [seq for seq, _ in rows]
        body = join_batch(secrets.token_hex(16), [text for _, text in rows]).encode()
        try:
            outcome = self.transport.send(
                self.location.url, body, len(rows), token=self.location.token,
                timeout=self.options.timeout, policy=policy, deadline=deadline, stop=stop,
            )
        except BaseException:
            with recorder.lock:
                recorder.outbox.release(seqs)
            raise
        if outcome.kind == "acknowledged":
            answer = outcome.answer or {}
            rejected = answer["rejected"]
            with recorder.lock:
                recorder.outbox.delete(seqs)
                if rejected:
                    recorder.outbox.count_dropped("rejected", rejected)
            for item in answer.get("errors", [])[:20]:
                recorder.drops.log("rejected", f"the collector refused a report: {item}")
            self._note_upload(outcome)
            totals.update(batches=1, sent=len(rows), accepted=answer["accepted"],
                          duplicates=answer["duplicates"], rejected=rejected)
            return None
        if outcome.kind == "too_large" and len(rows) == 1:
            with recorder.lock:
                recorder.outbox.delete(seqs)
                recorder.outbox.count_dropped("rejected")
            self._note_upload(outcome)
            recorder.drops.log(
                "rejected", f"the collector refuses a report as too large: {outcome.message}"
            )
            totals.update(batches=1, sent=1, rejected=1)
            return None
        with recorder.lock:
            recorder.outbox.release(seqs)
        self._note_upload(outcome)
        if outcome.kind == "too_large":
            self._batch_limit = max(1, len(rows) // 2)
            return None
        return outcome

    def _note_upload(self, outcome: Outcome) -> None:
        """Note how an upload ended: an unreachable collector counts in the outage under way
        (:mod:`veil.client.outage`: one WARNING per outage, even across runs), any answer ends
        it; a refused batch is an ERROR, logged once until a batch is acknowledged again."""
        recorder = self.recorder
        if outcome.retry_after is not None:
            self._not_before = time.monotonic() + outcome.retry_after
        if outcome.kind == "unreachable":
            recorder.unreachable(outcome.message, "The reports stay queued and will be retried")
            return
        recorder.reached()
        if outcome.kind == "too_large":
            return
        refused = outcome.kind == "refused"
        with recorder.lock:
            was_refused, self._refused = self._refused, refused
        if refused and was_refused:
            log.debug("the collector refused a batch; the reports stay queued: %s",
                      outcome.message)
        elif refused:
            log.error("the collector refused a batch; the reports stay queued: %s (further "
                      "refusals are logged at debug level until a batch is accepted)",
                      outcome.message)
        elif was_refused:
            log.info("the collector accepts batches again")

    def _flush_in_background(self, stop: threading.Event) -> None:
        """The background worker's flush: retries as configured, waits end when ``stop`` is set."""
        self.flush(None, stop, self.options.retry_policy)

    def close(self, timeout: float, when: str) -> FlushResult | None:
        """Close the client: stop the background worker, then make one final flush of at most
        ``timeout`` seconds (0: none), then drop the values still waiting for the registry,
        close the state database and the transport. ``when`` says in log lines which of
        ``close()`` and the exit hook it was. ``None``: an upload in progress outlived
        ``timeout`` (its reports stay queued, and the database and transport open for it)."""
        recorder = self.recorder
        deadline = time.monotonic() + timeout
        if self.worker is not None and not self.worker.stop(timeout):
            if timeout > 0:
                log.warning("closing while an upload is still in progress; its reports stay "
                            "queued")
            self._stop_reporting(when)
            return None
        policy = dataclasses.replace(self.options.retry_policy, max_retries=0)
        result: FlushResult | None = None
        try:
            if timeout > 0:
                result = self.flush(deadline, None, policy, closing=True)
        finally:
            lost, queued = self._stop_reporting(when)
            recorder.close()
            self.transport.close()
        if result is None:  # no network: the outbox keeps its reports for the next start
            kept = queued or 0
            result = FlushResult(remaining=kept + lost, error=(
                f"{counted_values(kept, 'report')} kept for the next start: a timeout of 0 or "
                "less uses no network") if kept else None)
        if not lost:
            return result
        error = (f"dropped {counted_values(lost)} that waited in memory for the metric registry: "
                 f"{recorder.loader.problem or 'the fetch was still under way'}")
        return dataclasses.replace(
            result, dropped=lost, error=error,
            remaining=result.remaining - lost if queued is None else queued,
        )

    def _stop_reporting(self, when: str) -> tuple[int, int | None]:
        """At close: drop the values still waiting for the registry (counted, and logged as a
        WARNING), then mark the client closed and keep the drop counts readable (later drops
        are counted in memory). Returns how many values were dropped, and how many reports the
        outbox keeps for the next start (``None`` if the state database cannot say)."""
        loader = self.recorder.loader
        with loader.waiting.settling:
            return loader.abandon(when), self.recorder.stop()
