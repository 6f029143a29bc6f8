"""``/readyz`` says whether writes can succeed, where ``/healthz`` only says the process answers.

A collector is not ready while its database's filesystem is short of free space, or once
its database file was moved or replaced under it (writes would go to a file no longer
there). A write lock held by another process is not a reason: writes queue behind it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

from veil.server.collector import EXTENSION


def test_readyz_is_503_while_free_space_is_below_the_threshold(app_factory, tmp_path):
    free = shutil.disk_usage(tmp_path).free
    short = app_factory(MIN_FREE_BYTES=free + 2**40).test_client()
    response = short.get("/readyz")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json["error"]["code"] == "unavailable"
    assert "bytes are free on the filesystem" in response.json["error"]["message"]
    assert short.get("/healthz").status_code == 200

    assert app_factory(MIN_FREE_BYTES=free // 2).test_client().get("/readyz").status_code == 200


def test_readyz_follows_whether_writes_land_in_the_database_file(app_factory, tmp_path):
    """Ready while another process holds the write lock (writes wait for it); not ready once
    the file is replaced while the collector runs, as a restore done without stopping the
    collector would."""
    app = app_factory()
    db = Path(app.config["DATABASE"])
    client = app.test_client()
    with sqlite3.connect(db, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        assert client.get("/readyz").status_code == 200
        assert time.monotonic() - started < 2
        other.execute("ROLLBACK")

    copy = app.extensions[EXTENSION].storage.backup(tmp_path / "copy.db")
    os.replace(copy, db)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "moved, deleted or replaced" in response.json["error"]["message"]
