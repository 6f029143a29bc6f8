"""``veil decode`` and ``veil map``: the analysis from the command line.

Heavy dependencies (NumPy, SciPy, scikit-learn, matplotlib) load inside the
``run`` functions so that ``veil --help`` works with the light install.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import Executor

from veil.shared.errors import ParameterError
from veil.shared.hashing import HASHINGS


def configure_decode(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil decode``."""
    files = parser.add_argument_group("google/rappor files")
    files.add_argument("--params", help="params.csv (header k,h,m,p,q,f)")
    files.add_argument("--counts", help="counts.csv (one row per cohort: reports, then bit counts)")
    files.add_argument("--map", help="map.csv (candidate, then m*h 1-based bit indices)")
    files.add_argument(
        "--hashing", choices=HASHINGS,
        help="the clients' hashing, for --candidates (default: mmh3; google/rappor's: md5-google)",
    )
    live = parser.add_argument_group("collected data")
    live.add_argument("--server", help="collector base URL, e.g. https://telemetry.example.org")
    live.add_argument("--token", help="read token for --server")
    live.add_argument("--db", help="a collector's database: a file path or sqlite:///path")
    live.add_argument("--metric", help="metric name (with --server or --db)")
    live.add_argument("--start", help="first day, YYYY-MM-DD (UTC, inclusive)")
    live.add_argument("--end", help="last day, YYYY-MM-DD (UTC, inclusive)")
    live.add_argument(
        "--force", action="store_true",
        help="with --db: decode even with fewer reports than the metric's min_reports",
    )
    parser.add_argument(
        "--candidates", help="candidate strings, one per line (string metrics; instead of --map)"
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--correction",
        help="multiple-testing correction for detected strings: storey (false discovery rate, "
        "Benjamini-Hochberg adapted to the share of absent candidates; the default), bh "
        "(Benjamini-Hochberg), bonferroni (family-wise error rate) or none",
    )
    parser.add_argument(
        "--alpha", type=float, help="false discovery rate (storey, bh) or "
        "family-wise error rate (bonferroni) for detected strings (default: 0.05)",
    )
    parser.add_argument(
        "--no-background", action="store_true",
        help="do not model values missing from the candidate list (they then inflate the "
        "estimates of listed strings that share their bits)",
    )
    parser.add_argument("--top", type=int, default=30, help="rows in the chart (default: 30)")


def run_decode(args: argparse.Namespace) -> int:
    """Decode counts from files, a collector or its database, and write the outputs."""
    from veil.server.analysis.report import ChartWorker

    if args.top < 1:
        raise ParameterError("top", f"--top must be at least 1; got {args.top}")
    with ChartWorker() as charts:
        return _decode(args, charts)


def _decode(args: argparse.Namespace, charts: Executor | None) -> int:
    from veil.server.analysis.candidate_map import read_candidates
    from veil.server.analysis.decode import decode_counts
    from veil.server.analysis.report import write_outputs

    sources = [bool(args.params or args.counts), bool(args.server), bool(args.db)]
    if sum(sources) != 1:
        raise ParameterError(
            "source",
            "give exactly one source: --params/--counts (google/rappor files), --server URL, "
            "or --db PATH",
        )
    candidates = candidate_map = None
    if args.params or args.counts:
        from veil.server.analysis.rappor_files import read_rappor_files

        if not (args.params and args.counts):
            raise ParameterError("params", "--params and --counts go together")
        if args.map and args.candidates:
            raise ParameterError("map", "give --map or --candidates, not both")
        if not (args.map or args.candidates):
            raise ParameterError("map", "give the candidates: --map map.csv or --candidates FILE")
        files = read_rappor_files(args.params, args.counts, args.map, args.hashing or "mmh3")
        document = files.counts
        source = args.counts
        candidates, candidate_map = files.candidates, files.candidate_map
    else:
        from veil.server.analysis.sources import db_counts, fetch_counts

        if not args.metric:
            raise ParameterError("metric", "--metric NAME is required with --server or --db")
        if args.hashing:
            raise ParameterError(
                "hashing", "--hashing goes with --params/--counts; a metric's registry names its hashing"
            )
        if args.server:
            document = fetch_counts(args.server, args.token, args.metric, args.start, args.end)
            source = f"{args.server} metric {args.metric}"
        else:
            document = db_counts(args.db, args.metric, args.start, args.end, force=args.force)
            source = f"{args.db} metric {args.metric}"
        if args.map:
            raise ParameterError("map", "--map goes with --params/--counts; use --candidates")
    if args.candidates:
        candidates = read_candidates(args.candidates)
    # options not given on the command line keep the decoders' defaults (DEFAULT_OPTIONS)
    given = {name: getattr(args, name) for name in ("correction", "alpha")
             if getattr(args, name) is not None}
    result = decode_counts(
        document, candidates, candidate_map, background=not args.no_background, source=source,
        **given,
    )
    paths = write_outputs(result, args.out, args.top, charts)
    summary = result.summary
    print(f"{summary['reports']:,} reports: {result.headline}; wrote {paths['results']}, "
          f"{paths['summary'].name}, {paths['chart'].name}")
    if "warning" in summary:
        print(f"warning: {summary['warning']}", file=sys.stderr)
    if "note" in summary:
        print(f"note: {summary['note']}", file=sys.stderr)
    return 0


def configure_map(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil map``."""
    parser.add_argument("--params", required=True, help="params.csv (header k,h,m,p,q,f)")
    parser.add_argument("--candidates", required=True, help="candidate strings, one per line")
    parser.add_argument("--out", help="output file (default: standard output)")
    parser.add_argument(
        "--hashing", choices=HASHINGS, default="mmh3",
        help="the clients' hashing (default: mmh3, Veil's; google/rappor's: md5-google)",
    )


def run_map(args: argparse.Namespace) -> int:
    """Write a google/rappor map.csv for the candidates with the clients' hashing."""
    from veil.server.analysis.candidate_map import read_candidates
    from veil.server.analysis.rappor_files import read_params, write_map

    params = read_params(args.params, args.hashing)
    candidates = read_candidates(args.candidates)
    write_map(params, candidates, args.out or sys.stdout)
    return 0


COMMANDS = [
    (
        "decode",
        "decode string frequencies, category shares, yes-shares or means with error bars",
        configure_decode,
        run_decode,
    ),
    (
        "map",
        "write a google/rappor map.csv for candidate strings (Veil's or google/rappor's hashing)",
        configure_map,
        run_map,
    ),
]
