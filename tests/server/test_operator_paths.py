"""A database path whose directory is missing, or that names a directory, gets a message
naming the directory and what to do, from the storage and from every command."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
import requests

from veil.server.cli import main
from veil.server.storage import StorageError, open_storage


def test_a_missing_directory_is_named_with_the_fix(tmp_path, wire):
    db = tmp_path / "missing" / "dir" / "veil.db"
    with pytest.raises(StorageError) as refused:
        open_storage(db, wire.registry, create=True)
    message = str(refused.value)
    assert f"the directory {db.parent} does not exist" in message
    assert f"mkdir -p {db.parent}" in message
    assert not (tmp_path / "missing").exists()


def test_a_directory_given_as_the_database_is_named(tmp_path, wire):
    with pytest.raises(StorageError, match=f"{tmp_path} is a directory; give a file inside it"):
        open_storage(tmp_path, wire.registry, create=True)


def test_a_file_on_the_way_is_named(tmp_path, wire):
    (tmp_path / "plain").write_text("", encoding="utf-8")
    with pytest.raises(StorageError, match=f"{tmp_path / 'plain'}, on the path of .* is not a "
                                           "directory"):
        open_storage(tmp_path / "plain" / "veil.db", wire.registry, create=True)


@pytest.mark.parametrize("command", [
    ["check"], ["stats"], ["migrate", "--dry-run"], ["migrate"], ["backup", "--out", "copy.db"],
    ["export", "--metric", "homepage", "--out", "exports"], ["rebuild-aggregates"],
])
def test_every_command_names_the_missing_directory(tmp_path, capsys, command):
    db = tmp_path / "missing" / "veil.db"
    assert main([command[0], "--db", str(db), *command[1:]]) == 2  # a usage error
    error = capsys.readouterr().err
    assert f"the directory {tmp_path / 'missing'} does not exist" in error
    assert "unable to open database" not in error


def test_serve_names_the_missing_directory(tmp_path, wire):
    registry = tmp_path / "metrics.toml"
    registry.write_text(wire.registry.to_toml(), encoding="utf-8")
    db = tmp_path / "missing" / "veil.db"
    served = subprocess.run([sys.executable, "-m", "veil.server.cli", "serve", "--config",
                             str(registry), "--db", str(db), "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert served.returncode == 1
    assert f"create it first (mkdir -p {db.parent})" in served.stderr


def test_a_backup_into_a_missing_directory_is_named(tmp_path, wire):
    with open_storage(tmp_path / "veil.db", wire.registry, create=True) as storage, \
            pytest.raises(StorageError, match=r"cannot create the backup .* the directory "
                                              r".*backups does not exist; create it first"):
        storage.backup(tmp_path / "backups" / "copy.db")


@pytest.mark.parametrize("suffix", ["-journal", "-shm"])
def test_a_backup_named_as_one_of_the_databases_own_files_is_refused(tmp_path, wire, capsys,
                                                                      suffix):
    """veil.db-journal was written, then taken for a hot journal by the next opener of
    veil.db and deleted."""
    db = tmp_path / "veil.db"
    open_storage(db, wire.registry, create=True).close()
    target = tmp_path / f"veil.db{suffix}"
    target.unlink(missing_ok=True)
    assert main(["backup", "--db", str(db), "--out", str(target)]) == 1
    assert "a name SQLite or Veil gives the database's own files" in capsys.readouterr().err
    assert not target.exists()


def _foreign(path):
    """Another program's SQLite file (rollback journal, one table)."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    return path


def _left_alone(path, before: bytes) -> None:
    """The file's bytes are as they were, and nothing was created beside it."""
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize("command", [
    ["check"], ["stats"], ["migrate", "--dry-run"], ["migrate"], ["backup", "--out", "copy.db"],
    ["export", "--metric", "homepage", "--out", "exports"], ["rebuild-aggregates"],
    ["decode", "--metric", "homepage", "--out", "results"],
])
@pytest.mark.parametrize("kind", ["empty", "foreign"])
def test_commands_that_read_leave_an_empty_or_foreign_file_as_it_was(tmp_path, capsys,
                                                                    monkeypatch, command, kind):
    """A mistyped --db must not turn a file into a Veil database (or its journal to WAL)."""
    home = tmp_path / "files"
    home.mkdir()
    db = home / "some.db"
    if kind == "empty":
        db.touch()
    else:
        _foreign(db)
    before = db.read_bytes()
    monkeypatch.chdir(tmp_path)
    assert main([command[0], "--db", str(db), *command[1:]]) == 2  # a usage error
    error = capsys.readouterr().err
    expected = ("the file is empty; start the collector with this --db first" if kind == "empty"
                else "is an SQLite file but not a Veil database")
    assert expected in error
    _left_alone(db, before)


def test_serve_leaves_a_foreign_file_as_it_was(tmp_path, wire):
    registry = tmp_path / "metrics.toml"
    registry.write_text(wire.registry.to_toml(), encoding="utf-8")
    home = tmp_path / "files"
    home.mkdir()
    db = _foreign(home / "their.db")
    before = db.read_bytes()
    served = subprocess.run([sys.executable, "-m", "veil.server.cli", "serve", "--config",
                             str(registry), "--db", str(db), "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert served.returncode == 2
    assert "is an SQLite file but not a Veil database" in served.stderr
    _left_alone(db, before)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_serve_makes_an_empty_file_a_database(tmp_path, wire, collector_factory):
    """An empty file is refused by the commands that read, but veil serve, which creates its
    store, makes one of it."""
    db = tmp_path / "made.db"
    db.touch()
    collector = collector_factory(wire.registry, db=str(db))
    answer = requests.post(collector.url + "/v1/reports", timeout=30,
                           json=wire.batch(wire.reports("dark_mode", [True] * 3)))
    assert answer.json()["accepted"] == 3
    assert collector.stop() == 0
    assert main(["check", "--db", str(db)]) == 0


def test_a_read_only_store_is_named_with_the_fix(tmp_path, wire) -> None:
    """A backup kept read-only (mode 444) failed with SQLite's 'attempt to write a readonly
    database'. Run without root's override of file modes (setpriv drops it when the tests
    run as root)."""
    import os
    import shutil

    db = tmp_path / "backup.db"
    open_storage(db, wire.registry, create=True).close()
    db.chmod(0o444)
    command = [sys.executable, "-m", "veil.server.cli", "stats", "--db", str(db)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file modes do not apply")
        command = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--", *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "is read-only" in run.stderr and "copy it somewhere writable first" in run.stderr
