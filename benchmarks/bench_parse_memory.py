"""Peak memory of ``veil serve`` under concurrent hostile bodies built to be costly to parse.

Starts ``veil serve`` on 127.0.0.1 (one worker) with a one-metric registry, warms
it up with one small refused body (``[]``, through the same parser), then posts
``--bodies`` bodies at once, each about ``--mib`` MiB of one JSON array of tiny
values (``[{},{},...]`` by default: the most Python objects per byte). Prints each
answer and the server's peak resident set size (``VmHWM`` in ``/proc/PID/status``,
Linux only) before and after. Bounded: one round of requests, each with a timeout.

    python benchmarks/bench_parse_memory.py [--bodies 8] [--mib 8] [--threads 4]
        [--shape '{}'] [--max-body-bytes N]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import threading
from pathlib import Path

import requests

from veil.shared.registry import Registry
from veil.simulations.demo import Collector

REGISTRY = Registry.from_toml("""
version = 1
[metrics.dark_mode]
kind = "boolean"
min_reports = 1
""")
JSON = {"Content-Type": "application/json"}


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size in MiB (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM in /proc: this measurement needs Linux")


def hostile_body(mib: float, shape: str) -> bytes:
    """A JSON array of ``shape`` repeated to at most ``mib`` MiB."""
    count = int(mib * 2**20 - 2) // (len(shape) + 1)
    return b"[" + b",".join([shape.encode()] * count) + b"]"


def post(url: str, body: bytes, outcomes: collections.Counter[str]) -> None:
    """POST ``body``; count the status code, or the error's name."""
    try:
        response = requests.post(url, data=body, headers=JSON, timeout=120)
        code = response.json()["error"]["code"] if response.status_code != 200 else "ok"
        outcomes[f"{response.status_code} {code}"] += 1
    except (requests.RequestException, ValueError) as exc:
        outcomes[type(exc).__name__] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=8, help="concurrent bodies (default 8)")
    parser.add_argument("--mib", type=float, default=8.0, help="size of each body (default 8)")
    parser.add_argument("--shape", default="{}", help="the repeated JSON value (default {})")
    parser.add_argument("--threads", type=int, default=4, help="veil serve --threads (default 4)")
    parser.add_argument("--max-body-bytes", type=int, default=None,
                        help="veil serve --max-body-bytes (default: the collector's default)")
    args = parser.parse_args()
    body = hostile_body(args.mib, args.shape)
    options = ["--threads", str(args.threads)]
    if args.max_body_bytes is not None:
        options += ["--max-body-bytes", str(args.max_body_bytes)]
    with tempfile.TemporaryDirectory() as tmp:
        collector = Collector(Path(tmp), REGISTRY, *options)
        try:
            url = collector.url + "/v1/reports"
            warm = requests.post(url, data=b"[]", headers=JSON, timeout=30)
            if warm.status_code != 400:
                raise SystemExit(f"warm-up: expected 400 for [], got {warm.status_code}")
            before = peak_rss_mib(collector.process.pid)
            outcomes: collections.Counter[str] = collections.Counter()
            threads = [threading.Thread(target=post, args=(url, body, outcomes))
                       for _ in range(args.bodies)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            after = peak_rss_mib(collector.process.pid)
        finally:
            collector.stop()
    print(f"{args.bodies} concurrent bodies of {len(body) / 2**20:.2f} MiB of "
          f"[{args.shape},...] (threads {args.threads}, max body "
          f"{args.max_body_bytes or 'default'}): {dict(outcomes)}")
    print(f"peak RSS of veil serve: {before:.0f} MiB after warm-up, {after:.0f} MiB after the bodies")


if __name__ == "__main__":
    main()
