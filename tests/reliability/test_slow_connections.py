"""Connections that trickle bytes, or say nothing, cannot hold the collector's connection limit.

Against a real ``veil serve`` on 127.0.0.1 with a lowered ``--connection-limit``: a
client still sending its request ``--receive-timeout`` seconds after its first byte is
disconnected, a silent connection is closed after ``--channel-timeout`` seconds, and a
genuine upload queued behind slow senders is answered.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import requests

from veil.shared.wire import make_batch, make_report

LIMIT = 8
RECEIVE_TIMEOUT = 2
#: slow senders keep sending (and reconnecting) at most this long
SLOW_SENDER_SECONDS = 30.0
#: a request sent a byte a second: longer than any test lasts
SLOW_REQUEST = (b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + b" " * 1000)


class SlowSender(threading.Thread):
    """Sends :data:`SLOW_REQUEST` one byte a second, reconnecting when the server hangs up."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = stop
        self.dropped = 0

    def run(self) -> None:
        deadline = time.monotonic() + SLOW_SENDER_SECONDS
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    self._trickle(sock)
            except OSError:
                self.dropped += 1
                self.stop.wait(0.1)

    def _trickle(self, sock: socket.socket) -> None:
        for byte in SLOW_REQUEST:
            if self.stop.is_set():
                return
            sock.sendall(bytes([byte]))
            if select.select([sock], [], [], 1.0)[0]:  # the server answered or hung up
                self.dropped += 1
                return


def test_an_upload_gets_through_slow_senders_holding_every_connection(collector_factory):
    collector = collector_factory(serve_args=["--connection-limit", str(LIMIT),
                                              "--receive-timeout", str(RECEIVE_TIMEOUT)])
    params = collector.registry["dark_mode"].params
    batch = make_batch(os.urandom(16).hex(),
                       [make_report(os.urandom(16).hex(), "dark_mode", None, 1, params.fingerprint)])
    stop = threading.Event()
    senders = [SlowSender(collector.port, stop) for _ in range(LIMIT + 2)]
    for sender in senders:
        sender.start()
    try:
        time.sleep(1.0)  # every connection the collector serves is a slow sender's
        started = time.monotonic()
        response = requests.post(collector.url + "/v1/reports", json=batch, timeout=15)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        for sender in senders:
            sender.join(10)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 1
    assert elapsed < RECEIVE_TIMEOUT + 5
    assert any(sender.dropped for sender in senders)  # the collector hung up on slow senders
    assert "reached the connection limit" in (collector.workdir / "serve.log").read_text()


def test_a_silent_connection_is_closed_after_the_channel_timeout(collector_factory):
    collector = collector_factory(serve_args=["--channel-timeout", "1"])
    with socket.create_connection(("127.0.0.1", collector.port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 5
