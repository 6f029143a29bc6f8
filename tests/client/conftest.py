"""Fixtures for the client tests (the collector fixtures come from the suite's conftest)."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def offline_url() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
