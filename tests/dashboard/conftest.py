"""A collector filled for the dashboard's tests: past days written into its SQLite store
(the simulations' encoders, the wire's validation, ``Storage.insert`` under each day), then
``veil serve`` started on it and today's reports uploaded by ``veil populate``, as a person
trying Veil would. The dashboard under test is a real ``veil dashboard`` process."""

from __future__ import annotations

import datetime as dt
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.conftest import CollectorHandle, wait_until
from veil.shared.registry import Registry

DASHBOARD_REGISTRY_TOML = """\
version = 1

[metrics.homepage]
kind = "string"
description = "home page host"
min_reports = 200
k = 64
h = 2
m = 8
p = 0.25
q = 0.75
f = 0.25

[metrics.homepage.discovery]
min_reports = 100
share = 0.5
max_length = 20
segment = 1
fingerprint_bits = 4

[metrics.browser]
kind = "category"
description = "browser in use"
min_reports = 200
oracle = "auto"
epsilon = 4.0
categories = ["chrome", "firefox", "safari", "edge", "other"]

[metrics.dark_mode]
kind = "boolean"
description = "dark mode on"
min_reports = 200
alpha = 0.75

[metrics.browser_dark]
kind = "joint"
description = "browser and dark mode, reported together"
min_reports = 200
of = ["browser", "dark_mode"]
epsilon = 4.0

[metrics.load_seconds]
kind = "number"
description = "page load time"
min_reports = 200
low = 0.0
high = 10.0
mechanism = "1bitmean"
epsilon = 2.0
"""
#: installations per past day and for today's ``veil populate``
DAILY_INSTALLATIONS = 1500
PAST_DAYS = 4
START_TIMEOUT = 60.0


def fill_past_days(db: Path, registry: Registry, days: int = PAST_DAYS,
                   installations: int = DAILY_INSTALLATIONS, seed: int = 7) -> list[str]:
    """Write ``installations`` simulated reports of every metric under each of the ``days``
    days before today into the store at ``db`` (created); the days written, oldest first."""
    from veil.server.storage import open_storage
    from veil.shared.wire import make_batch, make_report, validate_batch
    from veil.simulations.encoders import SIMULATORS
    from veil.simulations.populate import draw_population

    rng = np.random.default_rng(seed)
    today = dt.datetime.now(dt.UTC).date()
    written = []
    with open_storage(str(db), registry, create=True) as storage:
        for back in range(days, 0, -1):
            day = (today - dt.timedelta(days=back)).isoformat()
            for name, metric in registry.items():
                values, _ = draw_population(metric.params, rng, installations)
                simulated = SIMULATORS[metric.params.mechanism_name](metric.params, values, rng)
                cohorts = simulated.cohorts.tolist() if metric.params.has_cohorts else None
                reports = [make_report(os.urandom(16).hex(), name,
                                       None if cohorts is None else cohorts[i],
                                       simulated.payloads[i], metric.params.fingerprint)
                           for i in range(installations)]
                batch = validate_batch(make_batch(os.urandom(16).hex(), reports), registry)
                assert not batch.errors, batch.errors[:3]
                storage.insert(batch.reports, day=day)
            written.append(day)
    return written


def populate(url: str, candidates: Path, installations: int = DAILY_INSTALLATIONS) -> None:
    """``veil populate`` against the collector at ``url``, writing the candidates."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    subprocess.run([sys.executable, "-m", "veil.server.cli", "populate", "--server", url,
                    "--installations", str(installations), "--candidates-out", str(candidates)],
                   check=True, capture_output=True, text=True, env=env, timeout=300)


class DashboardProcess:
    """A ``veil dashboard`` process: its URL and how to stop it."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "veil.server.cli", "dashboard", "--host", "127.0.0.1",
                   "--port", "0", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env)
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT)
        line = self.process.stdout.readline() if readable else ""
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"veil dashboard did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1].strip().rstrip("/")
        wait_until(lambda: requests.get(self.url + "/signin", timeout=5).ok,
                   "the dashboard to answer")

    def stop(self) -> int:
        """SIGTERM, then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()
        return int(self.process.returncode)


@pytest.fixture(scope="session")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A collector with :data:`PAST_DAYS` past days in its store and today's reports from
    ``veil populate``; its candidates directory holds ``homepage.txt``. Yields the handle,
    the token, the days and the directories."""
    workdir = tmp_path_factory.mktemp("dashboard")
    registry = Registry.from_toml(DASHBOARD_REGISTRY_TOML)
    days = fill_past_days(workdir / "veil.db", registry)
    collector = CollectorHandle(workdir, registry)
    collector.start()
    candidates = workdir / "candidates"
    candidates.mkdir()
    try:
        populate(collector.url, candidates / "homepage.txt")
        yield {"collector": collector, "token": collector.token, "registry": registry,
               "days": [*days, dt.datetime.now(dt.UTC).date().isoformat()],
               "candidates": candidates, "workdir": workdir}
    finally:
        collector.stop()


@pytest.fixture(scope="session")
def dashboard(filled: dict[str, Any]) -> Iterator[DashboardProcess]:
    """``veil dashboard --server`` on the filled collector, with its read token."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    process = DashboardProcess(["--server", filled["collector"].url, "--token", filled["token"],
                                "--read-token", filled["token"],
                                "--candidates", str(filled["candidates"])], env)
    yield process
    process.stop()


@pytest.fixture
def signed_in(dashboard: DashboardProcess, filled: dict[str, Any]) -> Callable[..., Any]:
    """GET a dashboard path with the read token as a bearer header."""

    def get(path: str, **params: Any) -> requests.Response:
        return requests.get(dashboard.url + path, params=params, timeout=60,
                            headers={"Authorization": f"Bearer {filled['token']}"})

    return get
