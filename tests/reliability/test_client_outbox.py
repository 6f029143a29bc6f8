"""Issue 16: the client's outbox grew without bound while the collector was down (about
200 bytes a report). Now it holds at most ``max_outbox`` reports: beyond that new reports
are dropped (never raised into the application), counted in ``client.drops['outbox_full']``,
logged once when dropping starts and once when there is room again, and not charged to
the privacy ledger (they never leave the device)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from veil.client import Client, Transport
from veil.client.transport import Outcome

HOSTS = [f"site{index}.example" for index in range(5)]


def outbox_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "outbox" in r.getMessage()]


def test_a_full_outbox_drops_new_reports_counts_and_logs_them_once(
    collector_factory, tmp_path, caplog
):
    collector = collector_factory()
    client = Client(collector.url, tmp_path / "state", max_outbox=5, max_retries=0)
    assert client.flush().ok and client.registry is not None  # fetched, then the collector stops
    collector.stop()
    with caplog.at_level(logging.INFO, logger="veil.client"):
        for host in HOSTS:
            client.report("homepage", host)
        for _ in range(3):
            client.report("dark_mode", True)  # the outbox is full: dropped, no exception
        assert not client.flush().ok  # the collector is down
    assert client.pending == 5
    assert client.drops["outbox_full"] == 3
    assert client.dropped == 3
    # the dropped reports never left the device: they cost nothing
    assert set(client.privacy_spent().per_metric) == {"homepage"}
    [started] = outbox_messages(caplog)
    assert "max_outbox=5" in started

    collector.start()
    assert client.flush().accepted == 5  # the oldest reports, kept, are delivered
    with caplog.at_level(logging.INFO, logger="veil.client"):
        client.report("dark_mode", True)
    assert "room again; 3 reports were dropped" in outbox_messages(caplog)[-1]
    assert client.flush().accepted == 1
    client.close()
    assert collector.counts("homepage")["reports"] == 5
    assert collector.counts("dark_mode")["reports"] == 1


def test_the_cap_holds_for_clients_sharing_a_state_directory(tmp_path, test_registry, offline_url):
    first = Client(offline_url, tmp_path / "state", registry=test_registry, max_outbox=5)
    second = Client(offline_url, tmp_path / "state", registry=test_registry, max_outbox=5)
    for index in range(6):
        first.report("browser", "firefox")
        second.report("load_time", float(index))
    assert first.pending == second.pending == 5
    assert first.drops["outbox_full"] == 7 == second.drops["outbox_full"]
    first.close(timeout=1)
    second.close(timeout=1)


def test_the_default_cap_is_100000_reports(tmp_path, test_registry, offline_url):
    client = Client(offline_url, tmp_path / "state", registry=test_registry)
    assert client.max_outbox == 100_000
    client.close(timeout=1)



class Draining(Transport):
    """Acknowledges the next ``accept`` batches, then is unreachable: a collector that drains
    a full outbox a few batches at a time."""

    def __init__(self) -> None:
        self.accept = 0

    def send(self, url: str, body: bytes, reports: int, **options: Any) -> Outcome:
        if self.accept <= 0:
            return Outcome("unreachable", message="down")
        self.accept -= 1
        return Outcome("acknowledged", 200, {"accepted": reports, "duplicates": 0,
                                             "rejected": 0})


def test_reports_arriving_faster_than_uploads_drain_them_are_one_logged_episode(
        tmp_path, test_registry, caplog):
    """Each upload making room for a few reports, soon taken, logged "full" and "room again"
    at every upload (405 warnings in 10 s). The outbox has room again once it drained to 90%
    of max_outbox: one episode, two lines, whatever the flapping in between."""
    transport = Draining()
    client = Client("http://collector.invalid", tmp_path / "state", registry=test_registry,
                    transport=transport, max_outbox=100, batch_size=5)
    with caplog.at_level(logging.INFO, logger="veil.client"):
        for _ in range(101):
            client.report("dark_mode", True)
        for _ in range(10):  # an upload frees 5 places, 6 reports arrive
            transport.accept = 1
            client.flush(timeout=1)
            for _ in range(6):
                client.report("dark_mode", True)
        assert len(outbox_messages(caplog)) == 1 and client.drops["outbox_full"] == 11
        transport.accept = 3  # down to 85 of 100
        client.flush(timeout=1)
        client.report("dark_mode", True)
    started, again = outbox_messages(caplog)
    assert "max_outbox=100" in started and "room again; 11 reports were dropped" in again
    client.close(timeout=0)
