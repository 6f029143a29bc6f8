"""Fixtures of the client's tests.

``isolated_environment`` (automatic): no ``VEIL_*`` variable of the caller's shell
reaches a client, and the platform's per-user state directory is inside ``tmp_path``
(a test never writes into the user's home).
``silent_url``  the URL of a socket on 127.0.0.1 that accepts connections (its
                backlog) and never answers: a collector that hangs.
``wait_in_flight``  ``wait_in_flight(state_dir, count)``: waits until an upload
                has claimed ``count`` reports of the outbox, and says how many it has.
``HeldFetchTransport``  the default transport, its registry fetches held until released.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from veil.client import RequestsTransport
from veil.client.outbox import IN_FLIGHT
from veil.client.state_dir import DATABASE_FILE
from veil.shared.registry import Registry


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("VEIL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home" / "state"))


@pytest.fixture
def silent_url() -> Iterator[str]:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"


@pytest.fixture
def wait_in_flight() -> Callable[[Path, int], int]:
    def wait(state_dir: Path, count: int) -> int:
        """The reports in flight in ``state_dir``'s outbox, once they are ``count`` or more
        (or 20 s have passed)."""
        database = sqlite3.connect(state_dir / DATABASE_FILE, timeout=30)
        try:
            deadline = time.monotonic() + 20
            while True:
                (in_flight,) = database.execute(
                    "SELECT COUNT(*) FROM outbox WHERE state = ?", (IN_FLIGHT,)
                ).fetchone()
                if in_flight >= count or time.monotonic() > deadline:
                    return int(in_flight)
                time.sleep(0.02)
        finally:
            database.close()

    return wait


class HeldFetchTransport(RequestsTransport):
    """The default transport, whose registry fetches wait until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def fetch_registry(self, url: str, *, token: str | None, timeout: float) -> Registry:
        assert self.release.wait(30), "the test never released the registry fetch"
        return super().fetch_registry(url, token=token, timeout=timeout)
