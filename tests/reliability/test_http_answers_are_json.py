"""Every answer of the collector is the JSON the API documents, even those the app never sees.

waitress refuses some requests itself, before the app (malformed HTTP, headers over
256 KiB, a body far over the limit, an unsupported transfer coding): a real
``veil serve`` answers them in the API's error shape. ``OPTIONS`` (answered by
Flask for every route) is JSON too.
"""

from __future__ import annotations

import contextlib
import json
import socket

import pytest

REFUSED_BY_WAITRESS = [
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon\r\n\r\n", 400, "bad_request"),
    (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 270_000 + b"\r\n\r\n",
     431, "headers_too_large"),
    (b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
     b"Content-Length: 1000000000\r\n\r\n", 413, "body_too_large"),
    (b"POST /v1/reports HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n",
     501, "not_implemented"),
]


def exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes on a new connection; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        # waitress closes after its error answer: a reset may follow the answer
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_requests_waitress_refuses_are_answered_in_json(collector):
    for request, status, code in REFUSED_BY_WAITRESS:
        got_status, headers, body = exchange(collector.port, request)
        assert (got_status, headers["content-type"]) == (status, "application/json"), body
        error = json.loads(body)["error"]
        assert (error["code"], error["field"]) == (code, None)
        assert error["message"]


@pytest.mark.parametrize(("path", "allowed"), [
    ("/v1/reports", ["OPTIONS", "POST"]),
    ("/v1/metrics/homepage/counts", ["GET", "HEAD", "OPTIONS"]),
])
def test_options_answers_the_allowed_methods_in_json(app_factory, path, allowed):
    response = app_factory().test_client().options(path)
    assert response.status_code == 200
    assert response.json == {"allow": allowed}
    assert sorted(response.allow) == allowed
