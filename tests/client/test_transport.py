"""Transports: the client sends through any :class:`Transport`; the default one speaks HTTP.

The first tests plug in :class:`MemoryCollector`, a transport that answers in
memory, to pin down what the client asks of a transport and what each outcome
does to the outbox. The rest drive :class:`RequestsTransport` against a real
collector on 127.0.0.1, or one that is not there.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import requests

from veil.client import (
    Client,
    RegistryUnavailableError,
    RequestsTransport,
    Transport,
)
from veil.client.transport import GRACE, Outcome, RetryPolicy, retry_after
from veil.shared.kinds import BooleanParams
from veil.shared.registry import Registry
from veil.shared.wire import join_batch, make_report, validate_batch

URL = "https://collector.invalid"


def acknowledge(batch: dict[str, Any]) -> Outcome:
    """The collector's answer when it stores every report of ``batch``."""
    count = len(batch["reports"])
    return Outcome("acknowledged", 200, {"accepted": count, "duplicates": 0, "rejected": 0})


class MemoryCollector(Transport):
    """Answers each batch with ``respond(batch)``, and records the batches and the call options."""

    def __init__(self, respond: Callable[[dict[str, Any]], Outcome] = acknowledge) -> None:
        self.respond = respond
        self.batches: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    def send(self, url: str, body: bytes, reports: int, **options: Any) -> Outcome:
        batch = json.loads(body)
        self.batches.append(batch)
        self.calls.append({"url": url, "reports": reports, **options})
        return self.respond(batch)

    def close(self) -> None:
        self.closed = True


def memory_client(tmp_path, registry: Registry, transport: Transport, **options: Any) -> Client:
    return Client(URL, tmp_path / "state", registry=registry, transport=transport, **options)


def test_a_custom_transport_carries_every_batch_with_the_clients_settings(tmp_path, test_registry):
    transport = MemoryCollector()
    client = memory_client(tmp_path, test_registry, transport, token="upload-secret", timeout=3,
                           max_retries=2, backoff_base=0.1, backoff_cap=1, batch_size=4)
    for value in ["example.com", "veil.dev", "example.com", "news.example", "other.example"]:
        client.report("homepage", value)
    client.report("dark_mode", True)
    result = client.flush(timeout=None)
    assert (result.batches, result.sent, result.accepted, result.remaining) == (2, 6, 6, 0)
    assert [len(batch["reports"]) for batch in transport.batches] == [4, 2]
    for batch in transport.batches:
        assert validate_batch(batch, test_registry).errors == []
    assert len({batch["batch_id"] for batch in transport.batches}) == 2
    assert len({r["id"] for batch in transport.batches for r in batch["reports"]}) == 6
    policy = RetryPolicy(max_retries=2, backoff_base=0.1, backoff_cap=1.0)
    for call, batch in zip(transport.calls, transport.batches, strict=True):
        assert call == {"url": URL, "reports": len(batch["reports"]), "token": "upload-secret",
                        "timeout": 3.0, "policy": policy, "deadline": None, "stop": None}
    client.report("dark_mode", False)
    closing = client.close(timeout=2)
    assert closing is not None and closing.accepted == 1
    final = transport.calls[-1]
    assert final["policy"].max_retries == 0  # the final flush at close does not back off
    assert final["deadline"] is not None and final["deadline"] <= time.monotonic() + 2
    assert transport.closed


@pytest.mark.parametrize(
    ("outcome", "level", "logged"),
    [
        (Outcome("unreachable", message="no route to the collector"), logging.WARNING,
         "the collector is unreachable: no route to the collector. The reports stay queued"),
        (Outcome("refused", 401, message="HTTP 401 unauthorized"), logging.ERROR,
         "refused a batch"),
    ],
)
def test_a_failed_upload_keeps_the_reports_and_says_why(tmp_path, test_registry, caplog,
                                                        outcome, level, logged):
    transport = MemoryCollector(lambda batch: outcome)
    client = memory_client(tmp_path, test_registry, transport)
    for value in (True, False, True):
        client.report("dark_mode", value)
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        result = client.flush()
    assert not result.ok and result.error == outcome.message
    assert (result.batches, result.sent, result.remaining) == (0, 0, 3)
    assert len(transport.batches) == 1  # the flush stops at the first failed batch
    assert client.pending == 3 and client.dropped == 0
    assert [(r.levelno, logged in r.getMessage()) for r in caplog.records] == [(level, True)]
    transport.respond = acknowledge
    assert client.flush().accepted == 3
    client.close(timeout=1)


def test_too_large_halves_the_batch_and_drops_a_single_report_for_good(tmp_path, test_registry,
                                                                      caplog):
    """A batch the collector refuses as too large is split; one report refused alone is dropped."""

    def respond(batch: dict[str, Any]) -> Outcome:
        metrics = [report["metric"] for report in batch["reports"]]
        if len(metrics) > 2 or "homepage" in metrics:
            return Outcome("too_large", 413, message="body over the limit")
        return acknowledge(batch)

    transport = MemoryCollector(respond)
    client = memory_client(tmp_path, test_registry, transport)
    for value in (True, False, True, False):
        client.report("dark_mode", value)
    client.report("homepage", "example.com")
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        result = client.flush()
    assert result.ok, result.error
    # halved once, the smaller size kept, then the lone refused report dropped
    assert [len(batch["reports"]) for batch in transport.batches] == [5, 2, 2, 1]
    assert (result.batches, result.sent, result.accepted, result.rejected) == (3, 5, 4, 1)
    assert client.pending == 0 and client.dropped == 1
    assert "refuses a report as too large: body over the limit" in caplog.text
    client.close(timeout=1)


def test_a_background_client_uploads_through_its_transport(tmp_path, test_registry):
    transport = MemoryCollector()
    client = memory_client(tmp_path, test_registry, transport, background=True,
                           flush_interval=0.05)
    for value in (True, False, True):
        client.report("dark_mode", value)
    deadline = time.monotonic() + 10
    while client.pending and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.pending == 0
    assert sum(len(batch["reports"]) for batch in transport.batches) == 3
    assert all(isinstance(call["stop"], threading.Event) for call in transport.calls)
    client.close(timeout=1)
    assert transport.closed


def test_a_transport_that_cannot_fetch_the_registry_needs_one(tmp_path):
    transport = MemoryCollector()
    with pytest.raises(RegistryUnavailableError, match="MemoryCollector does not fetch"):
        Client(URL, tmp_path / "state", transport=transport, strict=True)
    assert not transport.closed  # still the caller's, to try again with registry=
    client = Client(URL, tmp_path / "state", transport=transport)  # not strict: no raise
    client.report("dark_mode", True)
    result = client.flush()
    assert "MemoryCollector does not fetch" in result.error and result.remaining == 1
    assert client.close(timeout=1) is not None
    assert client.drops["no_registry"] == 1 and transport.batches == []


def test_only_the_default_transport_has_a_session(tmp_path, test_registry, offline_url):
    custom = memory_client(tmp_path, test_registry, MemoryCollector())
    with pytest.raises(AttributeError, match="MemoryCollector"):
        _ = custom.session
    custom.close(timeout=1)
    default = Client(offline_url, tmp_path / "other", registry=test_registry)
    assert isinstance(default.transport, RequestsTransport)
    assert isinstance(default.session, requests.Session)
    assert default.session is default.transport.session
    default.close(timeout=1)


# ---------------------------------------------------------------- RequestsTransport


def one_report_batch() -> bytes:
    report = make_report(secrets.token_hex(16), "dark_mode", None, 1,
                         BooleanParams().fingerprint)
    return join_batch(secrets.token_hex(16), [json.dumps(report)]).encode()


def test_requests_transport_uploads_and_fetches_the_registry(live_collector):
    transport = RequestsTransport()
    registry = transport.fetch_registry(live_collector.url, token=None, timeout=5)
    assert registry == live_collector.registry
    outcome = transport.send(live_collector.url, one_report_batch(), 1, token=None, timeout=5,
                             policy=RetryPolicy())
    assert (outcome.kind, outcome.status) == ("acknowledged", 200)
    assert (outcome.answer["accepted"], outcome.answer["rejected"]) == (1, 0)
    assert live_collector.counts("dark_mode")["reports"] == 1
    transport.close()


def test_requests_transport_reports_an_unreachable_collector(offline_url):
    transport = RequestsTransport()
    options: dict[str, Any] = {"token": None, "timeout": 2}
    once = transport.send(offline_url, one_report_batch(), 1, policy=RetryPolicy(0), **options)
    assert once.kind == "unreachable" and "gave up after 1 attempt)" in once.message
    late = transport.send(offline_url, one_report_batch(), 1, policy=RetryPolicy(),
                          deadline=time.monotonic() - 1, **options)
    assert (late.kind, late.message) == ("unreachable", "flush deadline reached")
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    stopped = transport.send(offline_url, one_report_batch(), 1, stop=stop,
                             policy=RetryPolicy(5, backoff_base=10, backoff_cap=10), **options)
    assert stopped.kind == "unreachable" and stopped.message.endswith("(client closing)")
    assert time.monotonic() - started < 5
    with pytest.raises(RegistryUnavailableError, match="/v1/metrics failed"):
        transport.fetch_registry(offline_url, token=None, timeout=2)
    transport.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_requests_transport_gives_a_forked_child_its_own_session():
    """Its own pooled connections, with the settings the application gave the parent's
    session (a child went around the configured proxy, without its headers or cookies)."""
    transport = RequestsTransport()
    parent = transport.session
    parent.headers["X-Team"] = "checkout"
    parent.proxies = {"https": "http://proxy.internal:3128"}
    parent.verify, parent.cert, parent.trust_env = "/etc/ca.pem", "/etc/client.pem", False
    parent.cookies.set("session", "sticky")
    pid = os.fork()
    if pid == 0:
        child = transport.session
        same = (child.headers["X-Team"], child.proxies, child.verify, child.cert,
                child.trust_env, child.cookies.get("session")) == (
            "checkout", {"https": "http://proxy.internal:3128"}, "/etc/ca.pem",
            "/etc/client.pem", False, "sticky")
        own_pool = child.adapters["https://"] is not parent.adapters["https://"]
        os._exit(0 if child is not parent and same and own_pool else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert transport.session is parent
    transport.close()


def test_retry_after_seconds_and_dates() -> None:
    response = requests.Response()
    response.headers["Retry-After"] = "7"
    assert retry_after(response) == 7.0
    response.headers["Retry-After"] = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after(response) == 0.0  # in the past
    response.headers["Retry-After"] = "soon"
    assert retry_after(response) is None


def test_backoff_is_full_jitter_capped() -> None:
    policy = RetryPolicy(max_retries=5, backoff_base=0.5, backoff_cap=3.0)
    for retry in range(8):
        bound = min(0.5 * 2**retry, 3.0)
        delays = [policy.delay(retry) for _ in range(200)]
        assert all(0.0 <= d <= bound for d in delays)
        assert max(delays) > bound / 2  # spread over the interval, not a constant


class _Nested(http.server.BaseHTTPRequestHandler):
    """Answers every request with JSON nested deeper than Python's parser goes."""

    status = 200
    body = b"[" * 100_000 + b"]" * 100_000

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("status", [200, 400])
def test_an_answer_nested_too_deep_is_a_failed_upload_not_an_exception(tmp_path, status, caplog):
    """A collector (or a proxy before it) answering JSON nested 100,000 deep made the JSON
    parser raise RecursionError out of flush() and close(): the application's own call
    raised, and a background flush logged a traceback."""
    handler = type("Nested", (_Nested,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        registry = Registry.from_dict({"metrics": {"dark_mode": {"kind": "boolean"}}})
        client = Client(url, tmp_path / "state", registry=registry, max_retries=0)
        client.report("dark_mode", True)
        result = client.flush(timeout=5)
        assert not result.ok and result.remaining == 1, result
        client.close(timeout=1)
        with pytest.raises(RegistryUnavailableError,
                           match="invalid registry" if status == 200 else "HTTP 400"):
            RequestsTransport().fetch_registry(url, token=None, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in caplog.text


def _tarpit() -> tuple[socket.socket, str]:
    """A collector that answers 200 and then its body a byte every 0.5 s (12 s in all)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return

            def drip(conn: socket.socket = conn) -> None:
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 24\r\n\r\n")
                    for _ in range(24):
                        time.sleep(0.5)
                        try:
                            conn.sendall(b" ")
                        except OSError:
                            return

            threading.Thread(target=drip, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_flush_and_close_timeouts_bound_an_answer_that_drips(tmp_path):
    """requests' timeout bounds each read, not the answer: an answer of a byte every half
    second held flush(2) and close(1) for 12 s each. The timeouts are wall-clock bounds,
    within GRACE (0.1 s; ``slack`` more for a loaded machine), and the request given up is
    the only one left waiting: later uploads do not start another (they fail at once). The
    close is a second client's, whose request does wait out its answer."""
    listener, url = _tarpit()
    slack = 0.3
    try:
        registry = Registry.from_dict({"metrics": {"dark_mode": {"kind": "boolean"}}})
        client = Client(url, tmp_path / "state", registry=registry)
        client.report("dark_mode", True)
        for timeout in (1.0, 1.0, 0.5):
            started = time.monotonic()
            result = client.flush(timeout=timeout)
            assert time.monotonic() - started < timeout + GRACE + slack
            assert not result.ok and result.remaining == 1
        waiting = [thread for thread in threading.enumerate() if thread.name == "veil-request"]
        assert len(waiting) <= 1, waiting
        client.close(timeout=0.5)
        other = Client(url, tmp_path / "other", registry=registry)
        other.report("dark_mode", True)
        started = time.monotonic()
        other.close(timeout=0.5)
        elapsed = time.monotonic() - started
        assert 0.5 - slack < elapsed < 0.5 + GRACE + slack  # it waited, within its bound
    finally:
        listener.close()


class _Busy(http.server.BaseHTTPRequestHandler):
    """Answers every upload 429 with ``Retry-After: 120`` and counts them."""

    posts: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.posts.append(time.monotonic())
        self.send_response(429)
        self.send_header("Retry-After", "120")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("max_retries", [5, 0])
def test_a_retry_after_longer_than_the_backoff_is_waited_before_the_next_upload(
        tmp_path, max_retries: int):
    """A collector asking for 120 s (more than the 30 s backoff cap, so the flush gives up at
    once) was sent the batch again at every flush: a background client posted every flush
    interval. Until the 120 s are over no upload is tried, and the flush says why. With no
    retries left (``max_retries=0``, as ``close()``'s last flush) the answer was dropped
    with the attempt and every flush posted again."""
    handler = type("Busy", (_Busy,), {"posts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        registry = Registry.from_dict({"metrics": {"dark_mode": {"kind": "boolean"}}})
        with Client(url, tmp_path / "state", registry=registry,
                    max_retries=max_retries) as client:
            client.report("dark_mode", True)
            first = client.flush(timeout=2)
            assert "429" in (first.error or ""), first
            later = [client.flush(timeout=2) for _ in range(3)]
            assert all("Retry-After" in (result.error or "") for result in later), later
            assert len(handler.posts) == 1 and later[-1].remaining == 1
    finally:
        server.shutdown()
        server.server_close()
