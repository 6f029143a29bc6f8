"""``veil archive`` and ``veil aggregate``: raw reports to a Parquet archive, and aggregates
recomputed from it on Dask.

Registered under the ``veil.commands`` entry points. pyarrow and Dask load inside the
``run`` functions so that ``veil --help`` stays light.
"""

from __future__ import annotations

import argparse

from veil.server.cli.options import (
    add_config_option,
    add_db_option,
    add_range_options,
    output_directory,
    print_log,
    whole_number,
    worker_count,
)


def configure_archive(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil archive``."""
    add_db_option(parser)
    parser.add_argument("--out", required=True, metavar="DIR", type=output_directory,
                        help="the archive directory (created if missing)")
    add_range_options(parser, end_help="last UTC day, YYYY-MM-DD (inclusive; default: "
                                       "yesterday, the last day that is over)")
    parser.add_argument("--buckets", type=whole_number(1), metavar="N",
                        help="files per (metric, day), by report id, 1 to 256 (default: the "
                             "archive's, 16 for a new one)")
    parser.add_argument("--source", default="main", metavar="NAME",
                        help="name of this store in the file names, so that stores (shards) "
                             "of one deployment can share an archive (default: main)")


def run_archive(args: argparse.Namespace) -> int:
    """Write the raw reports of days that are over to the archive, then print a summary."""
    from veil.server.archive.writer import archive
    from veil.server.storage import open_storage

    with open_storage(args.db) as storage, print_log("veil.server.archive", "veil archive: "):
        summary = archive(storage, args.out, metric=args.metric, start=args.start,
                          end=args.end, buckets=args.buckets, source=args.source)
    print(f"veil archive: {summary}")
    return 0


def configure_aggregate(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil aggregate``."""
    parser.add_argument("--archive", required=True, metavar="DIR",
                        help="the directory veil archive wrote")
    add_db_option(parser, help_text="the store whose aggregates are set: a file path, "
                                    "sqlite:///path or postgresql://...")
    add_config_option(parser, required=False,
                      help_text="metric registry TOML to record in the store first (creates a "
                                "new store); else the store's own registry")
    parser.add_argument("--scheduler", default="local", metavar="ADDRESS",
                        help="a Dask scheduler address (tcp://host:8786), or 'local' (the "
                             "default) for worker processes on this machine")
    parser.add_argument("--workers", type=worker_count, metavar="N",
                        help="worker processes of the local cluster (default: one per core)")
    add_range_options(parser)


def run_aggregate(args: argparse.Namespace) -> int:
    """Recompute the aggregates of the archive's days into the store, then print a summary."""
    from veil.server.archive.driver import aggregate
    from veil.server.archive.layout import Manifest
    from veil.server.storage import open_storage
    from veil.shared.registry import Registry

    manifest = Manifest.load(args.archive)  # a missing or foreign archive: before the store
    registry = Registry.load(args.config) if args.config else None
    with open_storage(args.db, registry, create=registry is not None) as storage:
        summary = aggregate(manifest, storage, scheduler=args.scheduler,
                            workers=args.workers, metric=args.metric, start=args.start,
                            end=args.end)
    print(f"veil aggregate: {summary}")
    return 0


COMMANDS = [
    ("archive", "write the raw reports of days that are over to a Parquet archive",
     configure_archive, run_archive),
    ("aggregate", "recompute aggregates from a Parquet archive on Dask and set them in a store",
     configure_aggregate, run_aggregate),
]
