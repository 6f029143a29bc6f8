"""Client SDK throughput: encoding a report, and ``Client.report()`` into the durable outbox.

Prints reports per second on one core (best of ``--repeat`` runs). Encoding uses
the production CSPRNG (``os.urandom``). Run it on an otherwise idle machine::

    python benchmarks/bench_client.py --repeat 5
    python benchmarks/bench_client.py --oracles     # only the category oracles
    python benchmarks/bench_client.py --discovery   # a string metric with discovery on

The last figure is ``Client()`` against a collector that never answers: the
constructor must not wait for the network.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable

from veil.client import Client, make_encoder
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    GrrParams,
    HadamardParams,
    NumberParams,
    OlhParams,
    OracleParams,
    OueParams,
    StringParams,
)
from veil.shared.registry import Metric, Registry


def offline_url() -> str:
    """A port on 127.0.0.1 where nothing listens: the final upload at close() is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def rate(run: Callable[[int], None], count: int, repeat: int) -> float:
    """Best reports per second over ``repeat`` runs of ``run(count)``."""
    best = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        run(count)
        best = max(best, count / (time.perf_counter() - started))
    return best


def bench_string_encoding(count: int, repeat: int) -> None:
    print("\nString encoding (Bloom + PRR + IRR), h=2, m=64, f=0.5, os.urandom noise")
    print(f"{'k':>6} {'p':>5} {'q':>5} {'same value/s':>14} {'new value/s':>14}")
    values = [f"site{i}.example" for i in range(count)]
    for k in (16, 128, 1024):
        for p, q in ((0.5, 0.75), (0.39, 0.61)):
            metric = Metric("homepage", StringParams(k=k, h=2, m=64, p=p, q=q, f=0.5))
            secret = os.urandom(32)

            def same(n: int, metric: Metric = metric, secret: bytes = secret) -> None:
                encode = make_encoder(metric, secret, 7).encode
                for _ in range(n):
                    encode("example.com")

            def new(n: int, metric: Metric = metric, secret: bytes = secret) -> None:
                encode = make_encoder(metric, secret, 7).encode
                for value in values[:n]:
                    encode(value)

            print(f"{k:>6} {p:>5} {q:>5} {rate(same, count, repeat):>14,.0f} "
                  f"{rate(new, count, repeat):>14,.0f}")


def bench_other_kinds(count: int, repeat: int) -> None:
    print("\nOther kinds (same value repeated; memoized response + fresh noise where any)")
    kinds = [
        ("category, 16 labels", CategoryParams(categories=tuple(f"c{i}" for i in range(16))), "c3"),
        ("boolean", BooleanParams(), True),
        ("number, laplace", NumberParams(low=0.0, high=100.0), 42.0),
        ("number, 1bitmean", NumberParams(low=0.0, high=100.0, mechanism="1bitmean"), 42.0),
    ]
    for label, params, value in kinds:
        encode = make_encoder(Metric("metric", params), os.urandom(32)).encode

        def run(n: int, encode: Callable[[object], object] = encode, value: object = value) -> None:
            for _ in range(n):
                encode(value)

        print(f"{label:<22} {rate(run, count, repeat):>12,.0f} reports/s")


#: encodes per second each oracle should reach at d = 1024 on one core (memoized values)
ORACLE_TARGETS: dict[type[OracleParams], int] = {
    GrrParams: 100_000, OueParams: 50_000, OlhParams: 100_000, HadamardParams: 100_000,
}


def bench_oracles(count: int, repeat: int, d: int = 1024) -> None:
    print(f"\nCategory oracles, d={d}, epsilon=2 (report_epsilon 1), os.urandom noise: "
          f"encoder.encode(value) over the {d} values in turn")
    print(f"{'oracle':<10} {'encodes/s':>12} {'target':>9} {'first report of a value/s':>27}")
    values = [f"c{i}" for i in range(d)]
    rotation = [values[i % d] for i in range(count)]
    for cls, target in ORACLE_TARGETS.items():
        metric = Metric("browser", cls(categories=tuple(values), epsilon=2.0))
        encode = make_encoder(metric, os.urandom(32)).encode
        for value in values:  # derive (and memoize) every permanent response first
            encode(value)

        def warm(n: int, encode: Callable[[object], object] = encode) -> None:
            for value in rotation[:n]:
                encode(value)

        def first(n: int, metric: Metric = metric) -> None:
            encode = make_encoder(metric, os.urandom(32)).encode
            for value in values[:n]:
                encode(value)

        figure = rate(warm, count, repeat)
        print(f"{cls.oracle:<10} {figure:>12,.0f} {target:>9,} {rate(first, d, repeat):>27,.0f}"
              + ("" if figure >= target else "  below target"))


def bench_client_report(count: int, repeat: int) -> None:
    print("\nClient.report() into the durable outbox (string k=128, h=2; one commit per report)")
    registry = Registry([Metric("homepage", StringParams())])
    cases = {
        "one value repeated": (lambda i: "example.com", None),
        "100 values rotating": (lambda i: f"site{i % 100}.example", None),
        "a new value each time": (lambda i: f"site{i}.example", None),
        "new values, with a budget": (lambda i: f"site{i}.example", 1e9),
        "one value, with a budget": (lambda i: "example.com", 1e9),
    }
    for label, (value, budget) in cases.items():
        best = 0.0
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as state:
                client = Client(offline_url(), state, registry=registry, budget=budget)
                started = time.perf_counter()
                for i in range(count):
                    client.report("homepage", value(i))
                best = max(best, count / (time.perf_counter() - started))
                client.close(timeout=1)
        print(f"{label:<26} {best:>12,.0f} reports/s")


def bench_discovery(count: int, repeat: int) -> None:
    """A string report against a discovery-channel report (defaults of both), encoding and
    ``Client.report()``; the ratio is what turning discovery on costs an installation."""
    print("\nDiscovery channel (defaults: 2-byte segments, epsilon 4) against a string report "
          "(k=128, h=2)")
    plain = Registry([Metric("homepage", StringParams())])
    # a share just below 1 puts (practically) every installation on the discovery channel
    found = Registry.from_dict({"metrics": {"homepage": {
        "kind": "string", "discovery": {"share": 0.999999}}}})
    values = [f"https://site{i}.example/path/{i}" for i in range(count)]
    print(f"{'':<34} {'string/s':>12} {'discovery/s':>12} {'ratio':>7}")
    for label, pick in (("encode, one value repeated", lambda i: values[0]),
                        ("encode, a new value each time", lambda i: values[i])):
        rates = []
        for metric in (plain["homepage"], found["homepage.discovery"]):
            def run(n: int, metric: Metric = metric, pick: Callable[[int], str] = pick) -> None:
                encode = make_encoder(metric, os.urandom(32), 7).encode
                for i in range(n):
                    encode(pick(i))
            rates.append(rate(run, count, repeat))
        print(f"{label:<34} {rates[0]:>12,.0f} {rates[1]:>12,.0f} {rates[0] / rates[1]:>7.2f}")
    for label, pick in (("Client.report, one value repeated", lambda i: values[0]),
                        ("Client.report, new values", lambda i: values[i])):
        rates = []
        for registry in (plain, found):
            best = 0.0
            for _ in range(repeat):
                with tempfile.TemporaryDirectory() as state:
                    client = Client(offline_url(), state, registry=registry)
                    started = time.perf_counter()
                    for i in range(count // 2):
                        client.report("homepage", pick(i))
                    best = max(best, count // 2 / (time.perf_counter() - started))
                    client.close(timeout=1)
            rates.append(best)
        print(f"{label:<34} {rates[0]:>12,.0f} {rates[1]:>12,.0f} {rates[0] / rates[1]:>7.2f}")


def bench_construction(repeat: int) -> None:
    """``Client()`` and ``close()`` against a collector that accepts connections and never
    answers, with no cached registry: neither may wait for the network."""
    print("\nClient() against a collector that never answers (no cached registry)")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        slowest = closing = 0.0
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as state:
                started = time.perf_counter()
                client = Client(url, state)
                slowest = max(slowest, time.perf_counter() - started)
                client.report("homepage", "example.com")
                started = time.perf_counter()
                client.close()
                closing = max(closing, time.perf_counter() - started)
    print(f"Client() {slowest * 1000:,.1f} ms, close() {closing:.2f} s (slowest of {repeat})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=30_000, help="reports per timed run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    parser.add_argument("--oracles", action="store_true",
                        help="only the category oracles (GRR, OUE, OLH, Hadamard) at d=1024")
    parser.add_argument("--discovery", action="store_true",
                        help="only a string metric with its discovery channel on")
    args = parser.parse_args(argv)
    logging.getLogger("veil.client").setLevel(logging.ERROR)  # the refused final uploads
    print(f"Python {platform.python_version()} on {platform.machine()}, "
          f"{args.reports:,} reports per run, best of {args.repeat}")
    if args.oracles:
        bench_oracles(args.reports, args.repeat)
        return 0
    if args.discovery:
        bench_discovery(args.reports, args.repeat)
        return 0
    bench_string_encoding(args.reports, args.repeat)
    bench_other_kinds(args.reports // 3, args.repeat)
    bench_oracles(args.reports, args.repeat)
    bench_client_report(args.reports // 2, args.repeat)
    bench_construction(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
