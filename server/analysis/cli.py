"""``veil decode`` and ``veil map``: the analysis from the command line.

Heavy dependencies (NumPy, SciPy, scikit-learn, matplotlib) load inside the
``run`` functions so that ``veil --help`` works with the light install.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import Executor
from pathlib import Path

from veil.server.cli.options import (
    add_db_option,
    add_range_options,
    add_server_options,
    output_directory,
)
from veil.server.settings import ENVIRONMENT, env_value
from veil.shared.errors import ParameterError
from veil.shared.hashing import HASHINGS


def _add_collected_options(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """A group ``title`` with a collector (``--server``, ``--token``) or its database
    (``--db``), and the UTC days to read (``--start``, ``--end``); returns the group.

    Neither source is required, and their environment variables apply only when neither
    option is given (:func:`_collected_source`)."""
    group = parser.add_argument_group(title)
    add_server_options(group)
    add_db_option(group, required=False)
    parser.set_defaults(server=None, db=None)
    add_range_options(group, metric=False)
    return group


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
    live = _add_collected_options(parser, "collected data")
    live.add_argument("--metric", help="metric name (with --server or --db)")
    live.add_argument(
        "--force", action="store_true",
        help="with --db: decode even with fewer reports than the metric's min_reports",
    )
    live.add_argument(
        "--by", choices=["day"],
        help="also decode each UTC day on its own: by_day.csv and by_day.png",
    )
    parser.add_argument(
        "--candidates", help="candidate strings, one per line (string metrics; instead of --map)"
    )
    parser.add_argument("--out", required=True, type=output_directory, help="output directory")
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
        "--confidence", type=float,
        help="confidence level of the intervals, in (0, 1); their columns are named for it "
             "(low_90 and high_90 at 0.9; default: 0.95, low_95 and high_95)",
    )
    parser.add_argument(
        "--estimator", choices=("unbiased", "ibu"),
        help="shares of strings and categories: unbiased (the default; a share may read "
             "below 0 by noise) or ibu (iterative Bayesian update: non-negative, summing to "
             "the mass the list explains; for categories better at small epsilon; "
             "docs/analysis.md says when)",
    )
    parser.add_argument(
        "--all", action="store_true", dest="all_candidates",
        help="string metrics: results.csv lists every candidate, ranked by its evidence "
             "(z), with its p-value and whether it was detected, not only the detected ones",
    )
    parser.add_argument(
        "--no-background", action="store_true",
        help="do not model values missing from the candidate list (they then inflate the "
        "estimates of listed strings that share their bits)",
    )
    parser.add_argument("--top", type=int, default=30, help="rows in the chart (default: 30)")


def run_decode(args: argparse.Namespace) -> int:
    """Decode counts from files, a collector or its database, and write the outputs."""
    from veil.server.analysis.charts import ChartWorker

    if args.top < 1:
        raise ParameterError("top", f"--top must be at least 1; got {args.top}")
    with ChartWorker() as charts:
        return _decode(args, charts)


def _collected_source(args: argparse.Namespace, files: bool) -> tuple[str, str] | None:
    """``("server", URL)`` or ``("db", PATH)``: the collected data to decode, or None for
    google/rappor ``files``; :class:`ParameterError` unless exactly one source is given.

    A source given on the command line wins: the environment variables ($VEIL_URL,
    $VEIL_DB) apply only when neither --server nor --db is given, nor files, so a shell
    exporting both still decodes ``--db FILE`` or google/rappor files.
    """
    names = ("server", "db")
    given = {name: getattr(args, name) for name in names if getattr(args, name)}
    from_environment = not (given or files)
    if from_environment:
        given = {name: value for name in names if (value := env_value(ENVIRONMENT[name]))}
    if files + len(given) != 1:
        both = (f" (${ENVIRONMENT['server']} and ${ENVIRONMENT['db']} are both set)"
                if from_environment and given else "")
        raise ParameterError(
            "source",
            "give exactly one source: --params/--counts (google/rappor files), --server URL, "
            f"or --db PATH{both}",
        )
    return next(iter(given.items()), None)


#: options of ``veil decode`` that only collected data can honour: (dest, option, why)
COLLECTED_ONLY = (
    ("by", "--by day", "google/rappor files hold no days"),
    ("start", "--start", "google/rappor files hold no days"),
    ("end", "--end", "google/rappor files hold no days"),
    ("metric", "--metric", "google/rappor files name no metric"),
    ("force", "--force", "google/rappor files name no metric, so no min_reports to override"),
)


def _refuse_collected_options(args: argparse.Namespace) -> None:
    """:class:`ParameterError` naming the first option given that google/rappor files
    cannot honour (:data:`COLLECTED_ONLY`), rather than ignoring it."""
    for dest, option, why in COLLECTED_ONLY:
        if getattr(args, dest):
            raise ParameterError(dest, f"{option} needs collected data (--server or --db): {why}")


#: ``(dest, option)`` of the options only string decoders read
STRING_ONLY = (("candidates", "--candidates"), ("all_candidates", "--all"),
               ("no_background", "--no-background"), ("correction", "--correction"),
               ("alpha", "--alpha"))


def _refuse_string_options(args: argparse.Namespace, kind: str) -> None:
    """:class:`ParameterError` naming the first string-only option given for a metric of
    another ``kind``, rather than ignoring it."""
    if kind == "string":
        return
    for dest, option in STRING_ONLY:
        given = getattr(args, dest)
        if given is not None and given is not False:  # --alpha 0 is given (0.0 == False)
            raise ParameterError(dest, f"{option} applies to string metrics only; {args.metric!r} "
                                       f"is a {kind} metric: leave {option} out")


def _decode(args: argparse.Namespace, charts: Executor | None) -> int:
    from veil.server.analysis.candidate_map import read_candidates
    from veil.server.analysis.decoders import decode_counts
    from veil.server.analysis.files import write_outputs
    from veil.server.analysis.tables import period

    collected = _collected_source(args, bool(args.params or args.counts))
    # options not given on the command line keep the decoders' defaults (DEFAULT_OPTIONS)
    given = {name: getattr(args, name)
             for name in ("correction", "alpha", "confidence", "estimator")
             if getattr(args, name) is not None}
    options = {"background": not args.no_background, **given}
    if args.all_candidates:
        options["all_candidates"] = True
    daily = None
    if collected is None:
        from veil.server.analysis.sources import read_rappor_files

        _refuse_collected_options(args)
        if not (args.params and args.counts):
            raise ParameterError("params", "--params and --counts go together")
        if args.map and args.candidates:
            raise ParameterError("map", "give --map or --candidates, not both")
        if not (args.map or args.candidates):
            raise ParameterError("map", "give the candidates: --map map.csv or --candidates FILE")
        files_read = read_rappor_files(args.params, args.counts, args.map, args.hashing or "mmh3")
        candidates = (read_candidates(args.candidates) if args.candidates
                      else files_read.candidates)
        result = decode_counts(files_read.counts, candidates, files_read.candidate_map,
                               source=args.counts, **options)
    else:
        from veil.server.analysis.daily import decode_days
        from veil.server.analysis.sources import CountsSource

        if not args.metric:
            raise ParameterError("metric", "--metric NAME is required with --server or --db")
        if args.hashing:
            raise ParameterError(
                "hashing", "--hashing goes with --params/--counts; a metric's registry names its hashing"
            )
        if args.map:
            raise ParameterError("map", "--map goes with --params/--counts; use --candidates")
        name, where = collected
        with CountsSource(args.metric, token=args.token, start=args.start, end=args.end,
                          force=args.force, **{name: where}) as source:
            metric = source.registry.get(args.metric)
            _refuse_string_options(args, metric.kind if metric is not None else "string")
            document = source.counts()
            candidates = read_candidates(args.candidates) if args.candidates else None
            result = decode_counts(document, candidates, source=source.name, **options)
            if args.by:
                documents, skipped = source.daily()
                daily = decode_days(documents, candidates, skipped, **options)
                result.summary["by_day"] = daily.summary
    paths = write_outputs(result, args.out, args.top, charts, daily)
    summary = result.summary
    written = ", ".join(path.name for name, path in paths.items() if name != "results")
    days = period(summary.get("start"), summary.get("end"))
    print(f"{summary['reports']:,} report{'s' * (summary['reports'] != 1)}{days}: "
          f"{result.headline}; wrote {paths['results']}, {written}")
    print(f"privacy: {summary['privacy']['statement']}")
    if daily is not None:
        print(f"by day: {len(daily.days)} day(s) decoded"
              + (f", {len(daily.skipped)} skipped (fewer reports than needed): "
                 f"{', '.join(sorted(daily.skipped))}" if daily.skipped else ""))
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
    from veil.server.analysis.candidate_map import read_candidates, write_map
    from veil.server.counts import read_params

    if args.out:
        for option, given in (("--params", args.params), ("--candidates", args.candidates)):
            if Path(args.out).resolve() == Path(given).resolve():
                raise ParameterError("out", f"--out {args.out} is the {option} file: writing "
                                            "the map would overwrite it; give another path")
    params = read_params(args.params, args.hashing)
    candidates = read_candidates(args.candidates)
    write_map(params, candidates, args.out or sys.stdout)
    return 0


def configure_discover(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil discover``."""
    _add_collected_options(parser, "collected data (one source)")
    parser.add_argument("--metric", required=True,
                        help="the string metric whose discovery channel to search")
    parser.add_argument("--out", required=True, type=output_directory, help="output directory")
    parser.add_argument(
        "--false-prefixes", type=float, default=2.0,
        help="expected prefixes with no true mass kept per level: lower finds fewer rare "
             "strings and spends less time on false leads (default: 2)")
    parser.add_argument("--correction", default="bh",
                        help="multiple-testing correction of the strings found: bh (the default), "
                             "storey, bonferroni or none")
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="false discovery rate (or family-wise error rate) (default: 0.05)")
    parser.add_argument("--force", action="store_true",
                        help="decode even with fewer reports than the metric's min_reports")
    parser.add_argument("--top", type=int, default=30, help="rows in the chart (default: 30)")


def run_discover(args: argparse.Namespace) -> int:
    """Discover a string metric's frequent strings from its discovery channel, and write them."""
    from veil.server.analysis.api import discover
    from veil.server.analysis.files import write_discovery

    if args.top < 1:
        raise ParameterError("top", f"--top must be at least 1; got {args.top}")
    try:
        name, where = _collected_source(args, False) or ("", "")
    except ParameterError:
        raise ParameterError("source", "give exactly one source: --server URL (with a read "
                                       "token) or --db PATH") from None
    from tqdm import tqdm

    quiet = not sys.stderr.isatty() or bool(os.environ.get("CI"))
    with tqdm(desc="levels", disable=quiet, leave=False) as bar:
        def progress(done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.refresh()

        found = discover(args.metric, **{name: where}, token=args.token, start=args.start,
                         end=args.end, false_prefixes=args.false_prefixes,
                         correction=args.correction, alpha=args.alpha, force=args.force,
                         progress=progress)
    paths = write_discovery(found, args.out, args.top)
    summary = found.result.summary
    print(f"{summary['discovery']['reports']:,} discovery reports, "
          f"{summary['discovery']['candidates']} strings found by the prefix search; "
          f"{found.result.headline}; wrote {', '.join(str(p) for p in paths.values())}")
    print(f"privacy: {summary['privacy']['statement']}")
    return 0


def configure_assoc(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil assoc`` (google/rappor's ``decode_assoc.R`` names)."""
    parser.add_argument("--metric-name", required=True,
                        help="the metric whose variables the schema lists")
    parser.add_argument("--schema", required=True,
                        help="schema CSV: metric,var,var_type,params (var_type string or boolean)")
    parser.add_argument("--params-dir", required=True,
                        help="directory of the parameter files the schema names (<params>.csv)")
    parser.add_argument("--reports", required=True,
                        help="reports CSV: a cohort column and one bit-string column per variable")
    parser.add_argument("--var1", required=True, help="the first variable")
    parser.add_argument("--var2", required=True, help="the second variable")
    parser.add_argument("--map1", help="map.csv of --var1 when it is a string")
    parser.add_argument("--map2", help="map.csv of --var2 when it is a string")
    parser.add_argument("--output-dir", default=".", type=output_directory,
                        help="output directory (default: .)")
    parser.add_argument(
        "--prior-reports", type=float, default=30.0,
        help="strength of the Dirichlet prior, in pseudo-reports spread evenly over the "
             "cells (default: 30; 0 gives the maximum-likelihood table)")
    parser.add_argument("--max-em-iters", type=int, default=1000,
                        help="most accelerated EM cycles (default: 1000); reported if reached")



def run_assoc(args: argparse.Namespace) -> int:
    """``veil assoc``: :func:`veil.server.analysis.assoc_cli.run_assoc` (loaded when it runs, so
    that listing the commands loads none of the analysis)."""
    from veil.server.analysis.assoc_cli import run_assoc as run

    return run(args)


COMMANDS = [
    (
        "assoc",
        "the joint table of two variables from google/rappor's association files, with errors",
        configure_assoc,
        run_assoc,
    ),
    (
        "decode",
        "decode string frequencies, category shares, yes-shares or means with error bars",
        configure_decode,
        run_decode,
    ),
    (
        "discover",
        "find a string metric's frequent strings nobody listed, from its discovery channel",
        configure_discover,
        run_discover,
    ),
    (
        "map",
        "write a google/rappor map.csv for candidate strings (Veil's or google/rappor's hashing)",
        configure_map,
        run_map,
    ),
]
