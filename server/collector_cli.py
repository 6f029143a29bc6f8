"""``veil serve``, ``veil export``, ``veil rebuild-aggregates`` and ``veil backup``.

Heavy imports (Flask, waitress, NumPy) happen inside the ``run`` functions so
``veil --help`` works with the light client install.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from veil.shared.errors import VeilError

DEFAULT_THREADS = 4


class _Stop(SystemExit):
    """Raised in the main thread by SIGTERM to leave the server loop cleanly.

    A ``SystemExit`` because waitress's event loop passes only those (and
    ``KeyboardInterrupt``) through its per-connection error handling.
    """


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="metric registry TOML file")
    parser.add_argument("--db", required=True, help="SQLite database file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"threads serving requests per worker (default {DEFAULT_THREADS})")
    parser.add_argument("--workers", type=int, default=1,
                        help="server processes sharing the port (default 1; more use more cores)")
    parser.add_argument("--read-token", action="append", default=None,
                        help="bearer token for reading counts (repeatable; default: env VEIL_READ_TOKEN)")
    parser.add_argument("--upload-token", default=None,
                        help="require this bearer token to upload (default: env VEIL_UPLOAD_TOKEN, "
                        "else uploads are open)")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                        help="largest request body accepted (default 8 MiB)")
    parser.add_argument("--max-reports", type=int, default=5000,
                        help="largest batch accepted (default 5000 reports)")
    parser.add_argument("--recent-ids-limit", type=int, default=None,
                        help="new report ids kept (in each worker's memory too) before a merge "
                        "into the id index (default 131072; larger: rarer, longer merge pauses)")


def _serve_config(args: argparse.Namespace) -> dict[str, Any]:
    """The app configuration from the command line and environment."""
    read_tokens = args.read_token or [t for t in [os.environ.get("VEIL_READ_TOKEN")] if t]
    return {
        "REGISTRY": args.config,
        "DATABASE": args.db,
        "READ_TOKENS": read_tokens,
        "UPLOAD_TOKEN": args.upload_token or os.environ.get("VEIL_UPLOAD_TOKEN") or None,
        "MAX_CONTENT_LENGTH": args.max_body_bytes,
        "MAX_REPORTS_PER_BATCH": args.max_reports,
        **({} if args.recent_ids_limit is None else {"RECENT_IDS_LIMIT": args.recent_ids_limit}),
    }


def _serve_socket(config: dict[str, Any], sock: socket.socket, threads: int) -> None:
    """Run one waitress server on the listening ``sock`` until SIGTERM or SIGINT."""
    import waitress

    from veil.server.app import EXTENSION, create_app

    app = create_app(config)
    server = waitress.create_server(
        app, sockets=[sock], threads=threads, ident="veil",
        # Flask answers 413 as JSON for bodies over the limit; waitress (plain-text 413)
        # only stops absurd ones before buffering them
        max_request_body_size=2 * config["MAX_CONTENT_LENGTH"] + 1024 * 1024,
        clear_untrusted_proxy_headers=True,
        # batches are ~100 KiB: read them in fewer, larger chunks
        recv_bytes=65536,
    )

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        app.extensions[EXTENSION].storage.close()


def _worker(config: dict[str, Any], sock: socket.socket, threads: int, parent: int) -> None:
    """A forked worker process: serve, and stop if the parent process disappears."""

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_parent, name="veil-parent-watch", daemon=True).start()
    _serve_socket(config, sock, threads)


def _run_serve(args: argparse.Namespace) -> int:
    from veil.server.storage import open_storage
    from veil.shared.registry import Registry

    for name in ("threads", "workers"):
        if getattr(args, name) < 1:
            raise VeilError(f"--{name} must be at least 1; got {getattr(args, name)}")
    if args.recent_ids_limit is not None and args.recent_ids_limit < 1:
        raise VeilError(f"--recent-ids-limit must be at least 1; got {args.recent_ids_limit}")
    if args.max_body_bytes < 1024:
        raise VeilError(f"--max-body-bytes must be at least 1024; got {args.max_body_bytes}")
    config = _serve_config(args)
    # check the registry against the database (and migrate it) once, before any worker starts
    open_storage(args.db, Registry.load(args.config), create=True).close()
    try:
        sock = socket.create_server((args.host, args.port), backlog=1024)
    except OSError as exc:
        raise VeilError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    if not config["READ_TOKENS"]:
        print("veil serve: no read token set (--read-token or VEIL_READ_TOKEN): "
              "counts cannot be read over HTTP", file=sys.stderr)
    host, port = sock.getsockname()[:2]
    print(f"veil serve: listening on http://{host}:{port}", flush=True)
    try:
        if args.workers == 1:
            _serve_socket(config, sock, args.threads)
            code = 0
        else:
            code = _supervise(config, sock, args.threads, args.workers)
    finally:
        sock.close()
    print("veil serve: stopped", flush=True)
    return code


def _supervise(config: dict[str, Any], sock: socket.socket, threads: int, workers: int) -> int:
    """Fork ``workers`` server processes sharing ``sock``; stop all when one ends or on SIGTERM.

    Returns 0 after SIGTERM/SIGINT, 1 if a worker ended on its own (see its stderr).
    """
    parent = os.getpid()
    children: list[int] = []
    code = 0

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    _worker(config, sock, threads, parent)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        pid, status = os.wait()
        print(f"veil serve: worker {pid} exited (status {status}); stopping", file=sys.stderr)
        code = 1
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return code


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
    from veil.server.analysis.rappor_files import rappor_params, write_counts_document, write_params
    from veil.server.storage import open_storage
    from veil.shared.registry import Registry

    with open_storage(args.db) as storage:
        registry = Registry.load(args.config) if args.config else storage.registry
        if args.metric not in registry:
            raise VeilError(f"unknown metric {args.metric!r}; known: {', '.join(sorted(registry))}")
        metric = registry[args.metric]
        params = rappor_params(metric.params)
        document = storage.counts(metric, args.start, args.end,
                                  min_reports=0 if args.force else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_params(params, out / "params.csv")
    reports, cohorts = write_counts_document(document, out / "counts.csv")
    print(f"veil export: {reports} reports of {args.metric!r} in {cohorts} cohorts "
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
    ("serve", "run the collector (HTTP API) under the waitress WSGI server",
     _configure_serve, _run_serve),
    ("export", "write google/rappor params.csv and counts.csv for a metric",
     _configure_export, _run_export),
    ("rebuild-aggregates", "recompute every aggregate from the stored raw reports",
     _configure_db, _run_rebuild),
    ("backup", "copy the database consistently while the collector runs (VACUUM INTO)",
     _configure_backup, _run_backup),
]
