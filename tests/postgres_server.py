"""A PostgreSQL server for the test run: a throwaway one started from the installed binaries,
or the one ``$VEIL_TEST_POSTGRES`` names.

:func:`server_for_tests` gives a :class:`PostgresServer`, or raises :class:`PostgresUnavailable`
saying why there is none and how to get one (``tests/conftest.py`` turns that into a skip, or a
failure when ``$CI`` is set). A throwaway server lives in a temporary directory (its data, its
log ``postgres.log`` and its unix socket), listens on a free port of 127.0.0.1, trusts every
local connection and is removed by :meth:`PostgresServer.close`. Debian's ``initdb`` refuses to
run as root, so as root the server runs as the ``postgres`` user (``runuser -u postgres --``).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: the environment variable naming a server to use instead of starting one
SERVER_URL_VARIABLE = "VEIL_TEST_POSTGRES"
INSTALL_HINT = (f"install the PostgreSQL server (apt-get install postgresql) or set "
                f"{SERVER_URL_VARIABLE} to the URL of a server the tests may create databases on")
#: seconds ``pg_ctl`` waits for the server to start or stop
PG_CTL_TIMEOUT = 60


class PostgresUnavailable(Exception):
    """No PostgreSQL server for the tests; the message says why and how to get one."""


def find_programs() -> tuple[Path, Path]:
    """``initdb`` and ``pg_ctl`` of one installation: on ``PATH``, else in the newest
    ``/usr/lib/postgresql/*/bin`` (where Debian and Ubuntu put them, off ``PATH``)."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb), Path(pg_ctl)
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        initdb_path, pg_ctl_path = Path(bindir, "initdb"), Path(bindir, "pg_ctl")
        if os.access(initdb_path, os.X_OK) and os.access(pg_ctl_path, os.X_OK):
            return initdb_path, pg_ctl_path
    raise PostgresUnavailable(
        f"no PostgreSQL server is installed (no initdb and pg_ctl on PATH or in "
        f"/usr/lib/postgresql/*/bin): {INSTALL_HINT}")


def _version(bindir: str) -> tuple[int, ...]:
    """``(15,)`` for ``/usr/lib/postgresql/15/bin``, so that 15 sorts after 9.6."""
    return tuple(int(part) for part in re.findall(r"\d+", Path(bindir).parent.name))


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class PostgresServer:
    """A PostgreSQL server the tests create their databases on.

    ``url``: the maintenance URL (``postgresql://postgres@127.0.0.1:PORT/postgres`` for a
    throwaway server). :meth:`create_database` and :meth:`drop_database` make and remove a
    database per test. A throwaway server (``restartable``) can be stopped and started again
    on the same port and data (:meth:`stop`, :meth:`start`), e.g. to take the database away
    from a running collector; one named by ``$VEIL_TEST_POSTGRES`` cannot.
    """

    def __init__(self, url: str, *, pg_ctl: Path | None = None, base: Path | None = None,
                 user: str | None = None) -> None:
        self.url = url
        self.port = urlsplit(url).port or 5432
        self.restartable = pg_ctl is not None
        self._pg_ctl = pg_ctl
        self._base = base
        self._user = user
        self._names = itertools.count(1)

    @classmethod
    def launch(cls) -> PostgresServer:
        """initdb a cluster into a new temporary directory and start it on a free port."""
        initdb, pg_ctl = find_programs()
        user = None
        if os.geteuid() == 0:
            user = "postgres"
            try:
                owner = pwd.getpwnam(user)
            except KeyError:
                raise PostgresUnavailable(
                    "running as root, and there is no 'postgres' user to run the server as "
                    f"(initdb refuses root): {INSTALL_HINT}") from None
            if shutil.which("runuser") is None:
                raise PostgresUnavailable("running as root without runuser, which the server "
                                          "needs to run as the 'postgres' user")
        base = Path(tempfile.mkdtemp(prefix="veil-postgres-"))
        server = cls(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", pg_ctl=pg_ctl,
                     base=base, user=user)
        try:
            if user is not None:
                os.chown(base, owner.pw_uid, owner.pw_gid)
            server._run([str(initdb), "-D", str(server.datadir), "--auth=trust", "-U", "postgres",
                         "-E", "UTF8", "--locale=C", "--no-sync"], "initdb")
            server.start()
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        return server

    @property
    def datadir(self) -> Path:
        """The cluster's data directory (throwaway servers only)."""
        assert self._base is not None, "not a server these tests started"
        return self._base / "data"

    @property
    def log_path(self) -> Path:
        """The server's log file (throwaway servers only)."""
        assert self._base is not None, "not a server these tests started"
        return self._base / "postgres.log"

    def _run(self, command: list[str], what: str) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program (as the server's user); :class:`PostgresUnavailable` with
        its output if it fails."""
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                timeout=PG_CTL_TIMEOUT + 30, check=False)
        if result.returncode != 0:
            log = ""
            if self._base is not None and self.log_path.exists():
                log = "\nserver log:\n" + self.log_path.read_text(errors="replace")[-3000:]
            raise PostgresUnavailable(
                f"{what} failed (exit code {result.returncode}): {result.stdout}{result.stderr}"
                f"{log}")
        return result

    def start(self) -> None:
        """Start the server on its port and wait until it accepts connections."""
        assert self._pg_ctl is not None and self._base is not None, \
            f"{self.url} is not a server these tests started: it cannot be started"
        options = (f"-p {self.port} -k {shlex.quote(str(self._base))} "
                   "-c listen_addresses=127.0.0.1 -c max_connections=200 "
                   # the tests stop the server, never the machine: nothing needs to reach disk
                   "-c fsync=off")
        self._run([str(self._pg_ctl), "start", "-w", "-t", str(PG_CTL_TIMEOUT), "-D",
                   str(self.datadir), "-l", str(self.log_path), "-o", options], "pg_ctl start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (sessions are ended, a clean shutdown) or ``immediate``
        (as a crash: recovery from the WAL at the next start)."""
        assert self._pg_ctl is not None, \
            f"{self.url} is not a server these tests started: it cannot be stopped"
        self._run([str(self._pg_ctl), "stop", "-w", "-t", str(PG_CTL_TIMEOUT), "-m", mode, "-D",
                   str(self.datadir)], "pg_ctl stop")

    @property
    def running(self) -> bool:
        """Whether the server is up (always assumed for a server these tests did not start)."""
        if self._pg_ctl is None:
            return True
        command = [str(self._pg_ctl), "status", "-D", str(self.datadir)]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        return subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL,
                              check=False).returncode == 0

    def close(self) -> None:
        """Stop a throwaway server and remove its directory (nothing for another server)."""
        if self._base is None:
            return
        try:
            if self.running:
                self.stop()
        finally:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None

    def connect(self) -> Any:
        """An autocommit ``psycopg`` connection to the maintenance database."""
        import psycopg

        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def database_url(self, name: str) -> str:
        """The URL of database ``name`` on this server."""
        return urlsplit(self.url)._replace(path="/" + name).geturl()

    def create_database(self) -> tuple[str, str]:
        """A new empty database: ``(name, url)``. Names carry the test run's process id, so
        that runs sharing a ``$VEIL_TEST_POSTGRES`` server do not meet."""
        from psycopg import sql

        name = f"veil_test_{os.getpid()}_{next(self._names)}"
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name, self.database_url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, ending the sessions still connected to it."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))


def server_for_tests() -> PostgresServer:
    """The server ``$VEIL_TEST_POSTGRES`` names (checked to answer), else a throwaway one
    (:meth:`PostgresServer.launch`); :class:`PostgresUnavailable` if there can be none."""
    try:
        import psycopg
    except ImportError:
        raise PostgresUnavailable("psycopg is not installed: pip install -e '.[dev]' (or the "
                                  "'postgres' extra)") from None
    url = os.environ.get(SERVER_URL_VARIABLE)
    if not url:
        return PostgresServer.launch()
    server = PostgresServer(url)
    try:
        server.connect().close()
    except psycopg.Error as exc:
        raise PostgresUnavailable(
            f"{SERVER_URL_VARIABLE}={url} does not answer ({exc}); start that server, or unset "
            f"{SERVER_URL_VARIABLE} to have the tests start one") from None
    return server
