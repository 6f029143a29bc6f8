"""``veil serve``, ``veil export``, ``veil rebuild-aggregates`` and ``veil backup``.

Heavy imports (Flask, waitress, NumPy) happen inside the ``run`` functions so
``veil --help`` works with the light client install.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from veil.shared.errors import VeilError

DEFAULT_THREADS = 4


class _Stop(Exception):
    """Raised in the main thread by SIGTERM to leave the server loop cleanly."""


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="metric registry TOML file")
    parser.add_argument("--db", required=True, help="SQLite database file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"worker threads serving requests (default {DEFAULT_THREADS})")
    parser.add_argument("--read-token", action="append", default=None,
                        help="bearer token for reading counts (repeatable; default: env VEIL_READ_TOKEN)")
    parser.add_argument("--upload-token", default=None,
                        help="require this bearer token to upload (default: env VEIL_UPLOAD_TOKEN, "
                        "else uploads are open)")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                        help="largest request body accepted (default 8 MiB)")
    parser.add_argument("--max-reports", type=int, default=5000,
                        help="largest batch accepted (default 5000 reports)")


def _run_serve(args: argparse.Namespace) -> int:
    import waitress

    from veil.server.app import EXTENSION, create_app

    if args.threads < 1:
        raise VeilError(f"--threads must be at least 1; got {args.threads}")
    if args.max_body_bytes < 1024:
        raise VeilError(f"--max-body-bytes must be at least 1024; got {args.max_body_bytes}")
    read_tokens = args.read_token or [t for t in [os.environ.get("VEIL_READ_TOKEN")] if t]
    upload_token = args.upload_token or os.environ.get("VEIL_UPLOAD_TOKEN") or None
    app = create_app({
        "REGISTRY": args.config,
        "DATABASE": args.db,
        "READ_TOKENS": read_tokens,
        "UPLOAD_TOKEN": upload_token,
        "MAX_CONTENT_LENGTH": args.max_body_bytes,
        "MAX_REPORTS_PER_BATCH": args.max_reports,
    })
    storage = app.extensions[EXTENSION].storage
    try:
        server = waitress.create_server(
            app, host=args.host, port=args.port, threads=args.threads, ident="veil",
            # Flask answers 413 as JSON for bodies over the limit; waitress (plain-text 413)
            # only stops absurd ones before buffering them
            max_request_body_size=2 * args.max_body_bytes + 1024 * 1024,
            clear_untrusted_proxy_headers=True,
        )
    except OSError as exc:
        storage.close()
        raise VeilError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    if not read_tokens:
        print("veil serve: no read token set (--read-token or VEIL_READ_TOKEN): "
              "counts cannot be read over HTTP", file=sys.stderr)

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    print(f"veil serve: listening on http://{args.host}:{server.effective_port}", flush=True)
    try:
        server.run()
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        storage.close()
    print("veil serve: stopped", flush=True)
    return 0


def _configure_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="the collector's SQLite database")
    parser.add_argument("--metric", required=True, help="metric name")
    parser.add_argument("--out", required=True, help="directory for params.csv and counts.csv")
    parser.add_argument("--config", default=None,
                        help="registry TOML (default: the registry stored in the database)")
    parser.add_argument("--start", default=None, help="first UTC day, YYYY-MM-DD (inclusive)")
    parser.add_argument("--end", default=None, help="last UTC day, YYYY-MM-DD (inclusive)")
    parser.add_argument("--force", action="store_true",
                        help="export even with fewer reports than the metric's min_reports")


def _run_export(args: argparse.Namespace) -> int:
    from veil.server.storage import counts_to_rows, open_storage, rappor_params
    from veil.shared.registry import Registry

    with open_storage(args.db) as storage:
        registry = Registry.load(args.config) if args.config else storage.registry
        if args.metric not in registry:
            raise VeilError(f"unknown metric {args.metric!r}; known: {', '.join(sorted(registry))}")
        metric = registry[args.metric]
        params = rappor_params(metric)
        document = storage.counts(metric, args.start, args.end,
                                  min_reports=0 if args.force else None)
    rows = counts_to_rows(document)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.csv").write_text(
        "k,h,m,p,q,f\n" + ",".join(str(params[key]) for key in "khmpqf") + "\n", encoding="utf-8"
    )
    (out / "counts.csv").write_text(
        "".join(",".join(map(str, row)) + "\n" for row in rows), encoding="utf-8"
    )
    print(f"veil export: {document['reports']} reports of {args.metric!r} in {len(rows)} cohorts "
          f"-> {out / 'params.csv'}, {out / 'counts.csv'}")
    return 0


def _configure_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, help="the collector's SQLite database")


def _run_rebuild(args: argparse.Namespace) -> int:
    from veil.server.storage import open_storage

    with open_storage(args.db) as storage:
        total = storage.rebuild_aggregates()
    print(f"veil rebuild-aggregates: rebuilt aggregates from {total} reports in {args.db}")
    return 0


def _configure_backup(parser: argparse.ArgumentParser) -> None:
    _configure_db(parser)
    parser.add_argument("--out", required=True, help="new file for the copy")


def _run_backup(args: argparse.Namespace) -> int:
    from veil.server.storage import open_storage

    with open_storage(args.db) as storage:
        target = storage.backup(args.out)
    print(f"veil backup: wrote a consistent copy of {args.db} to {target}")
    return 0


COMMANDS = [
    ("serve", "Run the collector (HTTP API) under the waitress WSGI server.",
     _configure_serve, _run_serve),
    ("export", "Write google/rappor params.csv and counts.csv for a metric.",
     _configure_export, _run_export),
    ("rebuild-aggregates", "Recompute every aggregate from the stored raw reports.",
     _configure_db, _run_rebuild),
    ("backup", "Copy the database consistently while the collector runs (VACUUM INTO).",
     _configure_backup, _run_backup),
]
