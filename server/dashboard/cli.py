"""``veil dashboard``: the dashboard on its own, over a store or a running collector.

Registered under the ``veil.commands`` entry points. Flask, waitress and the analysis load
inside :func:`run_dashboard`, so ``veil --help`` works with the light client install.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from veil.server.cli.options import (
    add_db_option,
    add_server_options,
    port_number,
    short_token_warning,
    thread_count,
    token_list,
)
from veil.server.settings import ENVIRONMENT
from veil.shared.errors import ParameterError, VeilError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050
DEFAULT_THREADS = 4


def configure_dashboard(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil dashboard``."""
    source = parser.add_argument_group("what it shows (one of)")
    add_db_option(source, required=False,
                  help_text="a collector's store: a file path or postgresql://...")
    add_server_options(source)
    parser.set_defaults(db=None, server=None)
    parser.add_argument("--read-token", action="append", default=None,
                        help="token that opens the dashboard (repeatable; default: "
                        f"${ENVIRONMENT['read_token']}, comma-separated)")
    parser.add_argument("--candidates", default=None,
                        help="a directory of candidate files, <metric>.txt with one string a "
                        "line, for string metrics")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--threads", type=thread_count, default=DEFAULT_THREADS,
                        help=f"threads serving requests (default {DEFAULT_THREADS})")


def dashboard_config(args: argparse.Namespace) -> dict[str, Any]:
    """The dashboard's settings from ``veil dashboard``'s arguments and the environment."""
    if args.db is not None and args.server is not None:
        raise ParameterError("db", "give --db or --server, not both")
    return {
        "DATABASE": args.db,
        "SERVER": args.server,
        "SERVER_TOKEN": args.token,
        "READ_TOKENS": token_list(args.read_token, ENVIRONMENT["read_token"], "--read-token"),
        "CANDIDATES": args.candidates,
    }


def run_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard until SIGTERM or SIGINT."""
    from waitress.server import create_server

    from veil.server.dashboard.app import create_dashboard
    from veil.server.dashboard.views import EXTENSION

    if args.db is None and args.server is None:
        raise ParameterError("db", "give --db (a collector's store) or --server (a collector's URL), or "
                        f"set ${ENVIRONMENT['db']} or ${ENVIRONMENT['server']}")
    config = dashboard_config(args)
    for tokens, option in ((config["READ_TOKENS"], "--read-token"),
                           ([config["SERVER_TOKEN"]] if config["SERVER_TOKEN"] else [], "--token")):
        if (warning := short_token_warning(tokens, option)) is not None:
            print(f"veil dashboard: warning: {warning}", file=sys.stderr, flush=True)
    app = create_dashboard(config)
    problem = app.extensions[EXTENSION].decodes.source.check()
    if problem is not None:
        print(f"veil dashboard: warning: the pages say so until this is fixed: {problem}",
              file=sys.stderr, flush=True)
    try:
        server = create_server(app, host=args.host, port=args.port, threads=args.threads,
                               ident="veil")
    except OSError as exc:
        raise VeilError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    signal.signal(signal.SIGTERM, _stop)
    print(f"veil dashboard: listening on http://{args.host}:{server.effective_port}/",
          flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _stop(signum: int, frame: object) -> None:
    """SIGTERM ends the server loop as Ctrl-C does."""
    raise KeyboardInterrupt


COMMANDS = [
    ("dashboard", "serve the read-only web dashboard over a store or a running collector",
     configure_dashboard, run_dashboard),
]
