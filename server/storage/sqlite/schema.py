"""The SQLite file's tables, its schema version and the migrations between versions.

Each migration is one small step (in the manner of sqlite-utils' migrations):
``MIGRATIONS[v](storage, conn)`` upgrades a file from version ``v`` to ``v + 1``
inside the transaction that opens the file, when the opener asks for it
(``veil migrate``, ``veil serve --migrate``); the first line of a step's
docstring is what ``veil migrate --dry-run`` says it does. The measurements
behind the layout are in docs/operations.md.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from veil.server.storage.base import Migration
from veil.server.storage.sqlite.tail import CREATE_MARK, highest_rowid, set_mark

if TYPE_CHECKING:
    from veil.server.storage.sqlite.backend import SQLiteStorage

#: schema version written to ``PRAGMA user_version``; see :data:`MIGRATIONS`
SCHEMA_VERSION = 6

META = """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"""

# Raw reports are an append-only log (keyed by ``seq``, their rowid: a batch fills a few
# consecutive pages), and their ids a separate narrow set that answers "seen before?". Random
# ids land on random pages of whichever B-tree is keyed by them, and every page a transaction
# dirties is written to the WAL whole: keying only the 16-byte ids (about 45 to a page) instead
# of whole reports writes fewer bytes under the write lock. ``seq`` names the rowid so that
# ``VACUUM`` keeps it (it renumbers an unnamed rowid once rows were deleted): the fold mark is
# one (veil.server.storage.sqlite.tail).
REPORTS = """CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL,
    metric TEXT NOT NULL,
    day TEXT NOT NULL,
    cohort INTEGER NOT NULL,
    payload ANY
) STRICT"""
#: ``reports`` of versions 3 to 5, without ``seq``
_REPORTS_V3 = """CREATE TABLE reports (
    id BLOB NOT NULL,
    metric TEXT NOT NULL,
    day TEXT NOT NULL,
    cohort INTEGER NOT NULL,
    payload ANY
) STRICT"""

REPORT_IDS = """CREATE TABLE IF NOT EXISTS report_ids (id BLOB PRIMARY KEY) STRICT, WITHOUT ROWID"""

# Ids of new reports are appended here (a batch fills a few consecutive pages) and merged
# into ``report_ids`` in bulk, sorted (see veil.server.storage.sqlite.ids): inserted one batch
# at a time, 1,000 random ids land on about 1,000 different pages of the index, each written
# whole to the WAL; merged sorted, a page takes all of its new ids at once. ``ids_generation``
# in ``meta`` counts the merges, so a process holding the table's rows in memory sees that it
# was emptied.
RECENT_IDS = """CREATE TABLE IF NOT EXISTS recent_ids (id BLOB NOT NULL) STRICT"""
IDS_GENERATION = "INSERT OR IGNORE INTO meta (key, value) VALUES ('ids_generation', '0')"

# One row per (metric, day, cohort): the number of reports up to the fold mark and the fields
# of the metric's statistic, each in the column the statistic names (veil.shared.statistics);
# unused columns are NULL. Versions 2 to 5 called it ``aggregates`` and counted every report
# in it as it was stored: renamed, the table refuses a collector of those versions still
# running on the file, which would count its reports there and past the mark, twice.
_AGGREGATES_TABLE = """folded_aggregates (
    metric TEXT NOT NULL,
    day TEXT NOT NULL,
    cohort INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    bit_counts BLOB,
    ones INTEGER,
    sum REAL,
    sum_squares REAL,
    PRIMARY KEY (metric, day, cohort)
) STRICT, WITHOUT ROWID"""
AGGREGATES = "CREATE TABLE IF NOT EXISTS " + _AGGREGATES_TABLE
#: the same table in a connection's temporary schema, where a recount goes: unqualified names
#: find ``temp`` tables before ``main`` ones, so the rebuild's own statements fill this one
#: while the file's tables are only read (``veil check``)
RECOUNT = "CREATE TEMP TABLE " + _AGGREGATES_TABLE

# Reports stored per daily-cap key (a hash of an upload token, never the token) and UTC day,
# counted in the transaction that stores them, so a cap holds across every process writing
# to the file (a row per token and day; its size a year: docs/operations.md, Rate limits).
CAP_COUNTS = """CREATE TABLE IF NOT EXISTS cap_counts (
    key BLOB NOT NULL,
    day TEXT NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (key, day)
) STRICT, WITHOUT ROWID"""

#: the statements that create a new file at :data:`SCHEMA_VERSION`
CREATE = (META, REPORTS, REPORT_IDS, RECENT_IDS, IDS_GENERATION, AGGREGATES, CAP_COUNTS,
          CREATE_MARK)


def _migrate_1_to_2(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Build the aggregate table from the raw reports (version 1 stored raw reports only).

    Reads every stored report once."""
    conn.execute(AGGREGATES)
    storage.adopt_stored_registry(conn)
    storage.rebuild_in(conn, move_mark=False)


def _migrate_2_to_3(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Copy the raw reports to an append-only table, their ids to report_ids (reads them all).

    Version 2 kept raw reports in a table keyed by id; version 3 appends them to a
    rowid table and keeps their ids in ``report_ids``. Its time per million reports is
    in docs/operations.md (Durability)."""
    conn.execute("ALTER TABLE reports RENAME TO reports_v2")
    conn.execute(_REPORTS_V3)
    conn.execute(REPORT_IDS)
    conn.execute("INSERT INTO report_ids (id) SELECT id FROM reports_v2")
    conn.execute(
        "INSERT INTO reports (id, metric, day, cohort, payload) "
        "SELECT id, metric, day, cohort, payload FROM reports_v2 ORDER BY day, metric"
    )
    conn.execute("DROP TABLE reports_v2")


def _migrate_3_to_4(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Add the recent_ids table, where new report ids wait to be merged in bulk (instant).

    Version 3 inserted each id into ``report_ids`` directly; version 4 appends new ids to
    ``recent_ids`` and merges them into ``report_ids`` in bulk."""
    conn.execute(RECENT_IDS)
    conn.execute(IDS_GENERATION)


def _migrate_4_to_5(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Add the cap_counts table, where reports are counted per upload token and day (instant).

    Version 4 had no daily caps in the file (each collector process counted in memory)."""
    conn.execute(CAP_COUNTS)


def _migrate_5_to_6(storage: SQLiteStorage, conn: sqlite3.Connection) -> None:
    """Count new reports into the aggregates in bulk, past a fold mark (copies the reports once).

    Version 5 counted each insert's reports into ``aggregates`` in its transaction; version 6
    appends them only, and ``folded_aggregates`` counts every report up to the fold mark
    (veil.server.storage.sqlite.tail), which starts past every stored report. The reports
    are copied to a table whose rowid is named (``seq``), which ``VACUUM`` keeps; its time
    per million reports is in docs/operations.md (Durability)."""
    conn.execute("ALTER TABLE reports RENAME TO reports_v5")
    conn.execute(REPORTS)
    conn.execute("INSERT INTO reports (seq, id, metric, day, cohort, payload) "
                 "SELECT rowid, id, metric, day, cohort, payload FROM reports_v5 ORDER BY rowid")
    conn.execute("DROP TABLE reports_v5")
    # a file migrated from version 1 has the new table already (its step 1 -> 2 counts there)
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'aggregates'").fetchone():
        conn.execute("ALTER TABLE aggregates RENAME TO folded_aggregates")
    conn.execute(CREATE_MARK)
    set_mark(conn, highest_rowid(conn))


#: ``from_version -> step``: each step upgrades a file by one version inside one transaction
MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4, 4: _migrate_4_to_5,
              5: _migrate_5_to_6}


def migration_steps(version: int) -> list[Migration]:
    """The steps from schema ``version`` to :data:`SCHEMA_VERSION`, each described by the
    first line of its function's docstring."""
    return Migration.steps(MIGRATIONS, version, SCHEMA_VERSION)
