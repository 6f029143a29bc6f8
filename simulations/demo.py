"""``veil demo``: the whole system on this machine in under a minute.

1. A real collector (``veil serve``: waitress, SQLite in a temporary
   directory) starts on 127.0.0.1 on a free port.
2. Thousands of simulated installations each run the real
   :class:`veil.client.Client` with their own state directory: they fetch the
   registry over HTTP, report the sites they visit (a string metric), a
   yes/no setting, a number and the pair of both (a joint metric), and upload
   their randomized reports.
3. The counts are read back over HTTP with the read token and decoded with
   the real analysis; the top strings are printed with 95% intervals next to
   the truth, with the privacy cost of every metric.
4. A plot is written, the collector stopped and the temporary directory removed.

Only the *behaviour* of the simulated users (which sites, which setting) is
drawn from a seeded NumPy generator; every report is randomized by the client
SDK with the operating system's CSPRNG, as in production.

Parameters: a string metric needs a few thousand reports before more than
its top values stand out (standard errors shrink like 1/sqrt(N)). In a
minute this machine pushes a couple of thousand installations through the
real client, so each reports 4 distinct sites (8,000 reports), with RAPPOR's
privacy per value (f = 0.5, epsilon_inf = 4 ln 3) and a small Bloom filter
(k = 64, m = 16 cohorts) suited to a short candidate list.
"""

from __future__ import annotations

import dataclasses
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from veil.client import Client
from veil.server.analysis import DecodeResult, decode_counts
from veil.server.analysis.joint import JointResult
from veil.server.http import fetch_counts
from veil.shared.errors import VeilError
from veil.shared.privacy import format_epsilon, sequential
from veil.shared.registry import Registry
from veil.simulations.demo_config import SESSION_BUCKETS, DemoConfig
from veil.simulations.populations import distribution_weights
from veil.simulations.report import new_figure, progress

SITES = (
    "news.example.com", "mail.example.com", "search.example.org", "video.example.net",
    "shop.example.com", "maps.example.org", "social.example.net", "weather.example.com",
    "sports.example.org", "music.example.net", "wiki.example.org", "travel.example.com",
    "bank.example.com", "games.example.net", "recipes.example.org", "jobs.example.com",
    "photos.example.net", "forum.example.org", "tickets.example.com", "books.example.net",
)
#: candidates nobody visits: a detected decoy would be a false positive
DECOYS = (
    "docs.example.com", "cloud.example.net", "radio.example.org", "cars.example.com",
    "health.example.org", "movies.example.net", "garden.example.com", "pets.example.org",
)
#: how popular the sites are, first to last (``veil populate`` shares categories the same way)
POPULARITY = "zipf1.5"
#: the share of installations whose yes/no setting is on
YES_SHARE = 0.35
READ_TOKEN = "demo-read-token"
SERVER_START_TIMEOUT = 30.0


@dataclasses.dataclass
class Truth:
    """What the simulated users really did."""

    sites: list[list[str]]
    dark_mode: np.ndarray
    minutes: np.ndarray


def popularity(n: int) -> np.ndarray:
    """The shares of ``n`` values ranked by popularity (:data:`POPULARITY`)."""
    return distribution_weights(POPULARITY, n)


def draw_settings(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` installations' yes/no settings, each on with probability :data:`YES_SHARE`."""
    return rng.random(n) < YES_SHARE


def simulate_users(config: DemoConfig) -> Truth:
    """Each installation visits distinct sites (:func:`popularity`), has a setting and a session."""
    rng = np.random.default_rng(config.seed)
    weights = popularity(len(SITES))
    sites = [
        [SITES[i] for i in rng.choice(len(SITES), config.sites_per_installation, replace=False,
                                      p=weights)]
        for _ in range(config.installations)
    ]
    dark = draw_settings(rng, config.installations)
    # dark-mode users run longer sessions: the association dark_by_session shows
    return Truth(sites, dark,
                 np.round(rng.gamma(2.0, np.where(dark, 20.0, 10.0)), 1))


class Collector:
    """A ``veil serve`` process on 127.0.0.1 with a free port (stopped by :meth:`stop`).

    It serves ``registry`` from ``db`` (a storage URL), by default ``workdir/veil.db`` (used
    as it is when it exists), reads
    counts with :data:`READ_TOKEN` and logs to ``workdir/collector.log``; ``options`` are
    further ``veil serve`` options (``"--threads", "4"``).
    """

    def __init__(self, workdir: Path, registry: Registry, *options: str,
                 db: str | None = None) -> None:
        config = workdir / "metrics.toml"
        config.write_text(registry.to_toml(), encoding="utf-8")
        self.log = workdir / "collector.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "veil.server.cli", "serve", "--config", str(config),
                 "--db", db or str(workdir / "veil.db"), "--host", "127.0.0.1", "--port", "0",
                 "--read-token", READ_TOKEN, *options],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )
        self.url = self._wait_for_address()

    def _wait_for_address(self) -> str:
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if selector.select(timeout=0.5):
                line = self.process.stdout.readline()
                if "listening on" in line:
                    return line.split()[-1]
                if not line:
                    break
        self.stop()
        raise VeilError(f"the collector did not start; its log says:\n{self.log.read_text()}")

    def stop(self) -> None:
        """SIGTERM (a clean stop), then SIGKILL if it does not exit in 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def run_installation(
    url: str, state_dir: Path, sites: list[str], dark: bool, minutes: float
) -> dict[str, Any]:
    """One installation: the real client reports its values and uploads them."""
    with Client(url, state_dir, timeout=30.0) as client:
        for site in sites:
            client.report("homepage", site)
        client.report("dark_mode", bool(dark))
        client.report("session_minutes", float(minutes))
        client.report("dark_by_session",
                      {"session_minutes": float(minutes), "dark_mode": bool(dark)})
        result = client.flush(timeout=60.0)
        spent = client.privacy_spent()
    if not result.ok or result.accepted != len(sites) + 3:
        raise VeilError(f"an installation's upload failed: {result}")
    return {"accepted": result.accepted, "epsilon": spent.total, "per_metric": spent.per_metric}


def _interval(row: dict[str, Any], total: int) -> str:
    return f"[{row['prop_low_95'] * total:7.0f}, {row['prop_high_95'] * total:7.0f}]"


@dataclasses.dataclass
class Collected:
    """What the installations sent: each metric's counts document, read back over HTTP,
    and what came of each installation's upload."""

    documents: dict[str, dict[str, Any]]
    outcomes: list[dict[str, Any]]
    upload_seconds: float
    workdir: Path


def collect(config: DemoConfig, registry: Registry, truth: Truth) -> Collected:
    """Start a collector in a temporary directory, let every installation report through
    the real client, read the counts back with the read token, then stop the collector
    and remove the directory."""
    workdir = Path(tempfile.mkdtemp(prefix="veil-demo-", dir=config.temp_root))
    collector = None
    try:
        collector = Collector(workdir, registry)
        print(f"collector (veil serve, SQLite in {workdir}) on {collector.url}")
        upload_start = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=config.workers)
        try:
            futures = [
                pool.submit(run_installation, collector.url, workdir / "installations" / f"{i:05d}",
                            truth.sites[i], truth.dark_mode[i], truth.minutes[i])
                for i in range(config.installations)
            ]
            outcomes = [f.result() for f in progress(futures, "installations", len(futures))]
        finally:
            # on a failure, do not start the installations still waiting
            pool.shutdown(wait=True, cancel_futures=True)
        upload_seconds = time.perf_counter() - upload_start
        accepted = sum(o["accepted"] for o in outcomes)
        print(f"{config.installations} installations used the real client: {accepted} reports "
              f"accepted in {upload_seconds:.1f} s ({config.installations / upload_seconds:.0f} "
              "installations/s, each with its own state directory and outbox)")
        documents = {name: fetch_counts(collector.url, READ_TOKEN, name, timeout=30.0)
                     for name in registry}
    finally:
        if collector is not None:
            collector.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return Collected(documents, outcomes, upload_seconds, workdir)


def print_estimates(config: DemoConfig, truth: Truth, documents: dict[str, dict[str, Any]],
                    ) -> tuple[DecodeResult, list[str], Counter[str]]:
    """Decode every metric with the real analysis and print the estimates beside the truth;
    return the string metric's result, the strings detected and the true counts."""
    decode_start = time.perf_counter()
    strings = decode_counts(documents["homepage"], candidates=list(SITES + DECOYS))
    dark = decode_counts(documents["dark_mode"])
    minutes = decode_counts(documents["session_minutes"])
    decode_seconds = time.perf_counter() - decode_start

    true_counts = Counter(site for sites in truth.sites for site in sites)
    total = int(documents["homepage"]["reports"])
    print()
    print(f"Top strings of 'homepage' ({total} reports, {len(SITES) + len(DECOYS)} candidates, "
          f"decoded in {decode_seconds:.2f} s):")
    print(f"  {'string':<22}{'estimate':>9}  {'95% interval':<18}{'truth':>7}")
    detected = []
    for row in strings.rows:
        detected.append(row["string"])
        mark = ("" if row["string"] in true_counts
                else "   <- a decoy nobody reported: a false positive (see the chart's note)")
        print(f"  {row['string']:<22}{row['estimate']:9.0f}  {_interval(row, total):<18}"
              f"{true_counts.get(row['string'], 0):7d}{mark}")
    missed = [s for s, _ in true_counts.most_common() if s not in detected]
    smallest = strings.summary.get("min_detectable_proportion")
    if missed:
        largest_missed = true_counts[missed[0]] / total
        print(f"  not detected: {len(missed)} rarer true strings (the largest holds "
              f"{largest_missed:.1%} of reports; about {smallest:.1%} is needed at these "
              "parameters and N)")
    yes = next(r for r in dark.rows if r["value"] == "true")
    mean = minutes.rows[0]
    print(f"dark_mode: {yes['proportion']:.1%} yes, 95% interval [{yes['prop_low_95']:.1%}, "
          f"{yes['prop_high_95']:.1%}]; truth {truth.dark_mode.mean():.1%}")
    print(f"session_minutes: mean {mean['estimate']:.1f}, 95% interval [{mean['low_95']:.1f}, "
          f"{mean['high_95']:.1f}]; truth {np.clip(truth.minutes, 0, 120).mean():.1f}")
    print_association(truth, decode_counts(documents["dark_by_session"]))
    return strings, detected, true_counts


def print_association(truth: Truth, joint: DecodeResult) -> None:
    """The joint metric: the dark-mode share by session length, beside the truth, and the
    test of independence."""
    buckets = np.digitize(np.clip(truth.minutes, 0, 120), SESSION_BUCKETS[1:-1])
    test = joint.summary["independence"]
    print(f"dark_by_session (one joint report each): dark mode by session length, "
          f"independence test p = {test['p_value']:.2g}")
    assert isinstance(joint, JointResult)
    rows = [row for row in joint.conditional_rows if row["value"] == "true"]
    for index, row in enumerate(rows):
        held = truth.dark_mode[buckets == index]
        share = f"{held.mean():.0%}" if held.size else "n/a"
        print(f"  {row['given']:<34} {row['conditional']:6.1%}  [{row['low_95']:.0%}, "
              f"{row['high_95']:.0%}]  truth {share}")


def print_privacy(config: DemoConfig, registry: Registry, spent: float) -> None:
    """Each metric's privacy cost, and what one installation's ledger says it spent."""
    print()
    print("Privacy cost (worst case, per installation; lower is more private):")
    for name, metric in registry.items():
        print(f"  {name:<16} {metric.kind:<8} epsilon_1 = {format_epsilon(metric.params.epsilon_1):>5} "
              f"per report, epsilon_inf = {format_epsilon(metric.params.epsilon_inf):>5} per "
              "distinct value, however often reported")
    # each distinct value reported costs epsilon_inf (privacy_map of its values), metrics add up
    values_reported = {"homepage": config.sites_per_installation}
    bound = sequential(metric.params.privacy_map(values_reported.get(name, 1))
                       for name, metric in registry.items())
    print(f"  one installation's ledger: epsilon = {format_epsilon(spent)} in total (sequential "
          f"composition: {config.sites_per_installation} sites, 1 setting, 1 number and 1 pair, each "
          f"reported once so far); reporting the same values again, however often, costs at most "
          f"{format_epsilon(bound)} (epsilons rounded up)")


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the demo end to end; print the tables; return the figures for tests."""
    started = time.perf_counter()
    registry = config.registry()
    truth = simulate_users(config)
    collected = collect(config, registry, truth)
    strings, detected, true_counts = print_estimates(config, truth, collected.documents)
    total = int(collected.documents["homepage"]["reports"])
    print_privacy(config, registry, collected.outcomes[0]["epsilon"])

    config.out.mkdir(parents=True, exist_ok=True)
    plot = config.out / "demo.png"
    _plot(strings.rows, true_counts, total, plot)
    strings.write_csv(config.out / "homepage_results.csv")
    elapsed = time.perf_counter() - started
    print()
    print(f"Plot: {plot.resolve()}; decoded table: "
          f"{(config.out / 'homepage_results.csv').resolve()}")
    print(f"Why these parameters: {config.installations} installations x "
          f"{config.sites_per_installation} sites = {total} string reports is what the real client "
          "pushes through HTTP here in well under a minute; RAPPOR's per-value privacy (f=0.5) "
          f"with k={config.k}, m={config.m} then detects the popular sites. More installations "
          "(--installations) detect rarer ones; smaller f or larger q-p trades privacy for accuracy.")
    print(f"Demo finished in {elapsed:.1f} s; temporary files removed.")
    return {
        "detected": detected, "truth": true_counts, "reports": total, "elapsed": elapsed,
        "workdir": collected.workdir, "plot": plot, "upload_seconds": collected.upload_seconds,
    }


def _plot(rows: list[dict[str, Any]], truth: Counter[str], total: int, path: Path) -> None:
    """Detected strings: estimates with 95% intervals, and the truth; a detected decoy (a
    candidate nobody reported) in its own colour, with a note on why it can be detected."""
    shown = rows[:15]
    figure = new_figure(6.4, max(2.5, 0.35 * len(shown) + 1.9))
    axis = figure.subplots()
    y = np.arange(len(shown))[::-1]
    estimates = np.array([r["estimate"] for r in shown])
    low = np.array([r["prop_low_95"] * total for r in shown])
    high = np.array([r["prop_high_95"] * total for r in shown])
    decoy = np.array([r["string"] not in truth for r in shown], dtype=bool)
    axis.barh(y[~decoy], estimates[~decoy], color="#56B4E9", label="estimate")
    if decoy.any():
        axis.barh(y[decoy], estimates[decoy], color="#E69F00", hatch="//",
                  label="estimate of a decoy\n(nobody reported it)")
    axis.errorbar(estimates, y, xerr=[estimates - low, high - estimates], fmt="none", ecolor="k",
                  capsize=3, label="95% interval")
    axis.plot([truth.get(r["string"], 0) for r in shown], y, "D", color="#D55E00", label="truth")
    axis.set_yticks(y, [r["string"] for r in shown], fontsize=8)
    axis.set(xlabel="reports", title=f"veil demo: detected sites ({total} reports)")
    axis.legend(fontsize=8, loc="lower right")
    if decoy.any():
        figure.text(0.01, 0.005, "A decoy is detected when the Bloom bits it shares with reported "
                    "sites carry their reports:\nthe regression cannot tell them apart with "
                    "this few bits (k), and its interval counts only the reports' noise.",
                    fontsize=7, va="bottom", ha="left")
        figure.get_layout_engine().set(rect=(0, 0.06, 1, 0.94))
    figure.savefig(path, dpi=100)
