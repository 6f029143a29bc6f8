"""``veil metrics``, ``serve`` and ``export``: the collector from the command line.

The database's own commands (``check``, ``migrate``, ``stats``, ``retention``,
``rebuild-aggregates``, ``backup``) are :mod:`veil.server.storage.cli`'s.

Registered under the ``veil.commands`` entry points. Option defaults come from
:data:`veil.server.collector.config.DEFAULTS`, or from the environment variables
of :data:`veil.server.settings.ENVIRONMENT`. Heavy imports (Flask, waitress, NumPy,
prometheus_client) happen inside the ``run`` functions so ``veil --help`` works
with the light client install.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from veil.server.cli.options import (
    add_config_option,
    add_db_option,
    add_range_options,
    output_directory,
    port_number,
    short_token_warning,
    thread_count,
    token_list,
    whole_number,
    worker_count,
)
from veil.server.collector.config import DEFAULTS, storage_options
from veil.server.collector.logs import FORMATS, LEVELS, configure_logging
from veil.server.collector.proxies import trusted_networks
from veil.server.settings import ENVIRONMENT, env_value
from veil.shared.errors import ParameterError, VeilError

logger = logging.getLogger(__name__)


def configure_serve(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil serve``."""
    add_config_option(parser)
    add_db_option(parser, help_text="the database: a file path or sqlite:///path (created if "
                                    "missing), or postgresql://... (an existing database)")
    parser.add_argument("--host", default=DEFAULTS["HOST"],
                        help=f"address to listen on (default {DEFAULTS['HOST']})")
    parser.add_argument("--port", type=port_number, default=DEFAULTS["PORT"],
                        help=f"port (default {DEFAULTS['PORT']}; 0 picks a free one)")
    parser.add_argument("--threads", type=thread_count, default=DEFAULTS["THREADS"],
                        help=f"threads serving requests per worker (default {DEFAULTS['THREADS']})")
    parser.add_argument("--workers", type=worker_count, default=DEFAULTS["WORKERS"],
                        help=f"server processes sharing the port (default {DEFAULTS['WORKERS']}; "
                        "more use more cores)")
    parser.add_argument("--connection-limit", type=whole_number(1), default=DEFAULTS["CONNECTION_LIMIT"],
                        help=f"open connections per worker; more wait to be accepted, and "
                        f"near it idle keep-alive connections are closed "
                        f"(default {DEFAULTS['CONNECTION_LIMIT']})")
    parser.add_argument("--channel-timeout", type=whole_number(1), default=DEFAULTS["CHANNEL_TIMEOUT"],
                        help=f"seconds a connection may stay silent before it is closed "
                        f"(default {DEFAULTS['CHANNEL_TIMEOUT']})")
    parser.add_argument("--receive-timeout", type=whole_number(1), default=DEFAULTS["RECEIVE_TIMEOUT"],
                        help=f"seconds a client may take to send one request from its first byte; "
                        f"slower ones are disconnected (default {DEFAULTS['RECEIVE_TIMEOUT']})")
    parser.add_argument("--read-token", action="append", default=None,
                        help="bearer token for reading counts and /metrics (repeatable, for "
                        f"rotation; default: ${ENVIRONMENT['read_token']}, comma-separated)")
    parser.add_argument("--upload-token", action="append", default=None,
                        help="require a bearer token to upload (repeatable: one per client group, "
                        "each rate-limited on its own, or for rotation; default: "
                        f"${ENVIRONMENT['upload_token']}, comma-separated, else uploads are open)")
    parser.add_argument("--metrics-token", action="append", default=None,
                        help="bearer token for scraping /metrics only (repeatable; default: "
                        f"${ENVIRONMENT['metrics_token']}, comma-separated); a read token works "
                        "too")
    parser.add_argument("--log-format", type=str.lower, choices=FORMATS,
                        default=env_value(ENVIRONMENT["log_format"]) or DEFAULTS["LOG_FORMAT"],
                        help="log lines on stderr as text or one JSON object a line "
                        f"(default: ${ENVIRONMENT['log_format']}, else {DEFAULTS['LOG_FORMAT']})")
    parser.add_argument("--log-level", type=str.lower, choices=LEVELS,
                        default=env_value(ENVIRONMENT["log_level"]) or DEFAULTS["LOG_LEVEL"],
                        help="least severe level logged "
                        f"(default: ${ENVIRONMENT['log_level']}, else {DEFAULTS['LOG_LEVEL']})")
    _add_limit_options(parser)
    parser.add_argument("--max-body-bytes", type=whole_number(1024), default=DEFAULTS["MAX_CONTENT_LENGTH"],
                        help=f"largest request body accepted "
                        f"(default {DEFAULTS['MAX_CONTENT_LENGTH'] / 2**20:g} MiB)")
    parser.add_argument("--max-reports", type=whole_number(1), default=DEFAULTS["MAX_REPORTS_PER_BATCH"],
                        help=f"largest batch accepted "
                        f"(default {DEFAULTS['MAX_REPORTS_PER_BATCH']} reports)")
    parser.add_argument("--recent-ids-limit", type=whole_number(1),
                        default=DEFAULTS["RECENT_IDS_LIMIT"],
                        help="new report ids kept (in each worker's memory too) before a merge "
                        "into the id index (default: the storage's, see docs/operations.md; "
                        "larger: rarer, longer merge pauses)")
    parser.add_argument("--fold-limit", type=whole_number(1), default=DEFAULTS["FOLD_LIMIT"],
                        help="new reports waiting before they are counted into the aggregates "
                        "in bulk (default: the storage's, see docs/operations.md; larger: "
                        "faster ingestion, slower counts)")
    parser.add_argument("--min-free-bytes", type=whole_number(0), default=DEFAULTS["MIN_FREE_BYTES"],
                        help="/readyz answers 503 while the database's filesystem has less free "
                        "space (default: the storage's, 64 MiB)")
    parser.add_argument("--dashboard", action="store_true",
                        help="also serve the read-only dashboard at /dashboard, to the read "
                        "tokens (docs/dashboard.md)")
    parser.add_argument("--dashboard-candidates", default=DEFAULTS["DASHBOARD_CANDIDATES"],
                        help="with --dashboard: a directory of <metric>.txt candidate files for "
                        "string metrics")
    parser.add_argument("--migrate", action="store_true",
                        help="bring a database with an older schema to this Veil's before serving "
                        "(default: refuse it; see veil migrate --dry-run)")


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``veil serve``'s rate limits, daily cap and the proxies that name the client."""
    parser.add_argument("--network-rate", type=float, default=DEFAULTS["NETWORK_RATE"],
                        help="reports a second each source network (/24 or /48) may upload, "
                        "in bursts of --burst-seconds of it; more get 429 (default: no limit)")
    parser.add_argument("--token-rate", type=float, default=DEFAULTS["TOKEN_RATE"],
                        help="reports a second each upload token may upload (default: no limit)")
    parser.add_argument("--token-daily-cap", type=whole_number(0),
                        default=DEFAULTS["TOKEN_DAILY_CAP"],
                        help="reports each upload token may upload per UTC day, counted in the "
                        "database; at least --max-reports (default: no cap)")
    parser.add_argument("--burst-seconds", type=float, default=DEFAULTS["RATE_BURST_SECONDS"],
                        help=f"seconds of a rate a burst may use "
                        f"(default {DEFAULTS['RATE_BURST_SECONDS']:g})")
    parser.add_argument("--proxy-hops", type=whole_number(0), default=DEFAULTS["PROXY_HOPS"],
                        help="reverse proxies in front whose X-Forwarded-For names the client, "
                        "for --network-rate (default 0: trust no header)")
    parser.add_argument("--trusted-proxy", action="append", default=None,
                        help="address or network (CIDR) of a proxy --proxy-hops may trust; "
                        "repeatable. Other peers' forwarded headers are removed (default: any "
                        "peer, so only proxies must reach the collector)")


def serve_config(args: argparse.Namespace) -> dict[str, Any]:
    """The collector configuration from ``veil serve``'s arguments and the environment."""
    return {
        "REGISTRY": args.config,
        "DATABASE": args.db,
        "READ_TOKENS": token_list(args.read_token, ENVIRONMENT["read_token"], "--read-token"),
        "UPLOAD_TOKEN": token_list(args.upload_token, ENVIRONMENT["upload_token"],
                                   "--upload-token"),
        "METRICS_TOKENS": token_list(args.metrics_token, ENVIRONMENT["metrics_token"],
                                     "--metrics-token"),
        "NETWORK_RATE": args.network_rate,
        "TOKEN_RATE": args.token_rate,
        "TOKEN_DAILY_CAP": args.token_daily_cap,
        "RATE_BURST_SECONDS": args.burst_seconds,
        "PROXY_HOPS": args.proxy_hops,
        "TRUSTED_PROXIES": tuple(args.trusted_proxy or ()),
        "MAX_CONTENT_LENGTH": args.max_body_bytes,
        "MAX_REPORTS_PER_BATCH": args.max_reports,
        "RECENT_IDS_LIMIT": args.recent_ids_limit,
        "FOLD_LIMIT": args.fold_limit,
        "MIN_FREE_BYTES": args.min_free_bytes,
        "HOST": args.host,
        "PORT": args.port,
        "THREADS": args.threads,
        "WORKERS": args.workers,
        "CONNECTION_LIMIT": args.connection_limit,
        "CHANNEL_TIMEOUT": args.channel_timeout,
        "RECEIVE_TIMEOUT": args.receive_timeout,
        "LOG_FORMAT": args.log_format,
        "LOG_LEVEL": args.log_level,
        "DASHBOARD": args.dashboard,
        "DASHBOARD_CANDIDATES": args.dashboard_candidates,
    }


def _check_serving_bounds(args: argparse.Namespace) -> None:
    """Refuse, before anything listens, what the workers would only refuse once started (or
    never): a rate that is not a finite number (worker and thread counts are bounded by
    their option types)."""
    for name in ("network_rate", "token_rate", "burst_seconds"):
        if not math.isfinite(getattr(args, name)):
            option = "--" + name.replace("_", "-")
            raise ParameterError(name, f"{option} must be a finite number; got {getattr(args, name)}")


def run_serve(args: argparse.Namespace) -> int:
    """Check the registry against the database, listen, and serve until SIGTERM or SIGINT."""
    from veil.server.collector.rate_limits import token_daily_cap
    from veil.server.storage import open_storage
    from veil.shared.registry import Registry

    _check_serving_bounds(args)
    for name in ("network_rate", "token_rate"):
        if getattr(args, name) < 0:
            option = "--" + name.replace("_", "-")
            raise ParameterError(name, f"{option} must be 0 (off) or more; got {getattr(args, name)}")
    if args.trusted_proxy and not args.proxy_hops:
        raise ParameterError("trusted_proxy", "--trusted-proxy names proxies whose forwarded "
                             "headers --proxy-hops reads; give --proxy-hops N too")
    trusted_networks(args.trusted_proxy, "trusted_proxy")
    if args.burst_seconds <= 0:
        raise ParameterError("burst_seconds", f"--burst-seconds must be more than 0; got {args.burst_seconds}")
    for name, allowed in (("log_format", FORMATS), ("log_level", LEVELS)):
        value = getattr(args, name)
        if value not in allowed:
            option = "--" + name.replace("_", "-")
            raise ParameterError(name, f"{option} (default ${ENVIRONMENT[name]}) must be one of "
                            f"{', '.join(allowed)}; got {value!r}")
    config = serve_config(args)
    if config["DASHBOARD"] and not config["READ_TOKENS"]:
        raise ParameterError("read_token", "--dashboard shows data to read tokens only: give "
                             f"--read-token (or set ${ENVIRONMENT['read_token']})")
    candidates = config["DASHBOARD_CANDIDATES"]
    if candidates is not None and not config["DASHBOARD"]:
        raise ParameterError("dashboard_candidates", "--dashboard-candidates is read by the "
                             "dashboard only: give --dashboard too")
    if candidates is not None and not Path(candidates).is_dir():
        raise ParameterError("dashboard_candidates", f"--dashboard-candidates {candidates}: not "
                             "a directory; give a directory holding <metric>.txt files, one "
                             "candidate string a line")
    token_daily_cap(config)  # a cap that could not hold is refused before anything starts
    storage_options(config)  # and SQLite's settings for another database
    configure_logging(config["LOG_FORMAT"], config["LOG_LEVEL"])
    registry = Registry.load(args.config)
    for name, metric in registry.items():
        if metric.note:
            logger.info("metric %r: %s", name, metric.note)
    # check the registry against the database (and migrate it, if asked) once, before any worker
    # starts
    with open_storage(args.db, registry, create=True, migrate=args.migrate) as storage:
        location = storage.location
    try:
        sock = socket.create_server((config["HOST"], config["PORT"]), backlog=1024)
    except OSError as exc:
        raise VeilError(f"cannot listen on {config['HOST']}:{config['PORT']}: "
                        f"{exc.strerror}") from None
    host, port = sock.getsockname()[:2]
    with _metrics_directory(config["WORKERS"]):
        from veil.server.collector.serving import serve

        _log_summary(config, len(registry), location, f"http://{host}:{port}")
        print(f"veil serve: listening on http://{host}:{port}", flush=True)
        try:
            code = serve(config, sock)
        finally:
            sock.close()
    logger.info("stopped")
    return code


def _log_summary(config: dict[str, Any], metrics: int, location: str, url: str) -> None:
    """The start-up lines: what is served from where, who may do what, and how. Counts
    tokens, never shows them."""
    from veil.server.collector.rate_limits import burst_warnings

    logger.info("serving %d metrics of the registry %s; storage %s", metrics,
                config["REGISTRY"], location)
    uploads = config["UPLOAD_TOKEN"]
    reads = config["READ_TOKENS"]
    scrapes = config["METRICS_TOKENS"]
    logger.info("uploads %s; %d read token(s); %d metrics token(s); /metrics %s",
                f"need one of {len(uploads)} upload token(s)" if uploads
                else "are open (no upload token)", len(reads), len(scrapes),
                "takes a metrics or read token" if scrapes or reads
                else "is refused (no metrics or read token)")
    if not reads:
        logger.warning("no read token set (--read-token or %s): counts cannot be read over "
                       "HTTP", ENVIRONMENT["read_token"])
    for tokens, option in ((uploads, "--upload-token"), (reads, "--read-token"),
                           (scrapes, "--metrics-token")):
        if (warning := short_token_warning(list(tokens), option)) is not None:
            logger.warning("%s", warning)
    for warning in burst_warnings(config):
        logger.warning("%s", warning)
    if config["PROXY_HOPS"] and not config["TRUSTED_PROXIES"] and not _loopback(config["HOST"]):
        logger.warning("--proxy-hops %d trusts the forwarded headers of any peer, and %s is "
                       "reachable from other machines: name the proxies with --trusted-proxy, "
                       "or a client can pick its own rate-limit bucket", config["PROXY_HOPS"],
                       config["HOST"])
    logger.info("%d worker(s) of %d threads, listening on %s", config["WORKERS"],
                config["THREADS"], url)


def _loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine reaches."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def _metrics_directory(workers: int) -> Iterator[None]:
    """``PROMETHEUS_MULTIPROC_DIR`` while serving: with several workers, a new private
    directory where each process writes its metrics, removed afterwards; with one, unset
    (an inherited value would mix in other servers' files). Must be entered before
    prometheus_client is imported."""
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if workers == 1:
        yield
        return
    directory = tempfile.mkdtemp(prefix="veil-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        yield
    finally:
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        shutil.rmtree(directory, ignore_errors=True)


def configure_export(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil export``."""
    add_db_option(parser)
    parser.add_argument("--metric", required=True, help="metric name")
    parser.add_argument("--out", required=True, type=output_directory,
                        help="directory for params.csv and counts.csv (created if missing)")
    add_config_option(parser, required=False,
                      help_text="registry TOML, else the registry stored in the database")
    add_range_options(parser, metric=False)
    parser.add_argument("--force", action="store_true",
                        help="export even with fewer reports than the metric's min_reports")


def run_export(args: argparse.Namespace) -> int:
    """Write google/rappor params.csv and counts.csv for a metric from the database."""
    from veil.server.counts import rappor_params, write_counts_document, write_params
    from veil.server.storage import open_storage
    from veil.server.storage.errors import UnknownMetricError
    from veil.shared.registry import Registry

    with open_storage(args.db) as storage:
        registry = Registry.load(args.config) if args.config else storage.registry
        if args.metric not in registry:
            raise UnknownMetricError(args.config or storage.location, args.metric, registry)
        metric = registry[args.metric]
        params = rappor_params(metric.params)
        document = storage.counts(metric, args.start, args.end,
                                  min_reports=0 if args.force else None)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_params(params, out / "params.csv")
        reports, cohorts = write_counts_document(document, out / "counts.csv")
    except OSError as exc:
        where = exc.filename or out
        raise VeilError(f"--out {out}: cannot write {where} ({exc.strerror}); give a directory "
                        "you may write to (one that is not a file)") from None
    print(f"veil export: {reports} reports of {args.metric!r} in {cohorts} cohorts "
          f"-> {out / 'params.csv'}, {out / 'counts.csv'}")
    return 0


def configure_metrics(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil metrics``."""
    add_config_option(parser)


def run_metrics(args: argparse.Namespace) -> int:
    """Print each metric's mechanism, what it costs in privacy, and the registry's choices."""
    from veil.shared.privacy import format_delta, format_epsilon
    from veil.shared.registry import Registry

    registry = Registry.load(args.config)
    print(f"{'metric':<24} {'mechanism':<18} {'epsilon_1':>9} {'epsilon_inf':>11}  report")
    deltas = []
    for name, metric in registry.items():
        params = metric.params
        size = getattr(params, "report_bytes", None)
        if size is None and (rappor := params.as_rappor()) is not None:
            size = (rappor.k + 7) // 8
        shown = f"{size} byte{'s' * (size != 1)}" if size is not None else "one number"
        delta = getattr(params, "delta", None)
        deltas += [delta] if delta else []
        print(f"{name:<24} {params.mechanism_name:<18} {format_epsilon(params.epsilon_1):>9} "
              f"{format_epsilon(params.epsilon_inf):>11}  {shown}"
              + (f" (with delta {format_delta(delta)} per value)" if delta else ""))
        if metric.note:
            print(f"{'':<24} {metric.note}")
    print(f"epsilon_inf bounds what all reports of one value reveal; an installation reporting "
          f"one value per metric spends at most {format_epsilon(registry.epsilon_total())} in "
          "all (epsilons rounded up)"
          # fsum is correctly rounded: the next float up is never below the exact sum
          + (f", with delta {format_delta(math.nextafter(math.fsum(deltas), math.inf))} from "
             "its Gaussian numbers (each value another delta)" if deltas else ""))
    return 0


COMMANDS = [
    ("metrics", "show each metric's mechanism, privacy cost and the oracle 'auto' chose",
     configure_metrics, run_metrics),
    ("serve", "run the collector (HTTP API) under the waitress WSGI server",
     configure_serve, run_serve),
    ("export", "write google/rappor params.csv and counts.csv for a metric",
     configure_export, run_export),
]
