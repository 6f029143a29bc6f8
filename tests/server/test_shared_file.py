"""Two storages on one SQLite file in one process (the dashboard's discovery opens its own
beside the dashboard's or the collector's): closing one must leave the other's locks.

Closing any descriptor of a file drops every POSIX lock the process holds on it, SQLite's
included. When a second storage closed its own descriptor, another process (a read-only
``veil stats``) then took itself for the file's last user, checkpointed and deleted the
``-wal`` the first storage kept committing to: its later commits went to an unlinked
file and were lost at the next crash.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import requests

from tests.server.conftest import Wire
from veil.server.storage import open_storage
from veil.shared.registry import Registry

DISCOVERY_REGISTRY = Registry.from_toml("""
version = 1
[metrics.dark_mode]
kind = "boolean"
min_reports = 1
[metrics.landing_path]
kind = "string"
min_reports = 1
[metrics.landing_path.discovery]
min_reports = 1
share = 0.9
segment = 2
max_length = 8
epsilon = 4.0
""")


def _stored_by_another_process(db: Path) -> int:
    """The reports a fresh process reads in the file (and it closes its connection, which
    deletes the ``-wal`` if it can take the file's exclusive lock)."""
    code = (f"import sqlite3; c = sqlite3.connect({str(db)!r}); "
            "print(c.execute('SELECT count(*) FROM reports').fetchone()[0]); c.close()")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, timeout=60).stdout)


def test_closing_a_second_storage_leaves_the_first_ones_locks(tmp_path, wire) -> None:
    db = tmp_path / "veil.db"
    first = open_storage(db, wire.registry, create=True)
    try:
        first.insert(wire.validated(wire.reports("dark_mode", [True] * 10)))
        second = open_storage(db)
        second.close()
        assert _stored_by_another_process(db) == 10
        assert db.with_name("veil.db-wal").exists()  # still the first storage's
        first.insert(wire.validated(wire.reports("dark_mode", [False] * 10)))
        assert _stored_by_another_process(db) == 20
    finally:
        first.close()
    assert _stored_by_another_process(db) == 20


def test_a_discovery_page_then_a_crash_loses_no_acknowledged_report(collector_factory,
                                                                      tmp_path) -> None:
    """The review's sequence through the real server: ``veil serve --dashboard``, the
    discovery page, ``veil stats`` on the file, uploads, SIGKILL."""
    wire = Wire(DISCOVERY_REGISTRY)
    collector = collector_factory(DISCOVERY_REGISTRY, serve_args=["--dashboard"])

    def upload(values: list[bool]) -> None:
        answer = requests.post(collector.url + "/v1/reports", timeout=30,
                               json=wire.batch(wire.reports("dark_mode", values)))
        assert answer.json()["accepted"] == len(values)

    upload([True] * 10)
    populated = subprocess.run([sys.executable, "-m", "veil.server.cli", "populate", "--server",
                                collector.url, "--installations", "50", "--seed", "1",
                                "--metric", "landing_path", "--metric", "landing_path.discovery"],
                               capture_output=True, text=True, timeout=120)
    assert populated.returncode == 0, populated.stderr
    page = requests.get(collector.url + "/dashboard/discovery/landing_path",
                        params={"format": "json"}, headers=collector.headers(), timeout=60)
    assert page.status_code == 200, page.text[:500]
    assert "Nothing to search" not in page.text  # the search ran, over a storage of its own
    stats = subprocess.run([sys.executable, "-m", "veil.server.cli", "stats", "--db",
                            str(collector.db_path)], capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    upload([False] * 7)
    collector.kill()
    with open_storage(collector.db_path) as storage:
        assert sum(row["reports"] for row in storage.stats()["metrics"]) == 17 + 2 * 50
