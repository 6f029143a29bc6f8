"""``veil experiment``, ``veil simulate`` and ``veil demo``.

Heavy dependencies (NumPy, Matplotlib, the collector and the analysis) are
imported inside the commands so that ``veil --help`` stays light.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veil.server.cli.options import whole_number, worker_count
from veil.shared.errors import ParameterError
from veil.shared.hashing import HASHINGS

EXPERIMENT_NAMES = ("regression", "detection", "rr-vs-laplace", "laplace-mean", "composition",
                    "variances", "oracles", "strings", "calibration", "association",
                    "marginals")


#: a ``--seed``: a whole number from 0 to 2**64 - 1 (what NumPy's generators take)
seed_number = whole_number(0, 2**64 - 1, shown="from 0 to 2**64 - 1")


def configure_experiment(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil experiment``."""
    parser.add_argument("name", choices=(*EXPERIMENT_NAMES, "discovery", "all"),
                        help="which experiment ('all' runs each but discovery)")
    parser.add_argument("--out", required=True, type=Path,
                        help="results directory (metrics.csv, PNG plots, report.html)")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds), for tests")
    parser.add_argument("--seed", type=seed_number, default=1, help="seed of the simulation generator")
    discovery = parser.add_argument_group("discovery")
    discovery.add_argument("--population", type=Path,
                           help="CSV of value,count (default: 100,000 URL-like strings of 8-64 "
                                "bytes under Zipf(1.1))")
    discovery.add_argument("--reports", type=int, default=1_000_000,
                           help="installations, one report each (default: 1000000)")
    discovery.add_argument("--epsilon", type=float, default=4.0,
                           help="epsilon per installation for the whole metric (default: 4)")
    discovery.add_argument("--no-pem", action="store_true", help="skip the PEM baseline")


def run_experiment_command(args: argparse.Namespace) -> int:
    """Run one experiment (or all) and write its results directory."""
    from veil.simulations.experiments import run_experiment
    from veil.simulations.report import write_results

    if args.name == "discovery":
        return _run_discovery(args)
    names = EXPERIMENT_NAMES if args.name == "all" else (args.name,)
    for name in names:
        results = run_experiment(name, quick=args.quick, seed=args.seed)
        out = args.out / name if args.name == "all" else args.out
        directory = write_results(results, out)
        print(f"{results.title}: {len(results.rows)} rows in {results.elapsed:.1f} s -> "
              f"{directory}/report.html")
    return 0


def _run_discovery(args: argparse.Namespace) -> int:
    """``veil experiment discovery``: Veil's discovery and PEM on one population."""
    from veil.simulations.discovery_experiment import discovery_experiment, write_discovered
    from veil.simulations.populations import Population
    from veil.simulations.report import write_results

    if args.reports < 1:
        raise ParameterError("reports", f"--reports must be at least 1; got {args.reports}")
    if not 0 < args.epsilon <= 20:
        raise ParameterError("epsilon", f"--epsilon must be in (0, 20]; got {args.epsilon}")
    population = Population.from_csv(args.population) if args.population else None
    results, table = discovery_experiment(population, args.reports, args.epsilon, args.seed,
                                          pem=not args.no_pem, quick=args.quick)
    directory = write_results(results, args.out)
    write_discovered(directory / "discovered.csv", table)
    for row in results.rows:
        print(f"{row['method']}: {row['discovered']} strings reported, recall "
              f"{row['recall_0.01']:.2f} (share >= 1%), {row['recall_0.003']:.2f} (>= 0.3%), "
              f"precision {row['precision']:.2f}, F1 of the top 32 {row['f1_top32']:.2f}")
    print(f"{results.title}: {results.elapsed:.1f} s -> {directory}/report.html, "
          f"{directory}/discovered.csv")
    return 0


def configure_simulate(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil simulate``."""
    parser.add_argument("--reports", type=int, default=10_000_000, help="string reports (one per client)")
    parser.add_argument("--values", type=int, default=10_000, help="distinct true values v1..vn")
    parser.add_argument("--distribution", default="zipf1.5",
                        help="uniform, exp, gauss, zipf1 or zipf1.5 (default zipf1.5)")
    parser.add_argument("--population", type=Path, help="CSV of value,count instead of --distribution")
    parser.add_argument("--candidates", type=int, default=1000,
                        help="decode against the most likely N values (0: skip decoding)")
    parser.add_argument("--path", choices=("fast", "matrix", "both"), default="both",
                        help="encoding path to time (default both)")
    for name, default, kind in (("k", 128, int), ("h", 2, int), ("m", 64, int), ("p", 0.5, float),
                                ("q", 0.75, float), ("f", 0.5, float)):
        parser.add_argument(f"--{name}", type=kind, default=default, help=f"RAPPOR {name} (default {default})")
    parser.add_argument("--hashing", choices=HASHINGS, default="mmh3",
                        help="Bloom hashing: mmh3 (default) or md5-google (google/rappor's)")
    parser.add_argument("--seed", type=seed_number, default=1, help="seed of the simulation generator")


def run_simulate(args: argparse.Namespace) -> int:
    """Time encoding, aggregation and decoding of simulated string reports."""
    import numpy as np

    from veil.shared.kinds import StringParams
    from veil.simulations.populations import Population
    from veil.simulations.simulate import describe, run_simulation

    if args.reports < 1:
        raise ParameterError("reports", f"--reports must be >= 1; got {args.reports}")
    params = StringParams(k=args.k, h=args.h, m=args.m, p=args.p, q=args.q, f=args.f,
                          hashing=args.hashing)
    if args.population is not None:
        population = Population.from_csv(args.population)
    else:
        population = Population.named(args.distribution, args.values)
    print("simulating " + ", ".join(f"{k}={v}" for k, v in
                                    describe(params, population, args.reports).items()))
    print("(seeded NumPy randomness: for simulation only, never for real reports)")
    timings = run_simulation(params, population, args.reports, np.random.default_rng(args.seed),
                             path=args.path, candidates=min(args.candidates, len(population)))
    for line in timings.lines():
        print(line)
    sys.stdout.flush()
    return 0


def configure_demo(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil demo``."""
    from veil.simulations.demo_config import DemoConfig

    defaults = DemoConfig()
    parser.add_argument("--out", type=Path, default=defaults.out,
                        help=f"where to write the plot and decoded table (default ./{defaults.out})")
    parser.add_argument("--installations", type=int, default=defaults.installations,
                        help=f"simulated installations (default {defaults.installations})")
    parser.add_argument("--workers", type=worker_count, default=defaults.workers,
                        help=f"installations running at once (default {defaults.workers})")
    for name in ("k", "m"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name),
                            help=f"RAPPOR {name} of the string metric (default {getattr(defaults, name)})")
    for name in ("p", "q", "f"):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name),
                            help=f"RAPPOR {name} of the string metric (default {getattr(defaults, name)})")
    parser.add_argument("--seed", type=seed_number, default=defaults.seed,
                        help="seed of the simulated user behaviour (reports use the OS CSPRNG)")
    parser.add_argument("--temp-root", type=Path, default=None,
                        help="where to create the temporary directory (default: the system's)")


def run_demo_command(args: argparse.Namespace) -> int:
    """Run the end-to-end demo."""
    from veil.simulations.demo import run_demo
    from veil.simulations.demo_config import MAX_INSTALLATIONS, DemoConfig

    config = DemoConfig(installations=args.installations, workers=args.workers, k=args.k, m=args.m,
                        p=args.p, q=args.q, f=args.f, seed=args.seed, out=args.out,
                        temp_root=args.temp_root)
    config.registry()  # validate the parameters before starting anything
    fewest = config.minimum_installations()
    if not fewest <= args.installations <= MAX_INSTALLATIONS:
        raise ParameterError(
            "installations", f"--installations must be from {fewest} (the fewest whose reports "
            f"every metric may release) to {MAX_INSTALLATIONS:,} (each is a real client: use "
            f"veil populate against a collector for more); got {args.installations}")
    run_demo(config)
    return 0


def configure_populate(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil populate``."""
    from veil.server.settings import ENVIRONMENT, env_value

    # veil.server.cli.options adds --server only with --token (a read token populate has no
    # use for), so --server is added here, with the same variable and "required unless set"
    server = env_value(ENVIRONMENT["server"])
    parser.add_argument("--server", default=server, required=server is None,
                        help=f"the collector's base URL (default: ${ENVIRONMENT['server']})")
    parser.add_argument("--upload-token", default=env_value(ENVIRONMENT["upload_token"]),
                        help="upload token, when the collector requires one "
                        f"(default: ${ENVIRONMENT['upload_token']})")
    parser.add_argument("--installations", type=int, default=20_000,
                        help="simulated installations, one report each per metric (default 20000)")
    parser.add_argument("--metric", action="append", default=None,
                        help="only this metric (repeatable; default: every metric served)")
    parser.add_argument("--candidates-out", type=Path, default=None,
                        help="write the candidate strings to decode against to this file")
    parser.add_argument("--seed", type=seed_number, default=None,
                        help="seed of the simulated population (default: a fresh one, printed, "
                             "so that each run adds new installations)")


def run_populate(args: argparse.Namespace) -> int:
    """Upload simulated installations' reports to a running collector."""
    from veil.simulations.populate import populate

    populate(args.server, args.installations, token=args.upload_token, metrics=args.metric,
             seed=args.seed, candidates_out=args.candidates_out)
    return 0


COMMANDS = [
    ("demo", "run collector, thousands of real clients and the decoder on this machine (< 1 min)",
     configure_demo, run_demo_command),
    ("experiment", "run a published experiment and write CSV, PNG plots and an HTML report",
     configure_experiment, run_experiment_command),
    ("populate", "upload simulated installations' reports to a running collector, to try it out",
     configure_populate, run_populate),
    ("simulate", "time simulated encoding, aggregation and decoding of string reports",
     configure_simulate, run_simulate),
]
