"""The PostgreSQL store's tables and schema version.

Raw reports go to ``veil_reports``, partitioned by UTC day (one table per day,
``veil_reports_YYYYMMDD``, created ahead of need): its primary key ``(day, id)``
makes a report id unique within a day across every collector sharing the
database, and retention drops whole days. Aggregates go to ``veil_aggregates``,
one row per (metric, day, cohort, shard): each write transaction adds into one
of :data:`SHARDS` rows per cohort, picked at random, so collectors writing at
once rarely wait on the same row; readers add the shards up. Each statistic
field has the column its :class:`~veil.shared.statistics.Field` names (counts as
``bigint[]``), as in every backend. ``veil_cap_counts`` counts the reports stored
per daily-cap key (a hash of an upload token) and day.

Each migration is one small step, as in the SQLite backend: ``MIGRATIONS[v](conn)``
upgrades a store from version ``v`` to ``v + 1`` inside the transaction that opens
it, when the opener asks for it; the first line of a step's docstring is what
``veil migrate --dry-run`` says it does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from veil.server.storage.base import Migration
from veil.shared.statistics import COLUMN_TYPES, COLUMNS

if TYPE_CHECKING:
    import psycopg

#: the version recorded under ``schema_version`` in ``veil_meta``; see :data:`MIGRATIONS`
SCHEMA_VERSION = 2
#: aggregate rows per (metric, day, cohort) that write transactions spread over
SHARDS = 8
#: advisory lock keys (first half of the two-int form): one class per use
LOCK_SCHEMA = 0x7E11_0001
LOCK_DAY = 0x7E11_0002
LOCK_PARTITIONS = 0x7E11_0003

#: a write transaction's first statement: the UTC day by the server's clock (or the day given),
#: and a shared lock on it held until the commit
LOCK_TODAY = (
    "SELECT to_char(t.day, 'YYYY-MM-DD'), pg_advisory_xact_lock_shared(%(lock)s, t.day - DATE "
    "'1970-01-01') FROM (SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date AS day) AS t"
)
LOCK_GIVEN_DAY = (
    "SELECT to_char(t.day, 'YYYY-MM-DD'), pg_advisory_xact_lock_shared(%(lock)s, t.day - DATE "
    "'1970-01-01') FROM (SELECT %(day)s::date AS day) AS t"
)

_SQL_TYPES = {"counts": "bigint[]", "count": "bigint", "real": "double precision"}
#: the statistic columns of the aggregate table and of its staging table, with their types
_AGGREGATE_COLUMNS = ", ".join(f"{column} {_SQL_TYPES[COLUMN_TYPES[column]]}" for column in COLUMNS)

META = "CREATE TABLE IF NOT EXISTS veil_meta (key text PRIMARY KEY, value text NOT NULL)"
REPORTS = """CREATE TABLE IF NOT EXISTS veil_reports (
    day date NOT NULL,
    id bytea NOT NULL,
    metric text NOT NULL,
    cohort integer NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (day, id)
) PARTITION BY RANGE (day)"""
AGGREGATES = (
    "CREATE TABLE IF NOT EXISTS veil_aggregates (metric text NOT NULL, day date NOT NULL, "
    "cohort integer NOT NULL, shard smallint NOT NULL, reports bigint NOT NULL, "
    + _AGGREGATE_COLUMNS
    + ", PRIMARY KEY (metric, day, cohort, shard))"
)
#: element-wise sum of two counter arrays (NULL is "no counters"); a PL/pgSQL loop, which
#: updates the array in place, measured faster than unnest and array_agg
ADD_COUNTS = """CREATE OR REPLACE FUNCTION veil_add_counts(a bigint[], b bigint[])
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF a IS NULL THEN RETURN b; END IF;
    IF b IS NULL THEN RETURN a; END IF;
    IF cardinality(a) <> cardinality(b) THEN
        RAISE EXCEPTION 'veil_add_counts: counter arrays of different lengths';
    END IF;
    FOR i IN 1 .. cardinality(a) LOOP
        a[i] := a[i] + b[i];
    END LOOP;
    RETURN a;
END
$$"""
SUM_COUNTS = ("CREATE OR REPLACE AGGREGATE veil_sum_counts(bigint[]) "
              "(SFUNC = veil_add_counts, STYPE = bigint[])")

#: reports stored per daily-cap key and UTC day, counted in the transaction that stores them:
#: the row's lock orders the writers of one key, on every collector sharing the database
CAP_COUNTS = ("CREATE TABLE IF NOT EXISTS veil_cap_counts (key bytea NOT NULL, day date NOT NULL, "
              "reports bigint NOT NULL, PRIMARY KEY (key, day))")
#: count a write transaction's new reports under a key and day; returns the day's count with them
CHARGE_CAP = (
    "INSERT INTO veil_cap_counts (key, day, reports) VALUES (%(key)s, %(day)s, %(reports)s) "
    "ON CONFLICT (key, day) DO UPDATE SET reports = veil_cap_counts.reports + excluded.reports "
    "RETURNING reports"
)
#: seconds from now, by the database server's clock, until UTC day ``%(day)s`` is over
SECONDS_LEFT = ("SELECT extract(epoch FROM (%(day)s::date + 1)::timestamp "
                "- (statement_timestamp() AT TIME ZONE 'UTC'))")

#: the statements that create a new store at :data:`SCHEMA_VERSION`
CREATE = (META, REPORTS, AGGREGATES, ADD_COUNTS, SUM_COUNTS, CAP_COUNTS)


def _migrate_1_to_2(conn: psycopg.Connection[Any]) -> None:
    """Add the veil_cap_counts table, where reports are counted per upload token and day (instant).

    Version 1 had no daily caps in the store (each collector process counted in memory)."""
    conn.execute(CAP_COUNTS)


#: ``from_version -> step``: each step upgrades a store by one version inside one transaction
MIGRATIONS: dict[int, Callable[[psycopg.Connection[Any]], None]] = {1: _migrate_1_to_2}


def migration_steps(version: int) -> list[Migration]:
    """The steps from schema ``version`` to :data:`SCHEMA_VERSION`, each described by the
    first line of its function's docstring."""
    return Migration.steps(MIGRATIONS, version, SCHEMA_VERSION)

#: fold the shards of one day (``%(day)s``) into shard 0: once a day is over, its rows are only
#: read, and readers then add one row per cohort instead of :data:`SHARDS`
FOLD_DAY = (
    # by metric and day, the key's first columns; nothing when another process folded it
    "WITH folded AS (DELETE FROM veil_aggregates WHERE metric = ANY(%(metrics)s) "
    "AND day = %(day)s AND EXISTS (SELECT 1 FROM veil_aggregates WHERE metric = "
    "ANY(%(metrics)s) AND day = %(day)s AND shard <> 0) RETURNING *) "
    f"INSERT INTO veil_aggregates (metric, day, cohort, shard, reports, {', '.join(COLUMNS)}) "
    "SELECT metric, day, cohort, 0, sum(reports)::bigint, "
    + ", ".join(f"veil_sum_counts({c})" if COLUMN_TYPES[c] == "counts"
                else f"sum({c})::bigint" if COLUMN_TYPES[c] == "count" else f"sum({c})"
                for c in COLUMNS)
    + " FROM folded GROUP BY metric, day, cohort"
)

#: what each write transaction copies its reports into first (one per connection, emptied at
#: every commit)
STAGING = ("CREATE TEMP TABLE IF NOT EXISTS veil_staging (id bytea NOT NULL, metric text NOT NULL, "
           "cohort integer NOT NULL, payload bytea NOT NULL) ON COMMIT DELETE ROWS")

#: what a write transaction copies its aggregate rows into before adding them in one statement
AGGREGATE_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS veil_aggregate_staging (metric text NOT NULL, "
    "day date NOT NULL, cohort integer NOT NULL, shard smallint NOT NULL, reports bigint NOT NULL, "
    + _AGGREGATE_COLUMNS
    + ") ON COMMIT DELETE ROWS"
)
COPY_AGGREGATES = (f"COPY veil_aggregate_staging (metric, day, cohort, shard, reports, "
                   f"{', '.join(COLUMNS)}) FROM STDIN")
#: add the staged aggregate rows into the table (in key order: writers lock rows in one order)
UPSERT_STAGED = (
    f"INSERT INTO veil_aggregates (metric, day, cohort, shard, reports, {', '.join(COLUMNS)}) "
    f"SELECT metric, day, cohort, shard, reports, {', '.join(COLUMNS)} "
    "FROM veil_aggregate_staging ORDER BY metric, day, cohort, shard "
    "ON CONFLICT (metric, day, cohort, shard) DO UPDATE SET "
    "reports = veil_aggregates.reports + excluded.reports, "
    + ", ".join(
        f"{c} = veil_add_counts(veil_aggregates.{c}, excluded.{c})" if COLUMN_TYPES[c] == "counts"
        else f"{c} = veil_aggregates.{c} + excluded.{c}"
        for c in COLUMNS
    )
)
#: aggregate rows ``(cohort, reports, *COLUMNS)`` of one metric over a range of days, counters
#: in PostgreSQL's binary array form (``array_send``), which NumPy reads without Python ints
SELECT_AGGREGATES = (
    "SELECT cohort, reports, "
    + ", ".join(f"array_send({c})" if COLUMN_TYPES[c] == "counts" else c for c in COLUMNS)
    + " FROM veil_aggregates WHERE metric = %s AND day BETWEEN %s AND %s"
)


def partition_name(day: str) -> str:
    """The table that holds the raw reports of UTC ``day`` (``YYYY-MM-DD``)."""
    return "veil_reports_" + day.replace("-", "")
