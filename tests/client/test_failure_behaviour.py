"""The SDK lives inside other people's applications: it never blocks them on the network and
never raises into them by default. What it cannot do it drops, counts and logs.

Each test pins down one failure seen in an application's first hour with the SDK:
a constructor that stalled on a collector that never answered (and raised on first
run), ``report()`` raising for a bad value or past the budget, ``flush()`` and
``close()`` blocking for seconds offline with urllib3's descriptions on stderr, a
forked child's ``flush()`` that said nothing about rows its parent held, and a state
directory every application had to invent.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.client.conftest import HeldFetchTransport
from veil.client import (
    BudgetExceededError,
    Client,
    ClientClosedError,
    FlushResult,
    ParameterError,
    UnknownMetricError,
)
from veil.client.registry_source import MAX_WAITING
from veil.client.state_dir import DATABASE_FILE, REGISTRY_CACHE_FILE, SECRET_FILE
from veil.client.worker import BackgroundWorker
from veil.shared.registry import Registry

#: generous bounds that still fail where the SDK used to block (2 s, 5 s, 10 s and more)
QUICK = 0.5


def drop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("dropped")]


# ---------------------------------------------------------------- the state directory


def test_the_state_directory_defaults_to_the_apps_per_user_state_directory(
    tmp_path, test_registry, offline_url
):
    """``Client(url, app_name=...)``: no path to invent (XDG_STATE_HOME is set by the fixture)."""
    with Client(offline_url, app_name="myapp", registry=test_registry) as client:
        expected = tmp_path / "home" / "state" / "myapp" / "veil"
        assert client.state_dir == expected
        client.report("dark_mode", True)
        assert (expected / SECRET_FILE).exists() and client.pending == 1


def test_without_app_name_or_state_dir_a_shared_default_is_used_and_strict_refuses(
    tmp_path, test_registry, offline_url, caplog
):
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        client = Client(offline_url, registry=test_registry)
    assert client.state_dir == tmp_path / "home" / "state" / "veil" / "veil"
    assert "pass app_name=" in caplog.text
    client.close()
    with pytest.raises(ParameterError, match="app_name=") as raised:
        Client(offline_url, registry=test_registry, strict=True)
    assert raised.value.field == "app_name"


def test_an_unusable_state_directory_disables_the_client_instead_of_raising(
    tmp_path, test_registry, offline_url, caplog
):
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    with caplog.at_level(logging.ERROR, logger="veil.client"):
        client = Client(offline_url, occupied, registry=test_registry)
    assert client.disabled and "Veil is disabled" in caplog.text and "a-file" in caplog.text
    client.report("dark_mode", True)
    assert client.pending == 0 and client.flush().ok and client.close() is None


# ---------------------------------------------------------------- construction and the registry


def test_construction_never_waits_for_a_collector_that_does_not_answer(
    tmp_path, test_registry, silent_url
):
    """It used to wait 10 s and raise RegistryUnavailableError on first run, and wait 2 s
    with a cached registry."""
    started = time.monotonic()
    first_run = Client(silent_url, tmp_path / "first", timeout=30)
    assert time.monotonic() - started < QUICK
    assert first_run.registry is None
    first_run.report("dark_mode", True)  # waits in memory for the registry
    assert first_run.pending == 1
    started = time.monotonic()
    result = first_run.flush(timeout=0.3)
    assert time.monotonic() - started < QUICK + 0.3
    assert "registry" in result.error and result.remaining == 1

    cached = tmp_path / "cached"
    cached.mkdir()
    (cached / REGISTRY_CACHE_FILE).write_text(json.dumps(test_registry.to_dict()))
    started = time.monotonic()
    second_run = Client(silent_url, cached, timeout=30)
    assert time.monotonic() - started < QUICK
    assert second_run.registry == test_registry
    second_run.report("dark_mode", True)
    assert second_run.pending == 1
    for client in (first_run, second_run):
        started = time.monotonic()
        client.close(timeout=0.3)
        assert time.monotonic() - started < QUICK + 0.3
    assert first_run.drops["no_registry"] == 1  # never encoded: dropped and counted


def test_values_reported_before_the_registry_arrives_are_sent_once_it_does(
    collector_factory, tmp_path
):
    """First run with the collector down: the values wait in memory only, then go out."""
    collector = collector_factory()
    collector.stop()
    state = tmp_path / "state"
    client = Client(collector.url, state)  # used to raise RegistryUnavailableError
    client.report("homepage", "canary-5e1d.example")
    client.report("dark_mode", True)
    assert client.pending == 2 and client.registry is None
    for path in state.rglob("*"):  # raw values never touch the disk
        assert not path.is_file() or b"canary-5e1d" not in path.read_bytes()
    collector.start()
    result = client.flush(timeout=10)
    assert result.ok, result.error
    assert (result.accepted, result.remaining) == (2, 0)
    assert client.registry == collector.registry
    client.close()
    assert collector.counts("homepage")["reports"] == 1


def test_a_cached_registry_is_used_at_once_and_refreshed_in_the_background(
    live_collector, tmp_path
):
    """A metric the cached copy lacks waits for the refresh instead of being dropped."""
    state = tmp_path / "state"
    state.mkdir()
    old = Registry.from_dict({"metrics": {"dark_mode": {"kind": "boolean", "min_reports": 1}}})
    (state / REGISTRY_CACHE_FILE).write_text(json.dumps(old.to_dict()))
    transport = HeldFetchTransport()
    client = Client(live_collector.url, state, transport=transport)
    assert client.registry == old  # the cache, while the refresh is under way
    client.report("homepage", "example.com")
    assert client.pending == 1 and client.registry == old and client.dropped == 0
    transport.release.set()
    result = client.flush(timeout=10)
    assert result.ok and result.accepted == 1, result.error
    assert client.registry == live_collector.registry and client.dropped == 0
    assert live_collector.counts("homepage")["reports"] == 1
    cached = json.loads((state / REGISTRY_CACHE_FILE).read_text())
    assert Registry.from_dict(cached) == live_collector.registry
    client.close()


def test_the_values_waiting_for_the_registry_are_bounded_and_counted(tmp_path, offline_url):
    client = Client(offline_url, tmp_path / "state")
    for index in range(MAX_WAITING + 5):
        client.report("load_time", float(index % 10))
    assert client.pending == MAX_WAITING
    assert client.drops["no_registry"] == 5
    client.close()
    assert client.drops["no_registry"] == MAX_WAITING + 5 == client.dropped


def test_close_says_how_many_values_it_drops_instead_of_calling_them_remaining(
    tmp_path, offline_url, caplog
):
    """Issue 25, item 10: ``close()`` returned ``remaining=100`` for 100 values it dropped."""
    client = Client(offline_url, tmp_path / "state")
    for index in range(100):
        client.report("load_time", float(index % 10))
    assert client.pending == 100
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        result = client.close()
    assert result.remaining == 0  # nothing is kept for the next start ...
    assert result.dropped == 100  # ... the values are dropped
    assert result.error.startswith("dropped 100 values that waited in memory for the metric "
                                   "registry: GET ")
    assert client.drops["no_registry"] == 100
    [warning] = [r for r in caplog.records if r.getMessage().startswith("lost 100 values")]
    assert warning.levelno == logging.WARNING
    assert "could not be fetched in close(timeout=1)" in warning.getMessage()


# ---------------------------------------------------------------- report() never raises


def test_report_drops_counts_and_logs_once_per_cause_instead_of_raising(
    tmp_path, test_registry, offline_url, caplog
):
    budget = test_registry["dark_mode"].params.epsilon_1 * 1.5
    client = Client(offline_url, tmp_path / "state", registry=test_registry, budget=budget)
    with caplog.at_level(logging.INFO, logger="veil.client"):
        for _ in range(2):
            client.report("homepage", None)  # used to raise, without naming the metric
            client.report("homepgae", "example.com")
        client.report("dark_mode", True)  # within the budget
        client.report("load_time", 1.0)  # past it: used to raise
        client.report("load_time", 2.0)
        client.close()
        client.report("dark_mode", False)  # closed
        client.report("dark_mode", False)
    drops = client.drops
    assert {cause: drops[cause] for cause in
            ("invalid_value", "unknown_metric", "budget", "closed")} == {
        "invalid_value": 2, "unknown_metric": 2, "budget": 2, "closed": 2}
    assert client.dropped == 8
    warnings = drop_warnings(caplog)
    assert len(warnings) == 4  # once per cause
    [invalid] = [w for w in warnings if "client.drops['invalid_value']" in w]
    assert "metric 'homepage': value must be a str; got NoneType" in invalid
    [unknown] = [w for w in warnings if "client.drops['unknown_metric']" in w]
    assert "'homepgae'" in unknown and "dark_mode" in unknown  # names the known metrics
    with Client(offline_url, tmp_path / "state", registry=test_registry) as again:
        assert again.drops["invalid_value"] == 2  # durable


def test_strict_raises_what_the_default_drops(tmp_path, test_registry, offline_url):
    budget = test_registry["dark_mode"].params.epsilon_1 * 1.5
    client = Client(offline_url, tmp_path / "state", registry=test_registry, budget=budget,
                    strict=True)
    with pytest.raises(ParameterError, match="metric 'homepage': value must be a str") as raised:
        client.report("homepage", None)
    assert raised.value.field == "value"
    with pytest.raises(UnknownMetricError):
        client.report("homepgae", "example.com")
    client.report("dark_mode", True)
    with pytest.raises(BudgetExceededError, match="'load_time'"):
        client.report("load_time", 1.0)
    client.close()
    with pytest.raises(ClientClosedError):
        client.report("dark_mode", True)
    with pytest.raises(ClientClosedError):
        client.flush()


def test_a_closed_client_flushes_to_an_error_instead_of_raising(tmp_path, test_registry,
                                                               offline_url):
    client = Client(offline_url, tmp_path / "state", registry=test_registry)
    client.close()
    result = client.flush()
    assert not result.ok and "closed" in result.error


@pytest.mark.parametrize(("switch", "levels"), [
    ("off", [logging.WARNING]),
    ("argument", [logging.WARNING, logging.DEBUG, logging.DEBUG]),
    ("environment", [logging.WARNING, logging.DEBUG, logging.DEBUG]),
])
def test_debug_logs_every_drop(tmp_path, test_registry, offline_url, caplog, monkeypatch,
                               switch, levels):
    options = {"debug": True} if switch == "argument" else {}
    if switch == "environment":
        monkeypatch.setenv("VEIL_DEBUG", "1")
    logger = logging.getLogger("veil.client")
    saved = logger.level
    try:
        client = Client(offline_url, tmp_path / "state", registry=test_registry, **options)
        assert client.debug == (switch != "off")
        for _ in range(3):
            client.report("homepgae", "example.com")
        client.close()
    finally:
        logger.setLevel(saved)
    dropped = [r for r in caplog.records if r.getMessage().startswith("dropped")]
    assert [r.levelno for r in dropped] == levels


# ---------------------------------------------------------------- flush() and close() are bounded


def test_flush_and_close_are_bounded_by_default_against_a_silent_collector(
    tmp_path, test_registry, silent_url
):
    """An offline flush() took 4.4 s and close() 5 s; against a collector that never answers,
    longer still."""
    client = Client(silent_url, tmp_path / "state", registry=test_registry)
    client.report("dark_mode", True)
    started = time.monotonic()
    result = client.flush()
    assert time.monotonic() - started < 2.0 + QUICK
    assert not result.ok and result.remaining == 1
    assert "ReadTimeout" in result.error and "HTTPConnectionPool" not in result.error
    started = time.monotonic()
    client.close()
    assert time.monotonic() - started < 1.0 + QUICK


STDERR_SCRIPT = textwrap.dedent("""
    import sys
    from veil.client import Client
    from veil.shared.registry import Registry

    url, state, registry = sys.argv[1:]
    client = Client(url, state, registry=Registry.load(registry), background=True,
                    flush_interval=0.05, backoff_base=0.01, backoff_cap=0.02)
    for index in range(50):
        client.report("homepage", f"site{index}.example")
    for _ in range(3):
        client.flush(timeout=0.5)
    client.report("homepage", 42)
    client.report("homepage", 43)
""")


def test_an_offline_application_sees_one_line_per_problem_on_stderr(
    tmp_path, test_registry, offline_url
):
    """No urllib3 descriptions or tracebacks reach the end user's terminal: a warning from the
    ``veil.client`` logger once per problem (the application configured no logging)."""
    script = tmp_path / "app.py"
    script.write_text(STDERR_SCRIPT)
    registry = tmp_path / "metrics.toml"
    registry.write_text(test_registry.to_toml())
    completed = subprocess.run(
        [sys.executable, str(script), offline_url, str(tmp_path / "state"), str(registry)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stderr.splitlines()
    for noise in ("urllib3", "HTTPConnectionPool", "Traceback", "Max retries"):
        assert noise not in completed.stderr
    assert len(lines) == 2, lines
    [upload] = [line for line in lines if line.startswith("the collector is unreachable: POST")]
    assert "failed: ConnectionError (connection refused)" in upload
    assert "The reports stay queued and will be retried" in upload
    [dropped] = [line for line in lines if line.startswith("dropped a report of 'homepage'")]
    assert "value must be a str; got int" in dropped


def test_an_outage_is_counted_continued_by_the_next_client_and_ended_by_an_answer(
    collector_factory, tmp_path, caplog
):
    """``client.outage`` counts the failed attempts of one outage, from the state database: a
    second client on the same state directory continues it (one WARNING in all, then DEBUG),
    and the first answer from the collector ends it with one INFO line."""
    collector = collector_factory()
    collector.stop()
    state = tmp_path / "state"
    with caplog.at_level(logging.DEBUG, logger="veil.client"):
        first = Client(collector.url, state, registry=collector.registry, max_retries=0)
        assert first.outage is None
        first.report("dark_mode", True)
        began = datetime.datetime.now(datetime.UTC)
        for _ in range(2):
            assert not first.flush(timeout=2).ok
        outage = first.outage
        assert outage is not None and outage.failures == 2
        assert abs(outage.since - began) < datetime.timedelta(seconds=5)
        first.close(timeout=1)
        assert first.outage == dataclasses.replace(outage, failures=3)  # readable once closed

        second = Client(collector.url, state, registry=collector.registry, max_retries=0)
        assert second.outage == first.outage
        assert not second.flush(timeout=2).ok
        collector.start()
        result = second.flush(timeout=10)
        assert result.ok and result.accepted == 1, result
        assert second.outage is None
        second.close()
    said = [(r.levelno, r.getMessage()) for r in caplog.records
            if r.getMessage().startswith(("the collector is", "failed attempt"))]
    assert [level for level, _ in said] == [logging.WARNING] + [logging.DEBUG] * 3 + [logging.INFO]
    assert [text.startswith(f"failed attempt {n} of the outage since ")
            for n, (_, text) in enumerate(said[1:4], 2)] == [True] * 3
    assert said[-1][1].startswith("the collector is reachable again after ")
    assert f"(4 failed attempts since {outage.since.isoformat()})" in said[-1][1]
    assert collector.counts("dark_mode")["reports"] == 1


# ---------------------------------------------------------------- the outbox


@pytest.mark.parametrize(("policy", "kept"), [("drop-newest", [1, 2, 3]),
                                              ("drop-oldest", [3, 4, 5])])
@pytest.mark.parametrize("values", [[0.0, 1.0, 2.0, 3.0, 4.0], [1.0] * 5],
                         ids=["new values", "a value reported twice already"])
def test_a_full_outbox_drops_by_the_chosen_policy(tmp_path, test_registry, offline_url,
                                                  policy, kept, values):
    """A value reported twice already costs nothing more, so its report is queued without a
    ledger transaction: the policy holds there too."""
    client = Client(offline_url, tmp_path / "state", registry=test_registry, max_outbox=3,
                    outbox_policy=policy)
    for value in values:
        client.report("load_time", value)
    assert client.pending == 3 and client.drops["outbox_full"] == 2
    database = sqlite3.connect(tmp_path / "state" / DATABASE_FILE)
    assert [seq for (seq,) in database.execute("SELECT seq FROM outbox ORDER BY seq")] == kept
    database.close()
    client.close()


def test_the_background_interval_is_jittered():
    """Installations started together must not upload in lockstep: the waits vary within
    [0.8, 1.2] times the interval (20 waits all within half that range: p < 1e-4)."""
    times: list[float] = []
    enough = threading.Event()

    def flush(stop: threading.Event) -> None:
        times.append(time.monotonic())
        if len(times) == 21:
            enough.set()

    worker = BackgroundWorker(flush, batch_size=10**6, interval=0.1)
    worker.nudge()
    assert enough.wait(15)
    assert worker.stop(5)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)][:20]
    assert len(gaps) == 20
    assert min(gaps) >= 0.075
    assert max(gaps) - min(gaps) > 0.02


# ---------------------------------------------------------------- disabled, and the environment


@pytest.mark.parametrize("switch", ["argument", "environment"])
def test_a_disabled_client_does_nothing(tmp_path, test_registry, recording_transport,
                                        monkeypatch, switch):
    options = {"disabled": True} if switch == "argument" else {}
    if switch == "environment":
        monkeypatch.setenv("VEIL_DISABLED", "true")
    state = tmp_path / "state"
    client = Client("https://veil.example.org", state, registry=test_registry,
                    transport=recording_transport, **options)
    assert client.disabled
    assert (client.url, client.state_dir, client.cohort_seed) == (None, None, None)
    client.report("dark_mode", True)
    client.report("no_such_metric", object())
    assert client.flush() == FlushResult()
    assert (client.pending, client.dropped, client.privacy_spent().total) == (0, 0, 0.0)
    assert client.close() is None
    assert recording_transport.reports == [] and not state.exists()


def test_the_environment_configures_the_client_and_arguments_win(
    tmp_path, collector_factory, monkeypatch
):
    collector = collector_factory(upload_token="upload-secret")
    monkeypatch.setenv("VEIL_URL", collector.url)
    monkeypatch.setenv("VEIL_UPLOAD_TOKEN", "upload-secret")
    monkeypatch.setenv("VEIL_STATE_DIR", str(tmp_path / "from-env"))
    with Client() as client:
        assert (client.url, client.state_dir) == (collector.url, tmp_path / "from-env")
        client.report("dark_mode", True)
        result = client.flush(timeout=10)
        assert result.ok and result.accepted == 1, result.error
    with Client("http://127.0.0.1:1", tmp_path / "explicit", token="other") as client:
        assert (client.url, client.state_dir, client.token) == (
            "http://127.0.0.1:1", tmp_path / "explicit", "other")


def test_no_url_anywhere_disables_the_client_or_raises_when_strict(tmp_path, test_registry,
                                                                    caplog):
    with caplog.at_level(logging.ERROR, logger="veil.client"):
        client = Client(state_dir=tmp_path / "state", registry=test_registry)
    assert client.disabled and "VEIL_URL" in caplog.text
    client.report("dark_mode", True)
    with pytest.raises(ParameterError, match="VEIL_URL"):
        Client(state_dir=tmp_path / "state", registry=test_registry, strict=True)


def test_a_bad_token_in_the_environment_disables_the_client_or_raises_when_strict(
    tmp_path, test_registry, offline_url, monkeypatch, caplog
):
    """A ``VEIL_UPLOAD_TOKEN`` with a line break once raised from ``Client()`` even with
    ``disabled=True``: the environment belongs to the machine, not to the application's code."""
    monkeypatch.setenv("VEIL_UPLOAD_TOKEN", "upload-secret\n")
    with caplog.at_level(logging.ERROR, logger="veil.client"):
        client = Client(offline_url, tmp_path / "state", registry=test_registry)
    assert client.disabled and "VEIL_UPLOAD_TOKEN" in caplog.text
    assert "upload-secret" not in caplog.text  # the token is a secret: never logged
    client.report("dark_mode", True)
    assert (client.pending, client.token, client.close()) == (0, None, None)
    assert Client(offline_url, tmp_path / "off", registry=test_registry, disabled=True).disabled
    with Client(offline_url, tmp_path / "state", registry=test_registry, token="other") as given:
        assert not given.disabled and given.token == "other"  # the argument wins
    with pytest.raises(ParameterError, match="VEIL_UPLOAD_TOKEN") as raised:
        Client(offline_url, tmp_path / "state", registry=test_registry, strict=True)
    assert raised.value.field == "token"
    with pytest.raises(ParameterError, match=r"^token must be") as raised:  # a mistake in the code
        Client(offline_url, tmp_path / "state", registry=test_registry, token="other\n",
               disabled=True)
    assert raised.value.field == "token"


# ---------------------------------------------------------------- an honest FlushResult


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_flush_says_so_when_another_thread_or_process_holds_the_reports(
    tmp_path, test_registry, silent_url, wait_in_flight
):
    """A forked child's flush() once returned sent=0, remaining=869, error=None while the
    parent's uploader held the rows."""
    client = Client(silent_url, tmp_path / "state", registry=test_registry, background=True,
                    flush_interval=60, timeout=5, max_retries=0, batch_size=10)
    for index in range(10):
        client.report("load_time", float(index))
    assert wait_in_flight(tmp_path / "state", 10) == 10
    result = client.flush(timeout=0.5)  # the background thread holds all 10
    assert (result.sent, result.remaining, result.held) == (0, 10, 10)
    assert not result.ok and "held by another upload" in result.error
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            child = client.flush(timeout=0.5)
            if child.held == 10 and child.error and "held by another upload" in child.error:
                status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.close(timeout=0.2)
