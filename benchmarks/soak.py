"""Soak the collector with hostile requests, genuine uploads and SIGKILLs; check nothing is lost.

A real ``veil serve`` (2 worker processes) on 127.0.0.1 receives, from several
threads at once:

* hostile requests: mutations of a genuine batch (bytes flipped, cut, repeated;
  fields of the wrong type, huge or negative numbers, deep nesting, duplicate
  keys, invalid UTF-8, forged payloads), wrong methods, content types, paths and
  query strings, oversized headers and bodies;
* genuine uploads of batches of real encoded reports (string, boolean, number),
  each retried until the collector acknowledges it (the SDK's contract).

Meanwhile the whole server (every process of its group) is SIGKILLed at random
moments and started again on the same port. At the end the database is read
directly: every acknowledged report must be stored exactly once, no report twice,
and the aggregates must equal a recount from the raw reports.

Printed: requests sent, answers by status class, 5xx (target 0), acknowledged
reports lost (target 0), reports stored twice (target 0), aggregates off a
recount (target 0), and the peak resident memory of any server process.
Everything runs on loopback; loops are bounded in count and in time.

    python benchmarks/soak.py                       # 100,000 hostile requests, 10 kills
    python benchmarks/soak.py --requests 20000 --kills 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from veil.client.encoders import make_encoder
from veil.server.storage import open_storage
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report

REGISTRY = Registry.from_toml("""
version = 1

[metrics.homepage]
kind = "string"
min_reports = 1
k = 64
h = 2
m = 8

[metrics.dark_mode]
kind = "boolean"
min_reports = 1

[metrics.load_time]
kind = "number"
min_reports = 1
low = 0
high = 10
mechanism = "laplace"
epsilon = 1.0
""")
READ_TOKEN = "soak-read-token"
VALUES = {"homepage": ["a.example", "b.example", "c.example"], "dark_mode": [True, False],
          "load_time": [1.5, 4.0, 9.0]}


def genuine_reports(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` reports encoded by the SDK's encoders, each from its own installation."""
    out = []
    for _ in range(n):
        name = rng.choice(list(VALUES))
        metric = REGISTRY[name]
        encoder = make_encoder(metric, rng.randbytes(32), rng.randrange(1 << 30))
        out.append(make_report(rng.randbytes(16).hex(), name, encoder.cohort,
                               encoder.encode(rng.choice(VALUES[name])), metric.params.fingerprint))
    return out


def mutate(rng: random.Random, body: bytes) -> bytes:
    """One hostile variation of a genuine batch body."""
    choice = rng.randrange(12)
    data = bytearray(body)
    if choice == 0:  # flip random bytes
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice == 1:  # cut
        return bytes(data[: rng.randrange(len(data))])
    if choice == 2:  # repeat a slice
        start = rng.randrange(len(data))
        return bytes(data[:start] + data[start:] * rng.randint(2, 4))
    if choice == 3:  # deep nesting
        depth = rng.choice([100, 1000, 100_000])
        return b"[" * depth + b"]" * depth
    if choice == 4:  # duplicate keys
        return body.replace(b'"version":2', b'"version":2,"version":2', 1)
    if choice == 5:  # invalid UTF-8
        return body[:20] + b"\xff\xfe" + body[20:]
    batch = json.loads(body)
    report = rng.choice(batch["reports"])
    if choice == 6:  # forged payloads
        report["payload"] = rng.choice([1e300, -1e308, 10**200, "ff" * 9, "zz", [], {}, None, 2])
    elif choice == 7:  # wrong types everywhere
        key = rng.choice(["id", "metric", "params", "cohort", "version", "batch_id"])
        target = batch if key in ("version", "batch_id") else report
        target[key] = rng.choice([None, 1.5, -1, "x" * 40, [1], {"a": 1}, True, 10**400])
    elif choice == 8:  # a field no report has
        report[rng.choice(["value", "ip", "device", "timestamp"])] = "x"
    elif choice == 9:  # many empty objects: parse cost without reports
        return b'{"version":2,"batch_id":"' + b"a" * 32 + b'","reports":[' + b",".join(
            [b"{}"] * rng.choice([10, 1000, 50_000])) + b"]}"
    elif choice == 10:  # huge integer literals
        return body.replace(b'"version":2', b'"version":' + b"9" * rng.choice([100, 5000]), 1)
    else:  # replay a genuine batch under another batch id: its reports are duplicates
        batch["batch_id"] = rng.randbytes(16).hex()
    return json.dumps(batch).encode()


class Server:
    """``veil serve`` in its own process group, killed whole and restarted on one port."""

    def __init__(self, workdir: Path, port: int, workers: int) -> None:
        config = workdir / "metrics.toml"
        config.write_text(REGISTRY.to_toml(), encoding="utf-8")
        self.db = workdir / "veil.db"
        self.command = [sys.executable, "-m", "veil.server.cli", "serve", "--config", str(config),
                        "--db", str(self.db), "--host", "127.0.0.1", "--port", str(port),
                        "--workers", str(workers), "--read-token", READ_TOKEN]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(workdir / "serve.log", "ab")  # noqa: SIM115 (kept open across restarts)
        self.process: subprocess.Popen[bytes] | None = None
        self.peak_rss_kib = 0
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=self.log,
                                        start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError("veil serve did not become ready; see serve.log")

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(30)
        self.log.close()

    def sample_memory(self) -> None:
        """Record the peak resident set (VmHWM) of every process of the server's group."""
        if self.process is None:
            return
        group = self.process.pid
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != group:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))
            except (OSError, ProcessLookupError):
                continue


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="hostile requests to send")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of the whole server")
    parser.add_argument("--workers", type=int, default=2, help="veil serve worker processes")
    parser.add_argument("--hostile-threads", type=int, default=4)
    parser.add_argument("--uploaders", type=int, default=2, help="genuine uploader threads")
    parser.add_argument("--max-seconds", type=float, default=1800, help="stop sending after this")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="veil-soak-"))
    server = Server(workdir, free_port(), args.workers)
    statuses: Counter[str] = Counter()
    five_xx: Counter[str] = Counter()
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    sent = [0]
    deadline = time.monotonic() + args.max_seconds
    templates = [json.dumps(make_batch(random.Random(i).randbytes(16).hex(),
                                       genuine_reports(random.Random(i), 20))).encode()
                 for i in range(50)]

    def record(what: str, status: int | None, kind: str) -> None:
        with lock:
            statuses[what] += 1
            if status is not None and status >= 500:
                five_xx[f"{status} {kind}"] += 1

    def hostile(seed: int) -> None:
        rng = random.Random(seed)
        with requests.Session() as session:
            while not stop.is_set() and time.monotonic() < deadline:
                with lock:
                    if sent[0] >= args.requests:
                        return
                    sent[0] += 1
                kind = rng.choice(["body"] * 6 + ["method", "path", "headers", "counts"])
                try:
                    if kind == "body":
                        response = session.post(
                            server.url + "/v1/reports", data=mutate(rng, rng.choice(templates)),
                            headers={"Content-Type": rng.choice(
                                ["application/json"] * 5 + ["text/plain", "application/json; charset=latin-1"])},
                            timeout=30)
                    elif kind == "method":
                        response = session.request(rng.choice(["PUT", "DELETE", "PATCH", "GET"]),
                                                   server.url + "/v1/reports", timeout=30)
                    elif kind == "path":
                        path = rng.choice(["/v1/metrics/%00/counts", "/v1/../etc/passwd", "/" + "a" * 5000,
                                           "/v1/metrics/homepage/counts/extra", "/v1/reports?x=1"])
                        response = session.get(server.url + path, timeout=30)
                    elif kind == "headers":
                        response = session.post(server.url + "/v1/reports", data=b"{}", timeout=30,
                                                headers={"Content-Type": "application/json",
                                                         "X-Junk": "x" * rng.choice([10, 100_000]),
                                                         "Authorization": "Bearer " + "\u00e9" * 3})
                    else:
                        query = rng.choice(["start=2026-13-01", "end=x", "format=xml", "start=2030-01-01&end=2020-01-01",
                                            "start=" + "9" * 500, "zz=1"])
                        response = session.get(server.url + "/v1/metrics/homepage/counts?" + query,
                                               headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=30)
                    record(f"{response.status_code // 100}xx", response.status_code, kind)
                except requests.RequestException as exc:
                    record(f"no answer to a {kind} request ({type(exc).__name__})", None, kind)

    def upload(seed: int) -> None:
        rng = random.Random(seed)
        with requests.Session() as session:
            while not stop.is_set() and time.monotonic() < deadline:
                reports = genuine_reports(rng, 50)
                body = make_batch(rng.randbytes(16).hex(), reports)
                for _attempt in range(200):  # retried until acknowledged, as the SDK does
                    try:
                        response = session.post(server.url + "/v1/reports", json=body, timeout=30)
                    except requests.RequestException:
                        time.sleep(0.1)
                        continue
                    if response.status_code >= 500:
                        record(f"{response.status_code // 100}xx", response.status_code, "genuine")
                        time.sleep(0.1)
                        continue
                    answer = response.json()
                    if response.status_code == 200 and answer["rejected"] == 0:
                        with lock:
                            acknowledged.extend(report["id"] for report in reports)
                    else:
                        print(f"genuine batch answered {response.status_code}: {answer}", file=sys.stderr)
                    break
                if stop.is_set():
                    return

    def killer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(args.kills):
            if stop.wait(rng.uniform(1.0, 6.0)):
                return
            server.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            server.start()

    started = time.monotonic()
    threads = ([threading.Thread(target=hostile, args=(args.seed * 1000 + i,))
                for i in range(args.hostile_threads)]
               + [threading.Thread(target=upload, args=(args.seed * 2000 + i,))
                  for i in range(args.uploaders)])
    for thread in threads:
        thread.start()
    kill_thread = threading.Thread(target=killer, args=(args.seed,))
    kill_thread.start()
    while any(t.is_alive() for t in threads[: args.hostile_threads]):
        server.sample_memory()
        time.sleep(0.5)
    stop.set()
    for thread in [*threads, kill_thread]:
        thread.join(120)
    elapsed = time.monotonic() - started
    server.sample_memory()
    server.stop()

    with sqlite3.connect(server.db) as conn:
        stored = Counter(row[0].hex() for row in conn.execute("SELECT id FROM reports"))
    lost = [report_id for report_id in acknowledged if report_id not in stored]
    twice = [report_id for report_id, count in stored.items() if count > 1]
    with open_storage(server.db) as storage:
        before = {name: storage.counts(name, min_reports=0) for name in VALUES}
        storage.rebuild_aggregates()
        recount = {name: storage.counts(name, min_reports=0) for name in VALUES}
    drifted = [name for name in VALUES if before[name] != recount[name]]

    print(f"soak: {sent[0]:,} hostile requests and {len(acknowledged):,} acknowledged genuine "
          f"reports in {elapsed:.0f} s; {args.kills} SIGKILLs of the whole server "
          f"({args.workers} workers)")
    for what, count in sorted(statuses.items()):
        print(f"  {what:52s} {count:>9,}")
    print(f"  5xx answers (target 0): {sum(five_xx.values())} {dict(five_xx) or ''}")
    print(f"  acknowledged reports lost (target 0): {len(lost)}")
    print(f"  reports stored twice (target 0): {len(twice)}")
    print(f"  metrics whose aggregates differ from a recount (target 0): {len(drifted)} {drifted or ''}")
    print(f"  peak resident memory of a server process: {server.peak_rss_kib / 1024:.0f} MiB")
    print(f"  work directory: {workdir}")
    return 0 if not (five_xx or lost or twice or drifted) else 1


if __name__ == "__main__":
    sys.exit(main())
