"""The collector's database files hold everyone's reports: only their owner may read them.

A real ``veil serve`` creates its SQLite file, the ``-wal`` and ``-shm`` files and the
writers' ``.lock`` file with mode 0600, whatever the umask it was started with.
"""

from __future__ import annotations

import os
import stat

import pytest
import requests

from veil.shared.wire import make_batch, make_report

FILES = ("veil.db", "veil.db-wal", "veil.db-shm", "veil.db.lock")


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_database_files_are_created_owner_only(collector_factory, umask):
    previous = os.umask(umask)
    try:
        collector = collector_factory()
    finally:
        os.umask(previous)
    params = collector.registry["dark_mode"].params
    batch = make_batch(os.urandom(16).hex(),
                       [make_report(os.urandom(16).hex(), "dark_mode", None, 1, params.fingerprint)])
    response = requests.post(collector.url + "/v1/reports", json=batch, timeout=30)
    assert response.status_code == 200, response.text
    modes = {name: stat.S_IMODE((collector.workdir / name).stat().st_mode) for name in FILES}
    assert modes == dict.fromkeys(FILES, 0o600)


def test_backups_are_created_owner_only(tmp_path):
    """veil backup's copy holds the same reports: 0600 whatever the umask."""
    from veil.server.storage import StorageError, open_storage
    from veil.shared.registry import Registry

    registry = Registry.from_toml('[metrics.dark_mode]\nkind = "boolean"\n')
    previous = os.umask(0o000)
    try:
        with open_storage(tmp_path / "veil.db", registry, create=True) as storage:
            target = storage.backup(tmp_path / "copy.db")
            with pytest.raises(StorageError, match="exists"):
                storage.backup(target)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with open_storage(target) as copy:
        assert "dark_mode" in copy.registry
