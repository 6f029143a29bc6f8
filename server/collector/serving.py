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
Connections between requests (idle keep-alive) are the other way to hold the
limit: a request every few seconds keeps a connection from ever being silent.
When nearly all of the limit is in use, the idle ones are closed, longest idle
first, so that new connections are always accepted (:meth:`_Server.readable`).
waitress multiplexes its connections in one thread with ``poll()``, so an idle
one costs only a file descriptor: the limit is high, and ``serve`` raises the
process's soft open-files limit to hold it. A connection describes itself
without its peer's address, so waitress's own log lines about a connection
never name a client.

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
import resource
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
from veil.server.collector.app_state import EXTENSION
from veil.server.collector.responses import http_error_body, too_large_message
from veil.shared.errors import VeilError

logger = logging.getLogger(__name__)

#: seconds between waitress's checks of the timeouts: a silent or slow connection is closed
#: at most this much later than its timeout
CLEANUP_INTERVAL = 1
#: worker exits within :data:`RESTART_WINDOW` seconds that stop the server instead of a restart
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
#: file descriptors one connection may hold: its socket, and the temporary files waitress
#: buffers a request body over 512 KiB and an answer over 1 MiB in
FILES_PER_CONNECTION = 3
#: file descriptors a worker holds besides its connections': standard streams, the listening
#: socket, waitress's wake-up pipe, the database's files, the log and metrics files
FILES_RESERVED = 64
#: seconds a new connection that has sent nothing is spared when idle ones are closed
FIRST_REQUEST_GRACE = 2.0
#: seconds before connections are looked over again for idle ones, after too few were found
IDLE_SCAN_INTERVAL = 0.1
#: seconds between two log lines about idle connections closed near the connection limit
PRESSURE_LOG_INTERVAL = 60.0


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
    config = {**config, "CONNECTION_LIMIT": _fit_connection_limit(config["CONNECTION_LIMIT"])}
    if config["WORKERS"] == 1:
        _serve_socket(config, sock)
        return 0
    return _supervise(config, sock)


def _fit_connection_limit(limit: int) -> int:
    """The connection limit each worker can hold within the open-files limit.

    Each connection needs up to :data:`FILES_PER_CONNECTION` descriptors and a worker
    :data:`FILES_RESERVED` more. The soft ``RLIMIT_NOFILE`` (often 1,024) is raised
    towards the hard one as far as ``limit`` needs, since a worker that runs out of
    descriptors can neither accept nor buffer; if even the hard limit is too low, the
    connection limit is lowered to fit and a warning says how to raise it. Workers inherit
    the raised limit when they are forked. :class:`VeilError` if not one connection fits.
    """
    needed = FILES_PER_CONNECTION * limit + FILES_RESERVED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        # some systems refuse values below their hard limit too (macOS: OPEN_MAX)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limit
    fits = (soft - FILES_RESERVED) // FILES_PER_CONNECTION
    if fits < 1:
        raise VeilError(f"the open-files limit ({soft}) leaves no descriptor for connections; "
                        f"raise it (ulimit -n, systemd's LimitNOFILE=) to at least {needed}")
    logger.warning("the open-files limit (%d) holds %d connections per worker, not the "
                   "--connection-limit of %d: serving at most %d; raise the hard limit "
                   "(ulimit -Hn, systemd's LimitNOFILE=) to %d for all of them",
                   soft, fits, limit, fits, needed)
    return fits


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
    """A waitress connection that knows since when its request in progress has been arriving,
    and whether it is idle."""

    error_task_class = _JsonErrorTask
    #: the request being received (waitress's parser), and since when (``time.monotonic``)
    receiving: object | None = None
    receiving_since = 0.0
    #: whether the client has sent anything yet
    heard = False

    def received(self, data: bytes) -> bool:
        self.heard = True
        done: bool = super().received(data)
        if self.request is not self.receiving:
            self.receiving = self.request
            self.receiving_since = time.monotonic()
        return done

    def idle(self, now: float) -> bool:
        """Between requests (nothing being received, served or sent, and not closing), and
        not a new connection whose first request may still be on its way: one that has sent
        nothing is idle only :data:`FIRST_REQUEST_GRACE` seconds after it was accepted
        (``now`` and waitress's times are ``time.time``)."""
        return not (self.request is not None or self.requests or self.total_outbufs_len
                    or self.will_close or self.close_when_flushed
                    or (not self.heard and now - self.creation_time < FIRST_REQUEST_GRACE))

    def __repr__(self) -> str:
        """Without the peer's address (waitress's own names it, and logs it on errors)."""
        return f"<veil connection at {id(self):#x}>"


class _Server(TcpWSGIServer):  # type: ignore[misc]
    """waitress's TCP server on a listening socket, with JSON errors, a receive deadline,
    and idle connections closed near the connection limit."""

    channel_class = _Channel

    def __init__(self, app: Flask, sock: socket.socket, adj: Adjustments, *,
                 receive_timeout: int, body_limit: int) -> None:
        self.receive_timeout = receive_timeout
        self.body_limit = body_limit
        self.idle_closed = 0
        self.idle_logged_at = -PRESSURE_LOG_INTERVAL
        self.next_idle_scan = 0.0
        super().__init__(app, _sock=sock, adj=adj, bind_socket=False,
                         sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()))

    def readable(self) -> bool:
        """Whether to accept connections now (waitress: below the connection limit), after
        making room if the limit is nearly reached.

        waitress asks this on each turn of its loop. Its limit counts its own dispatchers
        too, so ``capacity`` is what is left for connections. Once more than
        ``capacity - spare`` connections are open (``spare`` a tenth of it), idle ones are
        closed, longest idle first, until ``capacity - 2 * spare`` are left or none is
        idle. Connections sending a request, waiting for or receiving an answer are left
        alone: the receive deadline bounds those. When too few were idle, the next look
        waits :data:`IDLE_SCAN_INTERVAL`, so that connections busy near the limit do not
        cost a scan of all of them on every turn.
        """
        capacity = self.adj.connection_limit - (len(self._map) - len(self.active_channels))
        spare = max(1, capacity // 10)
        if (len(self.active_channels) > capacity - spare
                and time.monotonic() >= self.next_idle_scan):
            self._close_idle(capacity - 2 * spare)
        return bool(super().readable())

    def _close_idle(self, keep: int) -> None:
        """Close idle connections, longest idle first, until at most ``keep`` stay open."""
        channels = [channel for channel in self.active_channels.values()
                    if not (channel.will_close or channel.close_when_flushed)]
        excess = len(channels) - keep
        if excess <= 0:
            return
        now = time.time()
        idle = sorted((channel for channel in channels if channel.idle(now)),
                      key=lambda channel: channel.last_activity)[:excess]
        if len(idle) < excess:
            self.next_idle_scan = time.monotonic() + IDLE_SCAN_INTERVAL
        for channel in idle:
            channel.will_close = True  # closed by waitress's loop on its next turn
        self.idle_closed += len(idle)
        if self.idle_closed and now - self.idle_logged_at >= PRESSURE_LOG_INTERVAL:
            logger.warning(
                "open connections near the connection limit (%d of %d): closed %d idle "
                "connections, longest idle first, since the last such message", len(channels),
                self.adj.connection_limit, self.idle_closed)
            self.idle_closed = 0
            self.idle_logged_at = now

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
    if config.get("DASHBOARD"):
        _mount_dashboard(app, config)
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


def _mount_dashboard(app: Flask, config: dict[str, Any]) -> None:
    """``--dashboard``: the dashboard at /dashboard over this worker's store, to the read
    tokens. Imported only then: the dashboard shows decodes, so it loads the analysis, which
    a collector without it never does."""
    from veil.server.dashboard.app import mount

    state = app.extensions[EXTENSION]
    mount(app, state.storage, config["READ_TOKENS"], config.get("DASHBOARD_CANDIDATES"),
          state.server_metrics.exposition)


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
