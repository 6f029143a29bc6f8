"""The background worker: when it flushes, how it stops, and what happens at exit and after fork.

The worker only decides *when* to call ``flush(stop)``; these tests give it a
``flush`` that records its calls (the upload itself is tested elsewhere).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

import pytest

from veil.client import worker as worker_module
from veil.client.worker import BackgroundWorker, ExitHook


class Flushes:
    """A ``flush`` for the worker: records the calling process, then runs ``then(stop)``."""

    def __init__(self, then: Callable[[threading.Event], object] = lambda stop: None) -> None:
        self.pids: list[int] = []
        self.called = threading.Event()
        self.then = then

    def __call__(self, stop: threading.Event) -> None:
        self.pids.append(os.getpid())
        self.called.set()
        self.then(stop)


def make_worker(flush: Flushes, *, batch_size: int = 1000, interval: float = 60.0
                ) -> BackgroundWorker:
    return BackgroundWorker(flush, batch_size=batch_size, interval=interval)


def uploader_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "veil-uploader"]


def test_the_thread_starts_on_the_first_nudge_as_a_daemon():
    flushes = Flushes()
    before = uploader_threads()
    worker = make_worker(flushes, interval=0.02)
    assert not flushes.called.wait(0.1)  # five intervals pass without a flush
    assert flushes.pids == [] and uploader_threads() == before
    worker.nudge()
    assert flushes.called.wait(5)
    started = [thread for thread in uploader_threads() if thread not in before]
    assert len(started) == 1 and started[0].daemon
    assert worker.stop(5)


def test_a_full_batch_wakes_the_thread_at_once():
    flushes = Flushes()
    worker = make_worker(flushes, batch_size=3, interval=60)
    worker.nudge()
    worker.nudge()
    assert not flushes.called.wait(0.2)
    worker.nudge()
    assert flushes.called.wait(5)
    assert worker.stop(5)


def test_the_interval_flushes_without_more_reports():
    flushes = Flushes()
    worker = make_worker(flushes, interval=0.05)
    worker.nudge()
    deadline = time.monotonic() + 5
    while len(flushes.pids) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(flushes.pids) >= 3
    assert worker.stop(5)


def test_stop_ends_the_thread_and_cuts_the_waits_of_a_flush():
    """``stop`` reaches the flush in progress, so a retry wait ends at once."""
    flushes = Flushes(then=lambda stop: stop.wait(30))
    worker = make_worker(flushes, batch_size=1)
    worker.nudge()
    assert flushes.called.wait(5)
    started = time.monotonic()
    assert worker.stop(5)
    assert time.monotonic() - started < 2


def test_stop_says_when_an_upload_outlives_its_timeout():
    release = threading.Event()
    flushes = Flushes(then=lambda stop: release.wait(30))
    worker = make_worker(flushes, batch_size=1)
    worker.nudge()
    assert flushes.called.wait(5)
    assert worker.stop(0.1) is False
    release.set()
    assert worker.stop(5)


def test_a_failing_flush_is_logged_and_tried_again(caplog):
    def fail_once(stop: threading.Event) -> None:
        if len(flushes.pids) == 1:
            raise RuntimeError("disk on fire")

    flushes = Flushes(then=fail_once)
    worker = make_worker(flushes, interval=0.05)
    with caplog.at_level(logging.ERROR, logger="veil.client"):
        worker.nudge()
        deadline = time.monotonic() + 5
        while len(flushes.pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(flushes.pids) >= 2
    assert "the background upload failed" in caplog.text and "disk on fire" in caplog.text
    assert worker.stop(5)


def test_a_stopped_worker_is_not_started_again_by_a_report():
    """The client's final flush encodes the values that waited for the registry after the
    worker stopped: their reports must not start a second uploader under the closing client."""
    flushes = Flushes()
    worker = make_worker(flushes, batch_size=1)
    worker.nudge()
    assert flushes.called.wait(5)
    assert worker.stop(5)
    before = len(flushes.pids)
    worker.nudge()
    time.sleep(0.2)
    assert len(flushes.pids) == before and not worker._thread.is_alive()


class Owner:
    def __init__(self) -> None:
        self.exits = 0

    def at_exit(self) -> None:
        self.exits += 1


def test_the_exit_hook_refers_weakly_to_its_owner_unless_held(monkeypatch):
    registered: list[Callable[[], None]] = []
    register, unregister = atexit.register, atexit.unregister

    def record(hook: Callable[[], None]) -> None:
        (registered.append if isinstance(getattr(hook, "__self__", None), ExitHook)
         else register)(hook)

    def withdraw(hook: Callable[[], None]) -> None:
        (registered.remove if hook in registered else unregister)(hook)

    monkeypatch.setattr(worker_module.atexit, "register", record)
    monkeypatch.setattr(worker_module.atexit, "unregister", withdraw)
    owner = Owner()
    hook = ExitHook(owner, Owner.at_exit)
    assert len(registered) == 1
    registered[0]()
    assert owner.exits == 1 and registered == []  # once only

    held, dropped = Owner(), Owner()
    held_hook = ExitHook(held, Owner.at_exit)
    held_hook.hold(held)
    ExitHook(dropped, Owner.at_exit)
    reference = weakref.ref(dropped)
    del held, dropped
    gc.collect()
    assert reference() is None  # a collected owner withdrew its hook
    assert registered == [held_hook._run]
    registered[0]()  # the held one is still there at exit
    assert hook is not None and registered == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_thread():
    flushes = Flushes()
    worker = make_worker(flushes, batch_size=1)
    worker.nudge()
    assert flushes.called.wait(5)
    flushes.called.clear()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread did not survive the fork
        status = 1
        try:
            worker.nudge()
            if flushes.called.wait(5) and flushes.pids[-1] == os.getpid():
                status = 0 if worker.stop(5) else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert set(flushes.pids) == {os.getpid()}
    assert worker.stop(5)
