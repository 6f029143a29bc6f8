"""Serving the collector under waitress: one process, or forked workers sharing a socket.

waitress's TCP server is extended in two ways (its channel and server classes
are subclassed, as its own ``channel_class`` and ``error_task_class`` hooks
allow): the answers waitress gives itself, before the app sees a request
(malformed HTTP 400, headers over its limit 431, a body far over the limit 413,
an unsupported transfer coding 501), are the API's JSON errors; and a client
that has not sent its whole request ``RECEIVE_TIMEOUT`` seconds after its first
byte is disconnected. waitress's own ``channel_timeout`` closes only silent
connections, so without that deadline a byte every few seconds holds a
connection, and ``CONNECTION_LIMIT`` such connections block every upload. A
connection describes itself without its peer's address, so waitress's own log
lines about a connection never name a client.

With several workers, the first process supervises them: a worker that ends on
its own (killed, crashed) is replaced and the event logged, unless workers keep
ending (:data:`MAX_RESTARTS` within :data:`RESTART_WINDOW` seconds), which stops
the server with status 1 rather than restart a broken worker forever.

Imports Flask and waitress: ``veil serve`` loads this module only when it runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from typing import Any

from flask import Flask
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask

from veil.server.collector.app import create_app
from veil.server.collector.responses import http_error_body, too_large_message
from veil.server.collector.state import EXTENSION

logger = logging.getLogger(__name__)

#: seconds between waitress's checks of the timeouts: a silent or slow connection is closed
#: at most this much later than its timeout
CLEANUP_INTERVAL = 1
#: worker exits within :data:`RESTART_WINDOW` seconds that stop the server instead of a restart
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0


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

    Runs ``config["WORKERS"]`` processes of ``config["THREADS"]`` threads, replacing a
    worker that ends on its own. Returns 0 after SIGTERM/SIGINT, 1 if workers kept ending
    (:data:`MAX_RESTARTS` within :data:`RESTART_WINDOW` seconds; see the log).
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

    def __repr__(self) -> str:
        """Without the peer's address (waitress's own names it, and logs it on errors)."""
        return f"<veil connection at {id(self):#x}>"


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
        # X-Forwarded-For is read by one layer only, the app's ProxyFix (create_app, so the
        # same under any WSGI server): waitress drops the proxy headers when no proxy is
        # trusted, and passes them on untouched to ProxyFix when --proxy-hops trusts some
        clear_untrusted_proxy_headers=not config["PROXY_HOPS"],
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
    logger.info("worker %d serving with %d threads", os.getpid(), config["THREADS"])
    _serve_socket(config, sock)


def _start_worker(config: dict[str, Any], sock: socket.socket, parent: int) -> int:
    """Fork a worker serving ``sock``; return its process id (in the parent)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _worker(config, sock, parent)
            code = 0
        except Exception:
            logger.exception("worker %d failed", os.getpid())
        finally:
            os._exit(code)
    return pid


def _how_it_ended(status: int) -> str:
    """A wait status in words: ``was killed by signal SIGKILL``, ``exited with status 1``."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with status {code}"


def _supervise(config: dict[str, Any], sock: socket.socket) -> int:
    """Fork the worker processes sharing ``sock`` and replace any that ends, until SIGTERM
    or SIGINT, or until workers end :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW`
    seconds."""
    parent = os.getpid()
    workers: set[int] = set()
    ended: deque[float] = deque(maxlen=MAX_RESTARTS)
    code = 0
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        for _ in range(config["WORKERS"]):
            workers.add(_start_worker(config, sock, parent))
        while True:
            pid, status = os.wait()
            if pid not in workers:
                continue
            workers.discard(pid)
            ended.append(time.monotonic())
            if len(ended) == MAX_RESTARTS and ended[-1] - ended[0] < RESTART_WINDOW:
                logger.error("worker %d %s; workers ended %d times within %.0f s, so they are "
                             "not restarted again: stopping (the errors above say why)",
                             pid, _how_it_ended(status), MAX_RESTARTS, RESTART_WINDOW)
                code = 1
                break
            replacement = _start_worker(config, sock, parent)
            workers.add(replacement)
            logger.warning("worker %d %s; started worker %d in its place",
                           pid, _how_it_ended(status), replacement)
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return code
