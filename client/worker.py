"""When the client uploads by itself: a daemon thread while the application runs, and a hook at exit.

:class:`BackgroundWorker`, in the manner of sentry-python's: the thread starts
on first use, never blocks the caller (:meth:`BackgroundWorker.nudge` only
counts a report and may wake the thread), is a daemon so it never keeps the
interpreter alive, and starts afresh in a forked child (threads do not survive
``fork()``, and the parent's locks may have been copied while held). Unlike
sentry's worker it holds no queue: the reports wait in the durable outbox, and
the thread only decides when to flush it. Each wait lasts the interval times a
random factor in [0.8, 1.2] (:data:`INTERVAL_JITTER`), so that many
installations started together do not upload in lockstep.

:class:`ExitHook`, like sentry-python's ``shutdown_timeout``: registered when
the client is made (not when its first report is queued), it gives the client
a bounded time at interpreter exit to fetch its registry, encode the values
that waited for it and upload, whether or not the application flushed or
closed it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("veil.client")

#: each wait between background flushes is the interval times a factor drawn from this range
INTERVAL_JITTER = (0.8, 1.2)
#: seconds :meth:`BackgroundWorker.stop` gives an idle thread to end, whatever its timeout (it
#: only has to wake and return: no network), so that even ``close(0)`` closes the client
IDLE_EXIT = 0.2
#: jitter from the OS's generator: a ``random.Random`` is copied by ``os.fork()``, and forked
#: processes would then wait and retry in lockstep
_jitter = random.SystemRandom()
_Owner = TypeVar("_Owner")


class BackgroundWorker:
    """Calls ``flush(stop)`` about every ``interval`` seconds (jittered), or as soon as
    ``batch_size`` reports wait.

    ``stop`` is set when the worker is stopping, so that ``flush`` can end its
    retry waits early.
    """

    def __init__(
        self, flush: Callable[[threading.Event], object], *, batch_size: int, interval: float
    ) -> None:
        self.batch_size = batch_size
        self.interval = interval
        self._flush = flush
        self._reset()

    def _reset(self) -> None:
        """Fresh thread state for this process (at creation, and in a forked child)."""
        self._pid = os.getpid()
        self._wake = threading.Condition(threading.Lock())
        self._stop = threading.Event()
        self._waiting = 0
        #: whether the thread is flushing (else it waits, and ends as soon as it is stopped)
        self._busy = False
        self._thread: threading.Thread | None = None

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def nudge(self) -> None:
        """Count one new report: start the thread if it is not running, wake it on a full batch.

        Once :meth:`stop` was called the thread is not started again (the
        client's final flush runs in the caller), nor during interpreter
        shutdown (Python 3.12 and later start no thread then): the exit hook
        uploads instead."""
        self._check_fork()
        if self._stop.is_set():
            return
        if self._thread is None or not self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._start()
        with self._wake:
            self._waiting += 1
            if self._waiting >= self.batch_size:
                self._wake.notify()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to finish and wait at most ``timeout`` seconds for it (a thread that
        is not flushing gets up to :data:`IDLE_EXIT` seconds, even for a ``timeout`` of 0).

        Returns ``False`` if it is still running (an upload outlived ``timeout``).
        """
        self._check_fork()
        thread = self._thread
        if thread is None:
            return True
        self._stop.set()
        with self._wake:
            self._wake.notify()
        thread.join(max(timeout, 0.0))
        if thread.is_alive() and not self._busy:
            thread.join(IDLE_EXIT)
        return not thread.is_alive()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="veil-uploader", daemon=True)
        thread.start()
        self._thread = thread

    def _run(self) -> None:
        stop, wake = self._stop, self._wake
        while not stop.is_set():
            with wake:
                if self._waiting < self.batch_size:
                    wake.wait(self.interval * _jitter.uniform(*INTERVAL_JITTER))
                self._waiting = 0
            if stop.is_set():
                break
            self._busy = True
            try:
                self._flush(stop)
            except Exception:
                self._busy = False
                log.exception("the background upload failed; the reports stay queued")
                stop.wait(self.interval * _jitter.uniform(*INTERVAL_JITTER))
            finally:
                self._busy = False


class ExitHook(Generic[_Owner]):
    """Calls ``at_exit(owner)`` at interpreter exit, once, unless :meth:`cancel` ran first.

    It refers to ``owner`` (the client) weakly, so registering it does not keep
    a client alive for the life of the process; a collected client is skipped.
    While values exist only in the client's memory (values waiting for the
    registry), :meth:`hold` keeps it alive so that exit can still deliver them
    or count them as lost. A forked child inherits the hook; the client decides
    whether it has anything to do in that process. The hook is withdrawn when
    the client closes (:meth:`cancel`) or is collected.
    """

    def __init__(self, owner: _Owner, at_exit: Callable[[_Owner], object]) -> None:
        self._owner = weakref.ref(owner)
        self._at_exit = at_exit
        self._held: _Owner | None = None
        atexit.register(self._run)
        weakref.finalize(owner, self.cancel).atexit = False

    def hold(self, owner: _Owner | None) -> None:
        """Keep ``owner`` alive until exit or :meth:`cancel` (``None``: refer to it weakly again)."""
        self._held = owner

    def cancel(self) -> None:
        """Withdraw the hook: nothing runs at exit."""
        self._held = None
        atexit.unregister(self._run)

    def _run(self) -> None:
        owner = self._owner()
        self.cancel()
        if owner is not None:
            self._at_exit(owner)
