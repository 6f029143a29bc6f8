"""Shared fixtures: a real Veil collector on 127.0.0.1 with a temporary SQLite file, and a
throwaway PostgreSQL server.

``collector``         a ``veil serve`` subprocess (waitress), started fresh per test.
``collector_factory`` the same with options: ``collector_factory(upload_token="u", threads=2,
                      workers=2, registry=Registry(...), max_reports=10)``; any other
                      ``veil serve`` arguments as ``serve_args=["--connection-limit", "8"]``,
                      environment variables as ``env={"VEIL_UPLOAD_TOKEN": "u"}``.
``test_registry``     :data:`TEST_REGISTRY` (the registry both collectors serve).
``live_collector``    the same API served in-process by a werkzeug server thread (faster to start,
                      no kill/restart); still real HTTP on loopback.
``app_factory``       ``app_factory(**settings)``: collector apps in-process (no HTTP server) with
                      :data:`TEST_REGISTRY`, a read token and their own SQLite file in
                      ``tmp_path``; settings override :mod:`veil.server.collector.config`.
``recording_transport`` a client transport that keeps what it is sent (no network).
``offline_url``       a loopback URL where nothing listens.
``postgres_server``   (session) a :class:`~tests.postgres_server.PostgresServer`: a throwaway
                      PostgreSQL server started for the run, or the one ``$VEIL_TEST_POSTGRES``
                      names; ``stop()``/``start()`` take a throwaway one down and up again.
                      Without a server the tests that use it are skipped, saying how to get one
                      (``apt-get install postgresql``); with ``$CI`` set they fail instead.
``postgres_url``      a fresh empty database on that server per test
                      (``postgresql://postgres@127.0.0.1:PORT/veil_test_...``), dropped after it.

For API semantics without HTTP, ``tests/server/conftest.py`` has ``app`` and ``client``
(Flask's test client).

Each yields a :class:`CollectorHandle`::

    def test_upload(collector):
        requests.post(collector.url + "/v1/reports", json=batch, timeout=10)
        document = collector.counts("homepage")          # GET .../counts with the read token
        collector.kill(); collector.start()              # SIGKILL, then restart on the same port

Attributes: ``url`` (``http://127.0.0.1:PORT``, no trailing slash), ``token`` (read token),
``upload_token`` (``None`` unless asked), ``db`` (what ``--db`` names: ``db_path``, a SQLite
file in ``workdir``, unless ``collector_factory(db=postgres_url)``), ``registry`` (a
:class:`~veil.shared.registry.Registry`), ``registry_path`` (its TOML file), ``workdir``
(where those files and ``serve.log``, the server's stderr, are).
``veil serve`` runs without the test run's ``VEIL_*`` variables, with ``env`` added; a
``VEIL_READ_TOKEN`` or ``VEIL_UPLOAD_TOKEN`` in ``env`` is the handle's ``token`` or
``upload_token`` and reaches the server through the environment only.
Methods: ``start()``, ``stop()`` (SIGTERM, clean), ``kill()`` (SIGKILL), ``restart()``,
``counts(metric, **query)`` and ``headers()`` (the read token's Authorization header).

:data:`TEST_REGISTRY` has one metric of every kind, all with ``min_reports = 1`` except
``rare`` (``min_reports = 50``).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.postgres_server import PostgresServer, PostgresUnavailable, server_for_tests
from veil.client import Transport
from veil.client.transport import Outcome
from veil.shared.registry import Registry

TEST_REGISTRY_TOML = """\
version = 1

[metrics.homepage]
kind = "string"
description = "home page host"
min_reports = 1
k = 32
h = 2
m = 4
p = 0.5
q = 0.75
f = 0.5

[metrics.browser]
kind = "category"
min_reports = 1
categories = ["firefox", "chrome", "safari", "other"]

[metrics.dark_mode]
kind = "boolean"
min_reports = 1

[metrics.load_time]
kind = "number"
min_reports = 1
low = 0.0
high = 10.0
mechanism = "laplace"
epsilon = 1.0

[metrics.battery]
kind = "number"
min_reports = 1
low = 0.0
high = 100.0
mechanism = "1bitmean"
epsilon = 1.0

[metrics.latency]
kind = "number"
min_reports = 1
low = 0.0
high = 1.0
mechanism = "gaussian"
epsilon = 1.0
delta = 1e-6

[metrics.rare]
kind = "string"
min_reports = 50
k = 16
h = 2
m = 2
"""
TEST_REGISTRY = Registry.from_toml(TEST_REGISTRY_TOML)
#: seconds a collector may take to print where it listens, and then to answer /readyz
START_TIMEOUT = 60.0


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until it returns a true value, and return that value; fail naming
    ``what`` once ``timeout`` seconds pass. Tests wait for the state they need this way, not
    for a fixed time: as short as the machine allows, and no flakiness when it is slow."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)
    return value


class CollectorHandle:
    """A collector under test: where it listens, its credentials, and its lifecycle."""

    def __init__(self, workdir: Path, registry: Registry, *, db: str | None = None,
                 upload_token: str | None = None, threads: int = 4, workers: int = 1,
                 max_reports: int | None = None, max_body_bytes: int | None = None,
                 recent_ids_limit: int | None = None,
                 serve_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.registry = registry
        self.registry_path = workdir / "metrics.toml"
        self.registry_path.write_text(registry.to_toml(), encoding="utf-8")
        self.db_path = workdir / "veil.db"
        self.db = db or str(self.db_path)
        self.env = dict(env or {})
        self.token = self.env.get("VEIL_READ_TOKEN") or secrets.token_hex(16)
        self.upload_token = upload_token or self.env.get("VEIL_UPLOAD_TOKEN")
        self.threads = threads
        self.workers = workers
        self.max_reports = max_reports
        self.max_body_bytes = max_body_bytes
        self.recent_ids_limit = recent_ids_limit
        self.serve_args = list(serve_args)
        self.port = 0
        self.url = ""
        self.process: subprocess.Popen[str] | None = None
        self._stop_thread: Callable[[], None] | None = None

    def command(self) -> list[str]:
        """The ``veil serve`` command line (port 0 on first start, then the same port)."""
        cmd = [sys.executable, "-m", "veil.server.cli", "serve",
               "--config", str(self.registry_path), "--db", self.db,
               "--host", "127.0.0.1", "--port", str(self.port), "--threads", str(self.threads)]
        if "VEIL_READ_TOKEN" not in self.env:
            cmd += ["--read-token", self.token]
        if self.workers != 1:
            cmd += ["--workers", str(self.workers)]
        if self.upload_token and "VEIL_UPLOAD_TOKEN" not in self.env:
            cmd += ["--upload-token", self.upload_token]
        if self.max_reports:
            cmd += ["--max-reports", str(self.max_reports)]
        if self.max_body_bytes:
            cmd += ["--max-body-bytes", str(self.max_body_bytes)]
        if self.recent_ids_limit:
            cmd += ["--recent-ids-limit", str(self.recent_ids_limit)]
        return cmd + self.serve_args

    def start(self) -> None:
        """Start ``veil serve`` and wait until it prints its URL and answers /readyz;
        :class:`RuntimeError` with its exit code and what it printed if it does not."""
        assert self.process is None, "already running"
        env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
        env.update(self.env, PYTHONUNBUFFERED="1")
        log_path = self.workdir / "serve.log"
        with log_path.open("a") as log:
            process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log,
                                       text=True, env=env)
        self.process = process
        line = _first_line(process, START_TIMEOUT)
        if "listening on " not in line:
            try:
                code = process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            if process.stdout:
                process.stdout.close()
            self.process = None
            raise RuntimeError(f"veil serve did not start (exit code {code}) and printed "
                               f"{line!r}; see {log_path}")
        self.url = line.rsplit(" ", 1)[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if requests.get(self.url + "/readyz", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("collector did not become ready")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Clean shutdown with SIGTERM; returns the exit code (``None`` if not running)."""
        if self._stop_thread is not None:
            self._stop_thread()
            self._stop_thread = None
            return 0
        process, self.process = self.process, None
        if process is None:
            return None
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        finally:
            if process.stdout:
                process.stdout.close()

    def kill(self) -> None:
        """SIGKILL the server process, as a crash would."""
        process, self.process = self.process, None
        assert process is not None, "not running"
        process.kill()
        process.wait()
        if process.stdout:
            process.stdout.close()

    def restart(self) -> None:
        """Stop cleanly, then start again on the same port with the same database."""
        self.stop()
        self.start()

    def headers(self) -> dict[str, str]:
        """The Authorization header carrying the read token."""
        return {"Authorization": f"Bearer {self.token}"}

    def counts(self, metric: str, **query: str) -> dict[str, Any]:
        """GET the counts document of ``metric`` (raises for a non-200 answer)."""
        response = requests.get(f"{self.url}/v1/metrics/{metric}/counts", params=query,
                                headers=self.headers(), timeout=30)
        response.raise_for_status()
        return response.json()


def _first_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The first line ``process`` prints to its stdout pipe: ``""`` if it exits first or prints
    nothing within ``timeout`` seconds. ``veil serve`` prints one line, whole, once it listens."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline() if readable else ""


@pytest.fixture
def test_registry() -> Registry:
    """:data:`TEST_REGISTRY`: one metric of every kind."""
    return TEST_REGISTRY


@pytest.fixture
def collector_factory(tmp_path: Path) -> Iterator[Callable[..., CollectorHandle]]:
    """Start ``veil serve`` processes with options; all are stopped after the test."""
    handles: list[CollectorHandle] = []

    def make(registry: Registry = TEST_REGISTRY, **options: Any) -> CollectorHandle:
        workdir = tmp_path / f"collector{len(handles)}"
        workdir.mkdir()
        handle = CollectorHandle(workdir, registry, **options)
        handles.append(handle)
        handle.start()
        return handle

    yield make
    for handle in handles:
        if handle.process is not None:
            handle.process.kill()
            handle.process.wait()
            if handle.process.stdout:
                handle.process.stdout.close()
            handle.process = None


@pytest.fixture
def collector(collector_factory: Callable[..., CollectorHandle]) -> CollectorHandle:
    """A running ``veil serve`` with :data:`TEST_REGISTRY`, a read token and open uploads."""
    return collector_factory()


@pytest.fixture
def app_factory(tmp_path: Path, test_registry: Registry) -> Iterator[Callable[..., Any]]:
    """Build collector apps (``create_app``, ``TESTING`` on) on SQLite files in ``tmp_path``;
    their storage is closed after the test. Keyword arguments override the settings of
    :mod:`veil.server.collector.config`."""
    from veil.server.collector import EXTENSION, create_app

    apps: list[Any] = []

    def make(**settings: Any) -> Any:
        app = create_app({"TESTING": True, "REGISTRY": test_registry,
                          "DATABASE": tmp_path / f"veil{len(apps)}.db",
                          "READ_TOKENS": [secrets.token_hex(16)], **settings})
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions[EXTENSION].storage.close()


def _quiet_handler() -> type:
    from werkzeug.serving import WSGIRequestHandler

    class QuietHandler(WSGIRequestHandler):
        """Werkzeug's handler without its access log (which would record client addresses)."""

        def log_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    return QuietHandler


@pytest.fixture
def live_collector(tmp_path: Path) -> Iterator[CollectorHandle]:
    """The collector app served in-process by a threaded werkzeug server on 127.0.0.1."""
    from werkzeug.serving import make_server

    from veil.server.collector import EXTENSION, create_app

    handle = CollectorHandle(tmp_path, TEST_REGISTRY)
    app = create_app({"REGISTRY": TEST_REGISTRY, "DATABASE": handle.db_path,
                      "READ_TOKENS": [handle.token]})
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_quiet_handler())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="live-collector", daemon=True)
    thread.start()
    handle.port = server.server_port
    handle.url = f"http://127.0.0.1:{handle.port}"

    def stop() -> None:
        server.shutdown()
        thread.join(10)
        server.server_close()
        app.extensions[EXTENSION].storage.close()

    handle._stop_thread = stop
    yield handle
    handle.stop()


class RecordingTransport(Transport):
    """A client transport that acknowledges every batch and keeps its reports: what a
    collector would have seen, without a network."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def send(self, url: str, body: bytes, reports: int, **options: Any) -> Outcome:
        self.reports.extend(json.loads(body)["reports"])
        return Outcome("acknowledged", 200, {"accepted": reports, "duplicates": 0, "rejected": 0})


@pytest.fixture
def recording_transport() -> RecordingTransport:
    """A fresh :class:`RecordingTransport`."""
    return RecordingTransport()


@pytest.fixture
def offline_url() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole run (see :mod:`tests.postgres_server`), stopped and
    removed at its end. Skips the tests that need it when there is none, naming the fix;
    fails them instead when ``$CI`` is set, since CI installs the server (``.ci/postgres``)."""
    try:
        server = server_for_tests()
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the PostgreSQL tests must run, but {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL server: {exc}")
    yield server
    server.close()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new empty database on :func:`postgres_server`, dropped (with any session
    still connected to it) after the test; a server the test stopped is started again first."""
    name, url = postgres_server.create_database()
    yield url
    if not postgres_server.running:
        postgres_server.start()
    postgres_server.drop_database(name)
