"""The PostgreSQL database under a storage: its connection pool, the store's schema and
registry in it, readiness, and failures as :class:`StorageUnavailable`.

:class:`PostgresDatabase` is the part of
:class:`~veil.server.storage.postgres.PostgresStorage` that opens the database: a pool
of psycopg 3 connections (each with its staging tables), the store created or migrated
under an advisory lock (one creator at a time), and the registry recorded. Any failure
of the server or the connection at run time raises
:class:`~veil.server.storage.errors.StorageUnavailable` (HTTP 503, retry later).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from veil.server.storage.base import Migration, Storage, registry_to_record
from veil.server.storage.errors import (
    NoStoreError,
    SchemaNewerError,
    SchemaOutdatedError,
    StorageError,
    StorageUnavailable,
)
from veil.server.storage.postgres import schema
from veil.server.storage.postgres.outage import OUTAGE_LOG, libpq_reason
from veil.shared.registry import Registry

#: days around a report's day on which a stored id makes it a duplicate (recorded in the store
#: when it is created: every collector must agree); the day itself is always checked
REPLAY_WINDOW_DAYS = 7
#: connections per process (a collector worker's threads share them)
POOL_SIZE = 8
#: how long a call waits for a pooled connection, or for the server to answer a connect
CONNECT_TIMEOUT_S = 5.0
#: how long the readiness check waits for a pooled connection: a load balancer's probe is
#: answered 503 within this, not after CONNECT_TIMEOUT_S
READY_TIMEOUT_S = 1.0

logger = logging.getLogger("veil.server.storage")


def safe_location(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise StorageError(f"cannot read the PostgreSQL URL: {exc}") from None
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host", "")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}"


#: the fix for each reason PostgreSQL gives for refusing a connection
_CONNECT_FIXES = (
    ("password authentication failed", "check the user name and password in the URL"),
    ("role", "check the user name in the URL"),
    ("does not exist", "create the database (createdb NAME) or correct its name in the URL"),
    ("Connection refused", "check that PostgreSQL is running and listens at this host and port"),
    ("timeout", "check that PostgreSQL is running and the host is reachable"),
    ("could not translate host name", "check the host name in the URL"),
)


def connect_failure(location: str, exc: BaseException) -> str:
    """One line saying why a connection to ``location`` failed and what to do: PostgreSQL's
    own reason (``password authentication failed for user "veil"``) without libpq's
    preamble, then the fix."""
    reason = failure_reason(exc)
    fix = next((fix for clue, fix in _CONNECT_FIXES if clue in reason),
               "check the URL and the server")
    return f"cannot connect to {location}: {reason}; {fix}"


def failure_reason(exc: BaseException) -> str:
    """PostgreSQL's reason for a failure on one line (:func:`~.outage.libpq_reason`); the
    pool's timeout said in Veil's words."""
    if isinstance(exc, PoolTimeout):
        return ("no pooled connection came free in time (PostgreSQL is down or unreachable, "
                "or every connection is busy)")
    return libpq_reason(str(exc))


class PostgresDatabase(Storage):
    """The database of a PostgreSQL storage: the pool every call borrows a connection from
    (:attr:`_pool`), the store's schema and registry, readiness and closing; the storage
    built on it (:class:`~.writes.PostgresWrites`, then :class:`~.backend.PostgresStorage`)
    reads and writes through the pool, inside :meth:`_unavailable`."""

    @classmethod
    def describe(cls, url: str) -> str:
        return safe_location(url)

    def __init__(self, url: str, registry: Registry | None = None, *, create: bool = False,
                 migrate: bool = False, replay_window_days: int = REPLAY_WINDOW_DAYS,
                 pool_size: int = POOL_SIZE) -> None:
        self.url = url
        self._location = safe_location(url)
        for name, value, least in (("replay_window_days", replay_window_days, 1),
                                   ("pool_size", pool_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise StorageError(f"{name} must be an integer >= {least}; got {value!r}")
        self._use_registry(Registry([], version=1))
        self._lock = threading.Lock()
        self._closed = False
        OUTAGE_LOG.install()
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False,
                                    timeout=CONNECT_TIMEOUT_S, check=ConnectionPool.check_connection,
                                    configure=self._configure, name="veil",
                                    kwargs={"autocommit": True,
                                            "connect_timeout": int(CONNECT_TIMEOUT_S)})
        try:
            # one connection first: its error says why (a wrong password, a missing database),
            # where the pool would retry it for CONNECT_TIMEOUT_S and then only time out
            with self._connect(url):
                pass
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout:
            self._pool.close()
            raise StorageUnavailable(f"cannot connect to {self._location} within "
                                     f"{CONNECT_TIMEOUT_S:g} s; check that PostgreSQL is "
                                     "running and accepts connections") from None
        except StorageUnavailable:
            self._pool.close()
            raise
        try:
            with self._unavailable(f"open {self._location}"):
                self.migrated = self._prepare(create, migrate, replay_window_days)
                self._attach(registry)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _configure(conn: psycopg.Connection[Any]) -> None:
        """Each new pooled connection: its staging tables."""
        conn.execute(schema.STAGING)
        conn.execute(schema.AGGREGATE_STAGING)

    # -- schema and registry -------------------------------------------------------------

    @classmethod
    def _version(cls, conn: psycopg.Connection[Any], location: str) -> int | None:
        """The store's schema version (``None``: the database holds no Veil store)."""
        exists = conn.execute("SELECT to_regclass('veil_meta') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        try:
            row = conn.execute(
                "SELECT value FROM veil_meta WHERE key = 'schema_version'").fetchone()
        except psycopg.errors.UndefinedColumn:
            raise StorageError(f"{location} has a veil_meta table Veil did not write (no "
                               "key and value columns): give the database of a Veil store, "
                               "or an empty one") from None
        if row is None:
            raise StorageError(f"{location} has a veil_meta table without a schema version: "
                               "it was not written by Veil")
        try:
            return int(row[0])
        except (TypeError, ValueError):
            raise StorageError(f"{location} records schema version {str(row[0])[:40]!r} in "
                               "veil_meta, which Veil never writes: it was not written by "
                               "Veil, or was edited by hand") from None

    @classmethod
    def _check_version(cls, version: int, location: str) -> None:
        if version > schema.SCHEMA_VERSION:
            raise SchemaNewerError(
                f"{location} has schema version {version}, newer than this Veil's "
                f"({schema.SCHEMA_VERSION}): use the Veil that wrote it, or a newer one"
            )

    def _prepare(self, create: bool, migrate: bool, replay_window_days: int,
                 ) -> tuple[Migration, ...]:
        """Create the tables of a new store (one creator at a time), or bring an existing
        store to :data:`~.schema.SCHEMA_VERSION` (only if ``migrate``, else
        :class:`SchemaOutdatedError`), each step logged; read the replay window it records.
        Returns the steps applied."""
        steps: list[Migration] = []
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_SCHEMA,))
            version = self._version(conn, self._location)
            if version is None:
                if not create:
                    raise NoStoreError(f"no Veil store in {self._location}; start the collector "
                                       "with this --db first")
                for statement in schema.CREATE:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO veil_meta (key, value) VALUES ('schema_version', %s), "
                    "('replay_window_days', %s), ('retained_from', '0001-01-01')",
                    (str(schema.SCHEMA_VERSION), str(replay_window_days)))
            else:
                self._check_version(version, self._location)
                steps = schema.migration_steps(version)
                if steps and not migrate:
                    raise SchemaOutdatedError(self._location, version, schema.SCHEMA_VERSION)
                for step in steps:
                    logger.info("migrating %s: %s", self._location, step)
                    schema.MIGRATIONS[step.version](conn)
                if steps:
                    conn.execute("UPDATE veil_meta SET value = %s WHERE key = 'schema_version'",
                                 (str(schema.SCHEMA_VERSION),))
            self.replay_window_days = int(self._meta(conn, "replay_window_days"))
            self.retained_from = self._meta(conn, "retained_from")
        return tuple(steps)

    @staticmethod
    def _meta(conn: psycopg.Connection[Any], key: str) -> str:
        row = conn.execute("SELECT value FROM veil_meta WHERE key = %s", (key,)).fetchone()
        if row is None:
            raise StorageError(f"veil_meta lacks {key!r}: the store was not written by Veil")
        return str(row[0])

    @classmethod
    def _existing_version(cls, conn: psycopg.Connection[Any], location: str) -> int:
        """The schema version of the store at ``conn``: :class:`NoStoreError` if there is
        none, :class:`SchemaNewerError` if a newer Veil wrote it."""
        version = cls._version(conn, location)
        if version is None:
            raise NoStoreError(f"no Veil store in {location}; start the collector with this "
                               "--db first")
        cls._check_version(version, location)
        return version

    @classmethod
    def pending_migrations(cls, url: str) -> list[Migration]:
        location = safe_location(url)
        with cls._connect(url) as conn:
            version = cls._existing_version(conn, location)
        return schema.migration_steps(version)

    @staticmethod
    @contextlib.contextmanager
    def _connect(url: str) -> Iterator[psycopg.Connection[Any]]:
        """One connection outside any pool (checks and migrations)."""
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S))
        except psycopg.Error as exc:
            raise StorageUnavailable(connect_failure(safe_location(url), exc)) from None
        with conn:
            try:
                yield conn
            except psycopg.Error as exc:  # the server went away, or refused a statement
                reason = failure_reason(exc)
                raise StorageUnavailable(
                    f"PostgreSQL at {safe_location(url)} failed: {type(exc).__name__}"
                    + (f" ({reason})" if reason else "")
                    + "; check that it is running, then run the command again") from None

    def _attach(self, registry: Registry | None) -> Registry:
        """Record ``registry`` (:func:`~veil.server.storage.base.merge_registry`)."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (schema.LOCK_SCHEMA,))
            merged = registry_to_record(
                self._stored_registry(conn), registry,
                lambda: {row[0] for row in
                         conn.execute("SELECT DISTINCT metric FROM veil_aggregates")},
                self._location)
            if registry is not None:
                conn.execute(
                    "INSERT INTO veil_meta (key, value) VALUES ('registry', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (json.dumps(merged.to_dict(), sort_keys=True),))
            self._use_registry(merged)
            return merged

    @staticmethod
    def _stored_registry(conn: psycopg.Connection[Any]) -> Registry | None:
        row = conn.execute("SELECT value FROM veil_meta WHERE key = 'registry'").fetchone()
        if row is None:
            return None
        try:
            return Registry.from_record(json.loads(row[0]))
        except (TypeError, ValueError) as exc:
            raise StorageError(f"the registry stored in veil_meta cannot be read ({exc})") from None

    @property
    def location(self) -> str:
        return self._location

    # -- health and failures --------------------------------------------------------------

    def ping(self) -> None:
        """Readiness: the server answers, this process may write, and the store is open."""
        if self._closed:
            raise StorageUnavailable("the storage is closed")
        with self._unavailable(f"reach {self._location}"), \
                self._pool.connection(timeout=READY_TIMEOUT_S) as conn:
            conn.execute("SELECT 1 FROM veil_meta LIMIT 1").fetchall()
            read_only = conn.execute("SHOW transaction_read_only").fetchone()
        if read_only and read_only[0] == "on":
            raise StorageUnavailable(f"{self._location} is read-only (a standby?)")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.close()

    def _failure(self, action: str, exc: BaseException) -> StorageUnavailable:
        where = "" if self._location in action else f" in {self._location}"
        return StorageUnavailable(f"cannot {action}{where}: {failure_reason(exc)}")

    @contextlib.contextmanager
    def _unavailable(self, action: str) -> Iterator[None]:
        """PostgreSQL's and the pool's run-time failures as :class:`StorageUnavailable`."""
        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._failure(action, exc) from exc
        OUTAGE_LOG.recovered()
