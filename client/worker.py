"""The background uploader: a daemon thread that flushes the outbox while the application runs.

In the manner of sentry-python's ``BackgroundWorker``: the thread starts on
first use, never blocks the caller (:meth:`BackgroundWorker.nudge` only counts
a report and may wake the thread), is a daemon so it never keeps the
interpreter alive, and starts afresh in a forked child (threads do not survive
``fork()``, and the parent's locks may have been copied while held). At
interpreter exit it calls its owner's ``at_exit`` (the client's time-limited
final flush). Unlike sentry's worker it holds no queue: the reports wait in the
durable outbox, and the thread only decides when to flush it. Each wait lasts
the interval times a random factor in [0.8, 1.2] (:data:`INTERVAL_JITTER`), so
that many installations started together do not upload in lockstep.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger("veil.client")

#: each wait between background flushes is the interval times a factor drawn from this range
INTERVAL_JITTER = (0.8, 1.2)
_jitter = random.Random()


class BackgroundWorker:
    """Calls ``flush(stop)`` about every ``interval`` seconds (jittered), or as soon as
    ``batch_size`` reports wait.

    ``stop`` is set when the worker is stopping, so that ``flush`` can end its
    retry waits early. ``at_exit`` runs at interpreter exit if the worker was
    started and not stopped since.
    """

    def __init__(
        self,
        flush: Callable[[threading.Event], object],
        *,
        batch_size: int,
        interval: float,
        at_exit: Callable[[], object],
    ) -> None:
        self.batch_size = batch_size
        self.interval = interval
        self._flush = flush
        self._at_exit = at_exit
        self._exit_hook: Callable[[], None] | None = None
        self._reset()

    def _reset(self) -> None:
        """Fresh thread state for this process (at creation, and in a forked child)."""
        self._pid = os.getpid()
        self._wake = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._waiting = 0
        self._thread: threading.Thread | None = None

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def nudge(self) -> None:
        """Count one new report: start the thread if it is not running, wake it on a full batch."""
        self._check_fork()
        if self._thread is None or not self._thread.is_alive():
            self._start()
        with self._wake:
            self._waiting += 1
            if self._waiting >= self.batch_size:
                self._wake.notify()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to finish and wait at most ``timeout`` seconds for it.

        Returns ``False`` if it is still running (an upload outlived ``timeout``).
        The ``at_exit`` hook is withdrawn either way.
        """
        self._check_fork()
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
            self._exit_hook = None
        thread = self._thread
        if thread is None:
            return True
        self._stop.set()
        with self._wake:
            self._wake.notify()
        thread.join(timeout)
        return not thread.is_alive()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="veil-uploader", daemon=True)
        self._thread = thread
        thread.start()
        if self._exit_hook is None:
            # a weak reference: the exit hook alone does not keep the worker (and client) alive
            reference = weakref.ref(self)

            def at_exit() -> None:
                worker = reference()
                if worker is not None:
                    worker._at_exit()

            self._exit_hook = at_exit
            atexit.register(at_exit)

    def _run(self) -> None:
        stop, wake = self._stop, self._wake
        while not stop.is_set():
            with wake:
                if self._waiting < self.batch_size:
                    wake.wait(self.interval * _jitter.uniform(*INTERVAL_JITTER))
                self._waiting = 0
            if stop.is_set():
                break
            try:
                self._flush(stop)
            except Exception:
                log.exception("the background upload failed; the reports stay queued")
                stop.wait(self.interval * _jitter.uniform(*INTERVAL_JITTER))
