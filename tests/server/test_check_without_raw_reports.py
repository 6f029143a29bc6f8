"""``veil check`` and ``veil rebuild-aggregates`` on aggregates that have no raw reports
behind them: a store filled by ``veil aggregate`` from an archive, or days whose raw
reports were deleted. check called them inconsistent and advised a rebuild, which on
SQLite set every such count to zero; a store whose raw reports were deleted was said to
have them "intact". From the outside: the commands, their output and exit codes."""

from __future__ import annotations

import sqlite3

from tests.server.test_archive import DAYS, documents, fill
from veil.server.archive import aggregate, archive
from veil.server.cli import main
from veil.server.storage import open_storage


def test_a_store_filled_from_an_archive_checks_sound_and_survives_a_rebuild(
        tmp_path, wire, capsys) -> None:
    with open_storage(tmp_path / "source.db", wire.registry, create=True) as source:
        fill(source, wire)
        archive(source, tmp_path / "archive", progress=False)
        expected = documents(source)
    target = tmp_path / "from-archive.db"
    with open_storage(target, wire.registry, create=True) as fresh:
        aggregate(tmp_path / "archive", fresh, workers=1, progress=False)
    assert main(["check", "--db", str(target)]) == 0
    said = capsys.readouterr().out
    assert "hold aggregates without raw reports (set by veil aggregate" in said
    assert "is sound" in said and "INCONSISTENT" not in said
    assert main(["rebuild-aggregates", "--db", str(target)]) == 0
    with open_storage(target) as rebuilt:
        assert documents(rebuilt) == expected  # every count kept, none set to zero


def test_deleted_raw_reports_are_named_and_no_rebuild_is_called_safe(tmp_path, wire,
                                                                     capsys) -> None:
    db = tmp_path / "veil.db"
    with open_storage(db, wire.registry, create=True) as storage:
        fill(storage, wire, DAYS[:1])
        storage.rebuild_aggregates()  # every report counted into the aggregates
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM reports WHERE rowid IN (SELECT rowid FROM reports LIMIT 3)")
    conn.close()
    assert main(["check", "--db", str(db)]) == 1
    said = capsys.readouterr().out
    assert "3 stored report id(s) have no raw report" in said
    assert "INCONSISTENT" in said and "intact" not in said
    assert "Restore the file from a backup instead if" in said
