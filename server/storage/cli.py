"""``veil check``: is a collector's database sound, and if not, how to recover.

Registered under the ``veil.commands`` entry points. The storage package loads
inside ``run_check`` so that ``veil --help`` stays light.
"""

from __future__ import annotations

import argparse

#: problems listed of each kind; the rest are counted
SHOWN = 10


def configure_check(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil check``."""
    parser.add_argument("--db", required=True,
                        help="the collector's database: a file path or sqlite:///path")


def run_check(args: argparse.Namespace) -> int:
    """Check integrity and recount the aggregates; 0 if the store is sound, 1 if not."""
    from veil.server.storage import check_storage

    result = check_storage(args.db)
    db = result.location
    if result.sound:
        print(f"veil check: {db} is sound: the integrity check passed and the aggregates "
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
        print(f"veil check: {db} is INCONSISTENT: its integrity check passed, but "
              f"aggregates differ from a recount of its {result.reports:,} raw reports:")
        _list(result.mismatches)
        print(f"""The raw reports are intact: rebuild the aggregates from them (safe while the
collector runs), then check again:
  veil rebuild-aggregates --db {db}
  veil check --db {db}""")
    return 1


def _list(problems: tuple[str, ...]) -> None:
    """Print up to :data:`SHOWN` problems, then how many more there are."""
    for problem in problems[:SHOWN]:
        print(f"  - {problem}")
    if len(problems) > SHOWN:
        print(f"  ... and {len(problems) - SHOWN} more")


COMMANDS = [
    ("check", "check a database's integrity and its aggregates against the raw reports",
     configure_check, run_check),
]
