"""Serving the collector under waitress: one process, or forked workers sharing a socket.

waitress's TCP server is extended in two ways (its channel and server classes
are subclassed, as its own ``channel_class`` and ``error_task_class`` hooks
allow): the answers waitress gives itself, before the app sees a request
(malformed HTTP 400, headers over its limit 431, a body far over the limit 413,
an unsupported transfer coding 501), are the API's JSON errors; and a client
that has not sent its whole request ``RECEIVE_TIMEOUT`` seconds after its first
byte is disconnected. waitress's own ``channel_timeout`` closes only silent
connections, so without that deadline a byte every few seconds holds a
connection, and ``CONNECTION_LIMIT`` such connections block every upload.

Imports Flask and waitress: ``veil serve`` loads this module only when it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from flask import Flask
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask

from veil.server.collector.app import create_app
from veil.server.collector.responses import http_error_body, too_large_message
from veil.server.collector.state import EXTENSION

#: seconds between waitress's checks of the timeouts: a silent or slow connection is closed
#: at most this much later than its timeout
CLEANUP_INTERVAL = 1


class _Stop(SystemExit):
    """Raised in the main thread by SIGTERM to leave the server loop cleanly.

    A ``SystemExit`` because waitress's event loop passes only those (and
    ``KeyboardInterrupt``) through its per-connection error handling.
    """


def _raise_stop(signum: int, frame: object) -> None:
    """The SIGTERM handler of the server processes: leave the server loop (:class:`_Stop`)."""
    raise _Stop


def serve(config: dict[str, Any], sock: socket.socket) -> int:
    """Serve the app for ``config`` on the listening ``sock`` until SIGTERM or SIGINT.

    Runs ``config["WORKERS"]`` processes of ``config["THREADS"]`` threads. Returns 0
    after SIGTERM/SIGINT, 1 if a worker ended on its own (see its stderr).
    """
    if config["WORKERS"] == 1:
        _serve_socket(config, sock)
        return 0
    return _supervise(config, sock)


class _JsonErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's answer to a request it refuses itself, in the API's JSON error shape."""

    def execute(self) -> None:
        error = self.request.error
        server: _Server = self.channel.server
        message = (too_large_message(server.body_limit) if error.code == 413
                   else f"{error.reason}: {error.body}")
        body = json.dumps(http_error_body(error.code, message)).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):  # type: ignore[misc]
    """A waitress connection that knows since when its request in progress has been arriving."""

    error_task_class = _JsonErrorTask
    #: the request being received (waitress's parser), and since when (``time.monotonic``)
    receiving: object | None = None
    receiving_since = 0.0

    def received(self, data: bytes) -> bool:
        done: bool = super().received(data)
        if self.request is not self.receiving:
            self.receiving = self.request
            self.receiving_since = time.monotonic()
        return done


class _Server(TcpWSGIServer):  # type: ignore[misc]
    """waitress's TCP server on a listening socket, with JSON errors and a receive deadline."""

    channel_class = _Channel

    def __init__(self, app: Flask, sock: socket.socket, adj: Adjustments, *,
                 receive_timeout: int, body_limit: int) -> None:
        self.receive_timeout = receive_timeout
        self.body_limit = body_limit
        super().__init__(app, _sock=sock, adj=adj, bind_socket=False,
                         sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()))

    def maintenance(self, now: float) -> None:
        """Close silent connections (waitress) and those too slow to send their request."""
        super().maintenance(now)
        cutoff = time.monotonic() - self.receive_timeout
        for channel in self.active_channels.values():
            if (channel.receiving is not None and not channel.requests
                    and channel.receiving_since < cutoff):
                channel.will_close = True


def _serve_socket(config: dict[str, Any], sock: socket.socket) -> None:
    """Run one waitress server on the listening ``sock`` until SIGTERM or SIGINT."""
    app = create_app(config)
    adj = Adjustments(
        sockets=[sock], threads=config["THREADS"], ident="veil",
        # Flask answers 413 for bodies over the limit; waitress only stops absurd ones
        # before buffering them
        max_request_body_size=2 * config["MAX_CONTENT_LENGTH"] + 1024 * 1024,
        clear_untrusted_proxy_headers=True,
        # batches are ~100 KiB: read them in fewer, larger chunks
        recv_bytes=65536,
        connection_limit=config["CONNECTION_LIMIT"],
        channel_timeout=config["CHANNEL_TIMEOUT"],
        cleanup_interval=CLEANUP_INTERVAL,
        # poll(), not select(): select cannot watch more than 1,024 file descriptors
        asyncore_use_poll=True,
    )
    server = _Server(app, sock, adj, receive_timeout=config["RECEIVE_TIMEOUT"],
                     body_limit=config["MAX_CONTENT_LENGTH"])
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        server.run()
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        app.extensions[EXTENSION].storage.close()


def _worker(config: dict[str, Any], sock: socket.socket, parent: int) -> None:
    """A forked worker process: serve, and stop if the parent process disappears."""

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_parent, name="veil-parent-watch", daemon=True).start()
    _serve_socket(config, sock)


def _supervise(config: dict[str, Any], sock: socket.socket) -> int:
    """Fork the worker processes sharing ``sock``; stop all when one ends or on SIGTERM."""
    parent = os.getpid()
    children: list[int] = []
    code = 0
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        for _ in range(config["WORKERS"]):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    _worker(config, sock, parent)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        pid, status = os.wait()
        print(f"veil serve: worker {pid} exited (status {status}); stopping", file=sys.stderr)
        code = 1
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return code
