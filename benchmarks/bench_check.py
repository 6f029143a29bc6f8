"""What checking a database costs: at open (``PRAGMA quick_check``) and in ``veil check``.

Fills a database with ``--stored`` string reports through the storage layer (as
``bench_ingest.py --prefill`` does), then times, ``--repeats`` times each:
opening and closing it (the open-time check included), ``PRAGMA quick_check``
alone, the cheaper check of the small tables that files above
``QUICK_CHECK_MAX_BYTES`` get at open, and ``check_storage`` (``veil check``:
integrity check and a recount of every aggregate). Run it alone on the machine::

    python benchmarks/bench_check.py [--stored 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_ingest import prefill  # this folder: python puts the script's folder on sys.path

from veil.server.storage import check_storage, open_storage
from veil.server.storage.sqlite.files import OPEN_CHECKED_TABLES


def timed(label: str, run: Callable[[], object], repeats: int) -> None:
    """Print the wall time of ``repeats`` calls of ``run``."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    print(f"{label}: {', '.join(f'{t * 1000:,.1f}' for t in times)} ms")


def pragmas(path: Path, statements: list[str]) -> Callable[[], None]:
    """Run ``statements`` on a fresh connection, as the open-time check does."""
    def run() -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA mmap_size = 1073741824")
            for statement in statements:
                assert conn.execute(statement).fetchall() == [("ok",)]
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "veil.db"
        seconds = prefill(path, args.stored)
        print(f"{args.stored:,} reports stored in {seconds:.1f} s; "
              f"file {path.stat().st_size / 1e6:,.1f} MB")
        timed("open_storage + close (check included)", lambda: open_storage(path).close(),
              args.repeats)
        timed("PRAGMA quick_check", pragmas(path, ["PRAGMA quick_check"]), args.repeats)
        timed(f"PRAGMA quick_check of {', '.join(OPEN_CHECKED_TABLES)}",
              pragmas(path, [f"PRAGMA quick_check({t})" for t in OPEN_CHECKED_TABLES]),
              args.repeats)
        timed("check_storage (veil check)", lambda: check_storage(path), args.repeats)


if __name__ == "__main__":
    main()
