"""The state directory: secret, permissions, cohort seed, and an outbox that survives crashes."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from veil.client import Client, StateError
from veil.client.state_dir import DATABASE_FILE, SECRET_FILE
from veil.shared.registry import Registry


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_directory_is_created_private_with_a_secret(tmp_path, test_registry, offline_url):
    state = tmp_path / "app" / "veil"
    client = Client(offline_url, state, registry=test_registry)
    client.report("dark_mode", True)
    assert mode(state) == 0o700
    secret = state / SECRET_FILE
    assert mode(secret) == 0o600 and len(secret.read_bytes()) == 32
    assert mode(state / DATABASE_FILE) == 0o600
    assert mode(state / f"{DATABASE_FILE}-wal") == 0o600
    client.close(timeout=1)


def test_a_tilde_or_variable_in_state_dir_is_expanded(tmp_path, test_registry, offline_url,
                                                      monkeypatch):
    """The README's own ``state_dir="~/..."`` once made a folder named ``~`` in the working
    directory, holding the secret."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("APP_STATE", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    for given, expected in [("~/.local/state/app/veil", tmp_path / "home/.local/state/app/veil"),
                            ("$APP_STATE/veil", tmp_path / "state/veil")]:
        client = Client(offline_url, given, registry=test_registry)
        assert client.state_dir == expected
        assert (expected / SECRET_FILE).exists()
        client.close(timeout=1)
    assert not (tmp_path / "~").exists() and not (tmp_path / "$APP_STATE").exists()


def test_secret_and_cohort_are_reused_and_differ_between_installations(
    tmp_path, test_registry, offline_url
):
    first = Client(offline_url, tmp_path / "one", registry=test_registry)
    secret, cohort = (tmp_path / "one" / SECRET_FILE).read_bytes(), first.cohort_seed
    first.close(timeout=1)
    again = Client(offline_url, tmp_path / "one", registry=test_registry)
    assert (tmp_path / "one" / SECRET_FILE).read_bytes() == secret and again.cohort_seed == cohort
    again.close(timeout=1)
    other = Client(offline_url, tmp_path / "two", registry=test_registry)
    assert (tmp_path / "two" / SECRET_FILE).read_bytes() != secret
    other.close(timeout=1)


def test_the_same_secret_gives_the_same_permanent_response(tmp_path, offline_url,
                                                           recording_transport):
    """Restarting the app must not re-randomize memoized answers (that would average out).

    With RAPPOR's one-time setting p = 0, q = 1 a report is its permanent response.
    """
    registry = Registry.from_toml("""
[metrics.homepage]
kind = "string"
k = 32
h = 2
m = 4
p = 0.0
q = 1.0
f = 0.5
""")

    def payload(state: Path) -> str:
        client = Client(offline_url, state, registry=registry, transport=recording_transport)
        client.report("homepage", "example.com")
        client.flush()
        client.close(timeout=1)
        return str(recording_transport.reports[-1]["payload"])

    first = payload(tmp_path / "state")
    assert payload(tmp_path / "state") == first
    # another installation's permanent response differs (all 32 bits agree w.p. 0.625**32)
    assert payload(tmp_path / "other") != first


def test_wal_mode(tmp_path, test_registry, offline_url):
    Client(offline_url, tmp_path / "state", registry=test_registry).close(timeout=1)
    database = sqlite3.connect(tmp_path / "state" / DATABASE_FILE)
    assert database.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    database.close()


def test_a_damaged_secret_is_a_clear_error(tmp_path, test_registry, offline_url):
    state = tmp_path / "state"
    state.mkdir()
    (state / SECRET_FILE).write_bytes(b"short")
    with pytest.raises(StateError, match="damaged"):
        Client(offline_url, state, registry=test_registry, strict=True)


def test_state_dir_that_is_a_file_is_a_clear_error(tmp_path, test_registry, offline_url):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(StateError, match="state_dir"):
        Client(offline_url, path, registry=test_registry, strict=True)


CHILD = textwrap.dedent("""
    import sys
    from veil.client import Client
    from veil.shared.registry import Registry

    url, state, registry, count, then = sys.argv[1:]
    client = Client(url, state, registry=Registry.load(registry), timeout=60, max_retries=0)
    for index in range(int(count)):
        client.report("homepage", f"site{index % 7}.example")
    print("queued", flush=True)
    if then == "flush":
        client.flush()  # the collector never answers: the rows stay in flight
    else:
        input()  # wait to be killed
""")


def run_child(tmp_path: Path, url: str, registry_path: Path, count: int, then: str):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, str(script), url, str(tmp_path / "state"), str(registry_path),
         str(count), then],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    )


def write_registry(tmp_path: Path, registry) -> Path:
    path = tmp_path / "metrics.toml"
    path.write_text(registry.to_toml())
    return path


def test_queued_reports_survive_the_process_being_killed(tmp_path, test_registry, offline_url):
    child = run_child(tmp_path, offline_url, write_registry(tmp_path, test_registry), 250, "wait")
    try:
        assert child.stdout.readline().strip() == "queued"
    finally:
        child.kill()  # SIGKILL: no clean-up code runs
        child.wait()
        child.stdout.close()
        child.stdin.close()
    client = Client(offline_url, tmp_path / "state", registry=test_registry)
    assert client.pending == 250
    client.close(timeout=1)


def test_reports_in_flight_when_killed_return_to_ready_and_are_delivered(
    tmp_path, test_registry, live_collector, silent_url, wait_in_flight
):
    """A crash during an upload leaves rows in flight; the next start queues them again."""
    child = run_child(tmp_path, silent_url, write_registry(tmp_path, test_registry), 40, "flush")
    try:
        assert child.stdout.readline().strip() == "queued"
        assert wait_in_flight(tmp_path / "state", 40) == 40
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stdin.close()
    client = Client(live_collector.url, tmp_path / "state")
    database = sqlite3.connect(tmp_path / "state" / DATABASE_FILE)
    assert database.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall() == [
        (0, 40)
    ]
    database.close()
    result = client.flush()
    assert (result.accepted, result.remaining) == (40, 0)
    assert live_collector.counts("homepage")["reports"] == 40
    client.close()
