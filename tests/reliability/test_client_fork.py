"""A client carried across ``os.fork()``, as under gunicorn's ``--preload`` or
multiprocessing's fork start method.

The child reports through the client it inherited, or through a new one, while the parent
closes and reopens its own on the same state directory. SQLite keeps per-process lock state
for a database file: a connection opened in the child beside the inherited one shared the
parent's, so the child's writes went on under no lock the operating system knew of, and the
parent, closing what it took for the last connection, checkpointed and truncated the
write-ahead log under them ("database disk image is malformed" in every run). The state
database must stay sound and hold every report either process queued.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

from veil.client import Client
from veil.client.state_dir import DATABASE_FILE
from veil.shared.registry import Registry

REGISTRY = Registry.from_dict({"metrics": {"dark_mode": {"kind": "boolean"}}})
CHILD_REPORTS = 20_000

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def sound_outbox(state) -> int:
    """The reports in the state directory's outbox, once SQLite found its database sound."""
    database = sqlite3.connect(state / DATABASE_FILE)
    try:
        assert database.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return int(database.execute("SELECT count(*) FROM outbox").fetchone()[0])
    finally:
        database.close()


@pytest.mark.parametrize("child_client", ["inherited", "new"])
def test_a_forked_child_reporting_while_the_parent_reopens_keeps_the_database_sound(
        tmp_path, offline_url, child_client):
    state = tmp_path / "state"
    client = Client(offline_url, state, registry=REGISTRY)
    client.report("dark_mode", True)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(reader)
            mine = client if child_client == "inherited" else Client(offline_url, state,
                                                                     registry=REGISTRY)
            for index in range(CHILD_REPORTS):
                mine.report("dark_mode", index % 2 == 0)
            os.write(writer, str(sum(mine.drops.values())).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(writer)
    queued = 1
    for _ in range(6):  # the parent closes its connection and opens another, reporting
        time.sleep(0.2)
        client.close(timeout=0)
        client = Client(offline_url, state, registry=REGISTRY)
        client.report("dark_mode", False)
        queued += 1
    _, status = os.waitpid(pid, 0)
    child_dropped = int(os.read(reader, 100) or b"-1")
    os.close(reader)
    client.close(timeout=0)
    assert os.waitstatus_to_exitcode(status) == 0 and child_dropped == 0, child_dropped
    stored = sound_outbox(state)
    assert stored == queued + CHILD_REPORTS


def test_forks_while_another_thread_reports_wait_for_it_and_lose_nothing(tmp_path, offline_url):
    """``os.fork()`` while a second thread of the parent is inside ``report()`` copied a
    connection in the middle of its transaction: the child's first report waited 30 s for a
    lock nobody would release, then dropped. The fork now waits for the report's transaction
    to end; every child reports at once, and every report of both sides is there."""
    state = tmp_path / "state"
    client = Client(offline_url, state, registry=REGISTRY)
    stop = threading.Event()
    queued = [0]

    def report_until_stopped() -> None:
        while not stop.is_set():
            client.report("dark_mode", True)
            queued[0] += 1

    reporter = threading.Thread(target=report_until_stopped)
    reporter.start()
    children = []
    try:
        for _ in range(5):
            time.sleep(0.05)
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    started = time.monotonic()
                    for _ in range(100):
                        client.report("dark_mode", False)
                    ok = sum(client.drops.values()) == 0 and time.monotonic() - started < 10
                    status = 0 if ok else 1
                finally:
                    os._exit(status)
            children.append(pid)
    finally:
        stop.set()
        reporter.join()
    statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    client.close(timeout=0)
    assert statuses == [0] * 5
    stored = sound_outbox(state)
    assert stored == queued[0] + 5 * 100
