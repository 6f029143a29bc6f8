"""Fixtures of the client's tests.

``isolated_environment`` (automatic): no ``VEIL_*`` variable of the caller's shell
reaches a client, and the platform's per-user state directory is inside ``tmp_path``
(a test never writes into the user's home).
``silent_url``  the URL of a socket on 127.0.0.1 that accepts connections (its
                backlog) and never answers: a collector that hangs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


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
