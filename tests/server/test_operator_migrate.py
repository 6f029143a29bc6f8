"""Schema migrations run only when asked: ``veil migrate [--dry-run]`` and ``veil serve --migrate``;
an older database is refused with the command that migrates it."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import CollectorHandle
from tests.server.conftest import before_the_fold_mark
from veil.server.cli import main
from veil.server.storage import (
    SchemaOutdatedError,
    StorageError,
    open_storage,
    pending_migrations,
)
from veil.server.storage.sqlite import MIGRATIONS, SCHEMA_VERSION
from veil.shared.wire import validate_batch

DAY = "2026-11-02"


@pytest.fixture
def old_db(tmp_path, wire) -> Path:
    """A database holding reports, turned back into the version 3 layout."""
    path = tmp_path / "veil.db"
    reports = wire.reports("homepage", ["a.example", "b.example"] * 3) \
        + wire.reports("dark_mode", [True, False, True])
    with open_storage(path, wire.registry, create=True) as storage:
        storage.insert(validate_batch(wire.batch(reports), wire.registry).reports, DAY)
    before_the_fold_mark(path)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO report_ids SELECT id FROM recent_ids")
        conn.execute("DROP TABLE recent_ids")
        conn.execute("DELETE FROM meta WHERE key = 'ids_generation'")
        conn.execute("PRAGMA user_version = 3")
    conn.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def test_an_older_database_is_refused_with_the_command_that_migrates_it(old_db):
    before = digest(old_db)
    with pytest.raises(SchemaOutdatedError) as refused:
        open_storage(old_db)
    message = str(refused.value)
    assert f"schema version 3, older than this Veil's ({SCHEMA_VERSION})" in message
    assert f"veil migrate --db {old_db}" in message and "veil serve --migrate" in message
    assert user_version(old_db) == 3 and digest(old_db) == before


def test_dry_run_lists_the_pending_steps_and_changes_nothing(old_db, capsys):
    before = digest(old_db)
    assert [step.version for step in pending_migrations(old_db)] == list(range(3, SCHEMA_VERSION))
    assert main(["migrate", "--db", str(old_db), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for version in range(3, SCHEMA_VERSION):
        description = MIGRATIONS[version].__doc__.strip().splitlines()[0]
        assert f"schema {version} -> {version + 1}: {description}" in out
    assert "Nothing was changed" in out
    assert digest(old_db) == before and user_version(old_db) == 3


def test_migrate_applies_each_step_says_so_and_keeps_every_report(old_db, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="veil.server.storage"):
        assert main(["migrate", "--db", str(old_db)]) == 0
    out = capsys.readouterr().out
    assert f"from schema version 3 to {SCHEMA_VERSION}" in out
    assert f"migrating {old_db}: schema 3 -> 4" in out
    assert f"{old_db} is at schema version {SCHEMA_VERSION}" in out
    assert any("migrating" in record.getMessage() for record in caplog.records)
    assert user_version(old_db) == SCHEMA_VERSION
    with open_storage(old_db) as storage:
        assert storage.migrated == ()
        assert storage.total_reports() == 9
        assert storage.counts("homepage", min_reports=0)["reports"] == 6
    assert main(["migrate", "--db", str(old_db)]) == 0
    assert "is up to date" in capsys.readouterr().out


def test_migrate_takes_the_database_from_veil_db(old_db, capsys, monkeypatch):
    monkeypatch.setenv("VEIL_DB", str(old_db))
    assert main(["migrate", "--dry-run"]) == 0
    assert "schema 3 -> 4" in capsys.readouterr().out


def test_new_files_start_at_the_current_schema_without_asking(tmp_path, wire):
    with open_storage(tmp_path / "new.db", wire.registry, create=True) as storage:
        assert storage.migrated == ()
    assert user_version(tmp_path / "new.db") == SCHEMA_VERSION
    assert pending_migrations(tmp_path / "new.db") == []


def test_dry_run_refuses_what_it_cannot_migrate(tmp_path, capsys):
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match="newer than this Veil"):
        pending_migrations(newer)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StorageError, match="not a Veil database"):
        pending_migrations(foreign)
    assert main(["migrate", "--db", str(tmp_path / "missing.db"), "--dry-run"]) == 2
    assert "no Veil database at" in capsys.readouterr().err


def test_serve_refuses_an_older_database_unless_told_to_migrate(old_db, wire, tmp_path):
    refused = CollectorHandle(tmp_path, wire.registry)
    assert refused.db_path == old_db
    with pytest.raises(RuntimeError, match=r"exit code 1\) and printed ''"):
        refused.start()
    log = tmp_path / "serve.log"
    assert f"veil migrate --db {old_db}" in log.read_text()
    assert user_version(old_db) == 3

    migrating = CollectorHandle(tmp_path, wire.registry, serve_args=["--migrate"])
    migrating.start()
    try:
        assert user_version(old_db) == SCHEMA_VERSION
    finally:
        migrating.stop()
    assert f"migrating {old_db}: schema 3 -> 4" in log.read_text()


def test_an_older_database_can_be_backed_up_before_it_is_migrated(old_db, capsys):
    """The refusal says 'Back it up (veil backup), then migrate it', and veil backup refused
    the same file with the same message."""
    before = digest(old_db)
    copy = old_db.with_name("copy.db")
    assert main(["backup", "--db", str(old_db), "--out", str(copy)]) == 0
    assert "at its older schema as it is; migrate the original with: veil migrate" in \
        capsys.readouterr().out
    assert digest(old_db) == before and user_version(copy) == 3
    assert main(["migrate", "--db", str(copy)]) == 0  # the copy is a whole database
    with open_storage(copy) as migrated:
        assert migrated.stats()["reports"] == 9


def test_check_says_it_cannot_check_another_schema_with_exit_2(old_db, tmp_path, capsys):
    """1 means damaged or inconsistent, which an older or newer file is not known to be:
    monitoring read the older one as damaged."""
    assert main(["check", "--db", str(old_db)]) == 2
    assert "older than this Veil's" in capsys.readouterr().err
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.close()
    assert main(["check", "--db", str(newer)]) == 2
    assert "and this Veil checks version" in capsys.readouterr().err
