"""``veil check``, ``migrate``, ``stats``, ``retention``, ``rebuild-aggregates`` and
``backup``: the database seen by its operator.

Registered under the ``veil.commands`` entry points. The storage package loads
inside the ``run`` functions so that ``veil --help`` stays light.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from typing import Any

from veil.server.cli.options import (
    add_db_option,
    add_range_options,
    add_server_options,
    print_log,
    whole_number,
)
from veil.server.settings import ENVIRONMENT
from veil.shared.errors import ParameterError, VeilError

#: problems listed of each kind; the rest are counted
SHOWN = 10
#: the output formats of ``veil stats``
STATS_FORMATS = ("table", "csv", "json")


def configure_check(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil check``."""
    add_db_option(parser)


def run_check(args: argparse.Namespace) -> int:
    """Check integrity and recount the aggregates; 0 if the store is sound, 1 if not, 2 if
    it cannot be checked (another schema version)."""
    from veil.server.storage import SchemaOutdatedError, check_storage
    from veil.server.storage.errors import SchemaNewerError

    try:
        result = check_storage(args.db)
    except (SchemaOutdatedError, SchemaNewerError) as exc:
        # exit 2, "cannot check": 1 says damaged or inconsistent, which it is not known to be
        raise ParameterError("db", str(exc)) from None
    db = result.location
    if result.unverified:
        print(f"veil check: {result.unverified:,} (metric, day) pair(s) hold aggregates "
              "without raw reports (set by veil aggregate from an archive, or their reports "
              "dropped): there is nothing to recount them from, and a rebuild keeps them")
    if result.missing_reports:
        print(f"veil check: {result.missing_reports:,} stored report id(s) have no raw report "
              "(reports deleted by hand, or lost): a recount counts only the reports present")
    if result.sound:
        checked = f"{result.integrity} and " if result.integrity else ""
        print(f"veil check: {db} is sound: {checked}the aggregates "
              f"match a recount of {result.reports:,} raw reports")
        return 0
    if result.damage:
        print(f"veil check: {db} is DAMAGED:")
        _list(result.damage)
        print(f"""Recover it (docs/operations.md, Recovery):
  1. stop every collector using it, and any veil command on it;
  2. move it aside with its -wal and -shm files, if present (a stale -wal file would be
     applied to the copy):
       mv {db} {db}.damaged
       mv {db}-wal {db}-wal.damaged
       mv {db}-shm {db}-shm.damaged
  3. put the latest copy written by veil backup in its place:
       cp /backups/veil-YYYY-MM-DD.db {db}
  4. check it, then start the collector:
       veil check --db {db}
Reports acknowledged after that backup are not in the copy.""")
    else:
        checked = f"{result.integrity}, but " if result.integrity else ""
        print(f"veil check: {db} is INCONSISTENT: {checked}"
              f"aggregates differ from a recount of its {result.reports:,} raw reports:")
        _list(result.mismatches)
        if result.missing_reports:
            print(f"""Raw reports are missing (above): a rebuild would set the aggregates to the
reports present and lose the others' counts. Restore the file from a backup instead if
those reports matter (docs/operations.md, Recovery); else rebuild:
  veil rebuild-aggregates --db {db}""")
        else:
            print(f"""The raw reports pass the integrity check: rebuild the aggregates from them
(safe while the collector runs), then check again:
  veil rebuild-aggregates --db {db}
  veil check --db {db}""")
    return 1


def _list(problems: tuple[str, ...]) -> None:
    """Print up to :data:`SHOWN` problems, then how many more there are."""
    for problem in problems[:SHOWN]:
        print(f"  - {problem}")
    if len(problems) > SHOWN:
        print(f"  ... and {len(problems) - SHOWN} more")


def configure_migrate(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil migrate``."""
    add_db_option(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="list the pending schema steps and change nothing")


def run_migrate(args: argparse.Namespace) -> int:
    """Bring the database to this Veil's schema, printing each step as it runs."""
    from veil.server.storage import open_storage, pending_migrations
    from veil.server.storage.backends import backend_for

    backend = backend_for(args.db)
    where, current = backend.describe(args.db), backend.current_schema
    steps = pending_migrations(args.db)
    if not steps:
        print(f"veil migrate: {where} is up to date (schema version {current}); nothing to do")
        return 0
    plural = "s" if len(steps) > 1 else ""
    if args.dry_run:
        print(f"veil migrate: {where} has schema version {steps[0].version}; this Veil uses "
              f"{current}. {len(steps)} step{plural} pending:")
        for step in steps:
            print(f"  {step}")
        print(f"Nothing was changed. Stop every collector using the file, back it up "
              f"(veil backup --db {where} --out COPY), then run: veil migrate --db {where}")
        return 0
    print(f"veil migrate: migrating {where} from schema version {steps[0].version} to "
          f"{current} ({len(steps)} step{plural}, in one transaction)", flush=True)
    began = time.monotonic()
    with print_log("veil.server.storage", "veil migrate: "):
        open_storage(args.db, migrate=True).close()
    print(f"veil migrate: {where} is at schema version {current} "
          f"({time.monotonic() - began:.1f} s)")
    return 0


def configure_retention(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil retention``."""
    add_db_option(parser, help_text="the collectors' PostgreSQL database: postgresql://...")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--keep-days", type=whole_number(1), metavar="N",
                       help="keep the raw reports of the last N UTC days, today included")
    which.add_argument("--before", metavar="YYYY-MM-DD",
                       help="drop the raw reports of every day before this one")


def run_retention(args: argparse.Namespace) -> int:
    """Drop old days of raw reports (whole partitions); their aggregates stay."""
    import datetime as dt

    from veil.server.storage import open_storage
    from veil.server.storage.base import parse_day

    cutoff = None
    if args.before is not None:
        # as every command reads days (fromisoformat alone took 20240101 and 2024-W01-1)
        day = dt.date.fromisoformat(str(parse_day(args.before, "--before")))
        today = dt.datetime.now(dt.UTC).date()
        if day > today:
            raise ParameterError(
                "before", f"--before {day} is after today ({today}, UTC): it would drop the raw "
                          "reports of today, which still arrive, and of the replay window's days "
                          "before it; give an earlier day")
        cutoff = day.isoformat()
    with open_storage(args.db) as storage:
        if cutoff is None:  # --keep-days: counted by the store's clock, as the window is
            today = dt.date.fromisoformat(storage.today())
            # more days than the calendar holds keeps everything
            back = min(args.keep_days - 1, (today - dt.date.min).days)
            cutoff = (today - dt.timedelta(days=back)).isoformat()
        dropped = storage.drop_days_before(cutoff)
        where = storage.location
    if dropped:
        print(f"veil retention: dropped the raw reports of {len(dropped)} days from {where} "
              f"({dropped[0]} to {dropped[-1]}); their counts stay. Reports for days before "
              f"{cutoff} are refused from now on")
    else:
        print(f"veil retention: no raw reports before {cutoff} in {where}; nothing to drop")
    return 0


def configure_db(parser: argparse.ArgumentParser) -> None:
    """The ``--db`` argument of the maintenance commands (default ``$VEIL_DB``)."""
    add_db_option(parser)


def run_rebuild(args: argparse.Namespace) -> int:
    """Recount the aggregates of every day that has raw reports (days set from an archive
    are kept), folding every report."""
    from veil.server.storage import open_storage

    with open_storage(args.db) as storage:
        total = storage.rebuild_aggregates()
        where = storage.location
    print(f"veil rebuild-aggregates: rebuilt aggregates from {total:,} reports in {where}")
    return 0


def configure_backup(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil backup``."""
    add_db_option(parser, help_text="the collector's SQLite database: a file path or "
                                    "sqlite:///path (back up PostgreSQL with pg_dump)")
    parser.add_argument("--out", required=True, help="new file for the copy")


def run_backup(args: argparse.Namespace) -> int:
    """Copy the database consistently while the collector runs."""
    from veil.server.storage import SchemaOutdatedError, SQLiteStorage, open_storage
    from veil.server.storage.backends import backend_for

    try:
        with open_storage(args.db) as storage:
            target = storage.backup(args.out)
            where = storage.location
    except SchemaOutdatedError:
        if backend_for(args.db) is not SQLiteStorage:
            raise
        # the copy to keep before veil migrate: an older schema is copied as it is
        target = SQLiteStorage.backup_as_it_is(args.db, args.out)
        print(f"veil backup: wrote a copy of {args.db} to {target}, at its older schema as it "
              f"is; migrate the original with: veil migrate --db {args.db}")
        return 0
    print(f"veil backup: wrote a consistent copy of {where} to {target}")
    return 0


def configure_stats(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil stats``."""
    source = parser.add_argument_group("source (one of)")
    add_db_option(source, required=False)
    add_server_options(source)
    add_range_options(parser)
    parser.add_argument("--format", choices=STATS_FORMATS, default="table",
                        help="table (with totals, the default), csv (metric,day,reports: one "
                        "row per day with reports) or json (the GET /v1/stats document)")


def run_stats(args: argparse.Namespace) -> int:
    """Print the reports each metric received per UTC day, from the database or a collector."""
    from veil.server.storage import open_storage
    from veil.server.storage.base import day_range

    if bool(args.db) == bool(args.server):
        raise ParameterError(
            "db", f"give exactly one source: --db PATH (or ${ENVIRONMENT['db']}) for the "
            f"database, or --server URL (or ${ENVIRONMENT['server']}) for a running collector"
            + (" (both are set; unset one)" if args.db else ""))
    start, end = day_range(args.start, args.end)
    if args.server:
        document = fetch_stats(args.server, args.token, args.metric, start, end)
    else:
        with open_storage(args.db) as storage:
            document = storage.stats(args.metric, start, end)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["metric", "day", "reports"])
        for entry in document["metrics"]:
            for day in entry["days"]:
                writer.writerow([entry["metric"], day["day"], day["reports"]])
    else:
        print(stats_table(document))
    return 0


def stats_table(document: dict[str, Any]) -> str:
    """The stats document as an aligned table: each metric's days, its total, then the total
    of all (a metric without reports shows 0 and a dash for its days)."""
    rows = [("metric", "day", "reports")]
    for entry in document["metrics"]:
        rows += [(entry["metric"], day["day"], f"{day['reports']:,}") for day in entry["days"]]
        rows.append((entry["metric"], "total" if entry["days"] else "-",
                     f"{entry['reports']:,}"))
    rows.append(("all metrics", "total", f"{document['reports']:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
    span = f"{document['start'] or 'first day'} to {document['end'] or 'last day'}"
    return "\n".join([f"reports per UTC day, {span}", *lines])


def fetch_stats(server: str, token: str | None, metric: str | None, start: str | None,
                end: str | None) -> dict[str, Any]:
    """GET ``/v1/stats`` from a collector with a read token; :class:`VeilError` saying what
    went wrong otherwise."""
    from veil.server.http import get_json

    body = get_json(server, "/v1/stats", token, {"metric": metric, "start": start, "end": end})
    if not isinstance(body.get("metrics"), list):
        raise VeilError(f"GET {server.rstrip('/')}/v1/stats did not return a stats document")
    return body


COMMANDS = [
    ("check", "check a database's integrity and its aggregates against the raw reports",
     configure_check, run_check),
    ("migrate", "bring a database to this Veil's schema (--dry-run lists the steps)",
     configure_migrate, run_migrate),
    ("stats", "reports per metric and UTC day, from the database or a running collector",
     configure_stats, run_stats),
    ("retention", "drop old days of raw reports from a PostgreSQL store (counts stay)",
     configure_retention, run_retention),
    ("rebuild-aggregates", "recount the aggregates of every day that has raw reports",
     configure_db, run_rebuild),
    ("backup", "copy the database consistently while the collector runs (VACUUM INTO)",
     configure_backup, run_backup),
]
