"""Serving the collector under waitress: one process, or forked workers sharing a socket.

Imports Flask and waitress: ``veil serve`` loads this module only when it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import waitress

from veil.server.collector.app import create_app
from veil.server.collector.state import EXTENSION


class _Stop(SystemExit):
    """Raised in the main thread by SIGTERM to leave the server loop cleanly.

    A ``SystemExit`` because waitress's event loop passes only those (and
    ``KeyboardInterrupt``) through its per-connection error handling.
    """


def serve(config: dict[str, Any], sock: socket.socket) -> int:
    """Serve the app for ``config`` on the listening ``sock`` until SIGTERM or SIGINT.

    Runs ``config["WORKERS"]`` processes of ``config["THREADS"]`` threads. Returns 0
    after SIGTERM/SIGINT, 1 if a worker ended on its own (see its stderr).
    """
    if config["WORKERS"] == 1:
        _serve_socket(config, sock)
        return 0
    return _supervise(config, sock)


def _serve_socket(config: dict[str, Any], sock: socket.socket) -> None:
    """Run one waitress server on the listening ``sock`` until SIGTERM or SIGINT."""
    app = create_app(config)
    server = waitress.create_server(
        app, sockets=[sock], threads=config["THREADS"], ident="veil",
        # Flask answers 413 as JSON for bodies over the limit; waitress (plain-text 413)
        # only stops absurd ones before buffering them
        max_request_body_size=2 * config["MAX_CONTENT_LENGTH"] + 1024 * 1024,
        clear_untrusted_proxy_headers=True,
        # batches are ~100 KiB: read them in fewer, larger chunks
        recv_bytes=65536,
    )

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
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

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, stop)
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
