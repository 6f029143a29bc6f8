"""The SQLite file moved, deleted or truncated under a running ``veil serve``.

Done as an operator's mistake does it, to the real file of a real collector process: a
``mv`` or ``rm`` of the database while it serves, a crash while it is moved, and a
truncation (what ``cp backup.db veil.db`` over the live file does first). The collector
must stay up, refuse uploads (503: nothing acknowledged that it cannot keep), say why in
``/readyz`` and in its log, and every report it acknowledged must be in the database after
the recovery docs/operations.md gives, followed literally.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.conftest import CollectorHandle
from veil.shared.wire import make_batch, make_report

TIMEOUT = 30
MOVED = "moved, deleted or replaced while open"


def upload(collector: CollectorHandle, count: int) -> tuple[requests.Response, set[str]]:
    """POST a batch of ``count`` fresh string reports; the answer and the batch's report ids."""
    fingerprint = collector.registry["homepage"].params.fingerprint
    reports = [make_report(os.urandom(16).hex(), "homepage", i % 4, os.urandom(4).hex(),
                           fingerprint) for i in range(count)]
    response = requests.post(collector.url + "/v1/reports",
                             json=make_batch(os.urandom(16).hex(), reports), timeout=TIMEOUT)
    return response, {report["id"] for report in reports}


def acknowledge(collector: CollectorHandle, batches: int, count: int) -> set[str]:
    """Upload ``batches`` batches that must be stored whole; the ids the collector acknowledged."""
    acknowledged: set[str] = set()
    for _ in range(batches):
        response, ids = upload(collector, count)
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] == count
        acknowledged |= ids
    return acknowledged


def stored_ids(db: Path) -> set[str]:
    """The report ids in the database at ``db`` (with its WAL, as the next opener sees it)."""
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return {row[0].hex() for row in conn.execute("SELECT id FROM reports")}


def assert_refused(collector: CollectorHandle, cause: str) -> None:
    """An upload is answered 503 (JSON, nothing stored), and ``/readyz`` 503 naming ``cause``,
    which the log names too; the process still answers."""
    response, _ = upload(collector, 10)
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "5"
    assert response.json()["error"]["code"] == "unavailable"
    ready = requests.get(collector.url + "/readyz", timeout=TIMEOUT)
    assert ready.status_code == 503, ready.text
    assert cause in ready.json()["error"]["message"]
    assert cause in (collector.workdir / "serve.log").read_text()
    assert collector.process is not None and collector.process.poll() is None
    assert requests.get(collector.url + "/healthz", timeout=TIMEOUT).status_code == 200


def test_a_moved_file_refuses_uploads_and_moving_it_back_recovers(collector):
    db = collector.db_path
    acknowledged = acknowledge(collector, 1, 100)
    moved = db.with_name("moved.db")
    db.rename(moved)
    assert_refused(collector, MOVED)
    assert f"Move it back to {db}" in requests.get(collector.url + "/readyz",
                                                  timeout=TIMEOUT).json()["error"]["message"]

    moved.rename(db)  # docs/operations.md, Recovery: move it back; writes resume
    assert requests.get(collector.url + "/readyz", timeout=TIMEOUT).status_code == 200
    acknowledged |= acknowledge(collector, 1, 100)
    collector.kill()  # a crash: what is acknowledged is in the file and its WAL
    assert stored_ids(db) == acknowledged


def test_a_collector_that_crashed_while_its_file_was_moved_refuses_to_start(collector):
    """The WAL left at the old name holds the acknowledged reports; starting there must not
    create a fresh database (opening it would delete that WAL), and moving the file back
    recovers all of them."""
    db = collector.db_path
    acknowledged = acknowledge(collector, 2, 100)
    moved = db.with_name("moved.db")
    db.rename(moved)
    collector.kill()

    with pytest.raises(RuntimeError, match="did not start"):
        collector.start()
    log = (collector.workdir / "serve.log").read_text()
    assert f"{db}-wal holds transactions of a database that is no longer at {db}" in log
    assert not db.exists()

    moved.rename(db)  # docs/operations.md, Recovery: move the database back beside its WAL
    collector.start()
    assert collector.counts("homepage")["reports"] == len(acknowledged)
    collector.stop()
    assert stored_ids(db) == acknowledged


def test_a_deleted_file_refuses_uploads_and_is_copied_when_the_collector_stops(collector):
    db = collector.db_path
    acknowledged = acknowledge(collector, 1, 100)
    inode = db.stat().st_ino
    db.unlink()
    assert_refused(collector, MOVED)
    assert collector.stop() == 0

    # docs/operations.md, Recovery: the log names the copy; move the deleted file's WAL and
    # shared-memory file aside, put the copy in place and start
    rescued = db.with_name(f"{db.name}.rescued-{inode}")
    assert f"copied what it held to {rescued}" in (collector.workdir / "serve.log").read_text()
    assert rescued.stat().st_mode & 0o777 == 0o600
    for leftover in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        if leftover.exists():
            leftover.rename(leftover.with_name(leftover.name + ".deleted"))
    rescued.rename(db)
    collector.start()
    assert collector.counts("homepage")["reports"] == len(acknowledged)
    collector.stop()
    assert stored_ids(db) == acknowledged


@pytest.mark.parametrize("workers", [1, 2])
def test_a_truncated_file_is_refused_and_the_collector_stays_up(
        collector_factory: Callable[..., CollectorHandle], workers: int) -> None:
    """Truncated to half, as ``cp backup.db veil.db`` over the live file does first: uploads
    503, readiness 503 naming the cause, the cause in the log, and every process stays up
    (a page read through a memory map past the end of the file would kill it with SIGBUS)."""
    collector = collector_factory(workers=workers)
    acknowledge(collector, 20, 1000)
    collector.restart()  # a clean stop copies the WAL into the file: the reports are in it
    db = collector.db_path
    size = db.stat().st_size
    assert size > 1 << 20
    os.truncate(db, size // 2)
    for _ in range(2 * workers):
        assert_refused(collector, "shrank from")
    assert "is damaged" in (collector.workdir / "serve.log").read_text()
