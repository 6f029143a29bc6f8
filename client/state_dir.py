"""The installation's state directory: secret, SQLite database, registry cache.

Layout (all files mode 0600, the directory 0700)::

    secret          32 random bytes from the OS CSPRNG; keys every memoized response
    veil.db         SQLite (WAL): the outbox, the privacy ledger and whether it covers
                    the secret's whole life, the cohort seed, the counts of dropped reports,
                    the collector's outage under way (``veil.client.outage``)
    veil.db-wal     SQLite's write-ahead log (and veil.db-shm, its index)
    registry.json   the last metric registry fetched from the collector

Whoever can read this directory holds the secret and can undo the permanent
randomization; the guarantees are against the collector and the network.

The secret outlives the database on purpose: everything memoized derives from
it (the permanent responses and, since the cohort seed derives from it too, the
cohort), so a database lost while the secret stays does not re-randomize
anything, with one exception: the ledger records which parameter sets were
reported under stream layout 1 (SDKs before layout 2 kept the fingerprint out
of some streams) and keep that layout, and a new database knows of none, so
those parameter sets draw new, layout 2 responses. What the loss always loses
is the privacy ledger. :func:`open_state` notices
(a new database beside an older secret) and records it, and the ledger then
accounts conservatively (:mod:`veil.client.accounting`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import secrets
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

from veil.client.errors import StateError
from veil.client.randomness import HmacStream

log = logging.getLogger("veil.client")

SECRET_FILE = "secret"
DATABASE_FILE = "veil.db"
REGISTRY_CACHE_FILE = "registry.json"
SECRET_BYTES = 32
SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    seq    INTEGER PRIMARY KEY,
    state  INTEGER NOT NULL DEFAULT 0,
    body   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS mechanisms (
    fingerprint TEXT PRIMARY KEY,
    metric      TEXT NOT NULL,
    params      TEXT NOT NULL,
    epsilon_1   REAL NOT NULL,
    epsilon_inf REAL NOT NULL,
    once_keys     INTEGER NOT NULL,
    repeated_keys INTEGER NOT NULL,
    layout      INTEGER NOT NULL DEFAULT 1,
    reports     INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger (
    digest  BLOB NOT NULL,
    params  TEXT NOT NULL REFERENCES mechanisms (fingerprint),
    metric  TEXT NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (digest, params)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters (name, value)
    SELECT 'queued', (SELECT COUNT(*) FROM outbox)
    WHERE NOT EXISTS (SELECT 1 FROM counters WHERE name = 'queued');
CREATE TRIGGER IF NOT EXISTS outbox_queued AFTER INSERT ON outbox BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'queued';
END;
CREATE TRIGGER IF NOT EXISTS outbox_unqueued AFTER DELETE ON outbox BEGIN
    UPDATE counters SET value = value - 1 WHERE name = 'queued';
END;
"""


def prepare_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (mode 0700) if missing and check that it is a usable directory;
    ``~`` and environment variables in it are expanded, as a shell would."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise StateError(f"state_dir must be a directory path; got {path!r}")
    directory = Path(os.path.expandvars(os.fspath(path))).expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"state_dir {directory}: cannot create it: {exc.strerror}") from None
    if not directory.is_dir():
        raise StateError(f"state_dir {directory} exists but is not a directory")
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
        raise StateError(f"state_dir {directory} is not readable and writable by this user")
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077:
        with contextlib.suppress(OSError):
            directory.chmod(0o700)
    return directory


def load_secret(directory: Path) -> bytes:
    """The installation secret: read it, or create it (race-free) on first use."""
    path = directory / SECRET_FILE
    if not path.exists():
        temporary = directory / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(8)}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, secrets.token_bytes(SECRET_BYTES))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)  # atomic: never a half-written secret, first writer wins
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    try:
        secret = path.read_bytes()
    except OSError as exc:
        raise StateError(f"cannot read the installation secret {path}: {exc.strerror}") from None
    if len(secret) != SECRET_BYTES:
        raise StateError(
            f"the installation secret {path} has {len(secret)} bytes, expected {SECRET_BYTES}; "
            "it is damaged. Deleting the state directory starts a new installation "
            "(its privacy ledger starts again from zero)."
        )
    return secret


def open_database(directory: Path) -> sqlite3.Connection:
    """Open (creating if needed) the state database in WAL mode with the schema in place.

    ``synchronous=NORMAL`` in WAL mode: a committed transaction survives the
    application crashing or being killed; after a power loss or OS crash the
    last few commits may be rolled back (the database itself stays intact).
    """
    path = directory / DATABASE_FILE
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(descriptor)
    try:
        connection = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        # small pages: each commit appends whole pages to the WAL, and a report is ~100
        # bytes (takes effect when the database is created, before WAL mode is set)
        connection.execute("PRAGMA page_size=1024")
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.executescript(f"BEGIN IMMEDIATE;{SCHEMA}COMMIT;")
        _check_schema_version(connection, path)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"cannot open the state database {path}: {exc}") from None
    return connection


@contextlib.contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """Run the block as one write transaction: committed if it ends, rolled back if it raises.

    ``BEGIN IMMEDIATE`` takes the write lock up front, so no other process
    writes between what the block reads and what it writes (the ledger).
    """
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        # SQLite rolls back by itself after some errors (SQLITE_FULL, SQLITE_IOERR, ...):
        # a ROLLBACK then fails and would hide the error that caused it
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


def _check_schema_version(connection: sqlite3.Connection, path: Path) -> None:
    """Record the schema version of a new database, move one of version 1 or 2 to the
    current version, and refuse one of any other version.

    Version 2 added ``mechanisms.layout``, the stream layout of each parameter set's
    memoized responses (:data:`veil.client.randomness.STREAM_LAYOUT`). Every parameter
    set recorded by a version 1 database was reported under layout 1, and keeps it: its
    rows get ``layout = 1`` (the column's default). An SDK of version 1 refuses the
    database afterwards, as it would derive layout 1 responses for every parameter set.

    Version 3 added ``mechanisms.reports``, how many reports each parameter set queued (a
    budget is charged by it: :func:`veil.client.accounting.worst_cost`). Earlier versions
    did not count them: their rows get ``NULL``, unknown, which a budget charges as any
    number of reports. An SDK of version 2 refuses the database afterwards, as it would
    not count its reports.
    """
    with transaction(connection):
        connection.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )
        found = _meta(connection, "schema_version")
        if found in ("1", "2"):
            columns = [row[1] for row in connection.execute("PRAGMA table_info(mechanisms)")]
            if "layout" not in columns:
                connection.execute(
                    "ALTER TABLE mechanisms ADD COLUMN layout INTEGER NOT NULL DEFAULT 1")
            if "reports" not in columns:
                connection.execute("ALTER TABLE mechanisms ADD COLUMN reports INTEGER")
            _set_meta(connection, "schema_version", str(SCHEMA_VERSION))
            found = str(SCHEMA_VERSION)
    if found != str(SCHEMA_VERSION):
        raise StateError(
            f"the state database {path} has schema version {found}; this SDK reads version "
            f"{SCHEMA_VERSION}. Upgrade the SDK or start a new state directory."
        )


def open_state(directory: Path) -> tuple[sqlite3.Connection, bytes]:
    """Open the state database, note whether its ledger covers the secret's life, load the secret.

    The database is opened (and created if missing) *before* the secret is read
    or created, and :func:`_note_ledger_origin` runs in between: a database made
    before its secret has seen every report, one made after an existing secret
    has lost the ledger of the reports before it.
    """
    connection = open_database(directory)
    try:
        _note_ledger_origin(connection, directory / SECRET_FILE)
        secret = load_secret(directory)
    except BaseException:
        connection.close()
        raise
    return connection, secret


def _note_ledger_origin(connection: sqlite3.Connection, secret_path: Path) -> None:
    """Record once, in ``meta``, whether this database's ledger covers every report of the secret.

    ``ledger`` is ``complete`` for a database created before its secret, or one
    from an SDK older than this record (it holds a ``cohort_seed``: it has kept
    the ledger since the installation began). It is ``lost`` for a database
    created while the secret already existed: the database was deleted or
    replaced, and the reports made before are unaccounted (``ledger_lost_at``
    says when that was noticed). The record is never changed afterwards.
    """
    with transaction(connection):
        if _meta(connection, "ledger") is not None:
            return
        if _meta(connection, "cohort_seed") is not None or not secret_path.exists():
            _set_meta(connection, "ledger", "complete")
            return
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        _set_meta(connection, "ledger", "lost")
        _set_meta(connection, "ledger_lost_at", when)
    log.warning(
        "the state database %s is new but the installation secret %s is not: the privacy "
        "ledger of earlier reports was lost. Veil now counts that unknown spend as the whole "
        "budget (or as unbounded without one) and charges every value's first report at "
        "epsilon_inf; see 'Losing the state database' in docs/client.md",
        secret_path.with_name(DATABASE_FILE), secret_path,
    )


def ledger_lost_at(connection: sqlite3.Connection) -> str | None:
    """When the ledger was found lost (ISO 8601, UTC), or ``None`` if it is complete."""
    return _meta(connection, "ledger_lost_at") if _meta(connection, "ledger") == "lost" else None


def derived_cohort_seed(secret: bytes) -> int:
    """The cohort seed of ``secret``: the first 8 bytes (big-endian) of the stream with
    purpose ``cohort``, no metric and no context (``docs/protocol.md``, section 5)."""
    return int.from_bytes(HmacStream(secret, b"cohort", "", b"").read(8), "big")


def cohort_seed(connection: sqlite3.Connection, secret: bytes) -> int:
    """The installation's cohort seed: the one stored in the database, else derived from ``secret``.

    A database from an older SDK keeps the random seed it stored (moving its
    installation to another cohort would give every value it reported a new,
    independent permanent response). Otherwise the seed is derived from the
    secret, so it survives the database, and is stored too, so that an older SDK
    opening this database reads the same seed instead of drawing one.
    """
    connection.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('cohort_seed', ?)",
        (str(derived_cohort_seed(secret)),),
    )
    (value,) = connection.execute("SELECT value FROM meta WHERE key = 'cohort_seed'").fetchone()
    return int(value)


def _meta(connection: sqlite3.Connection, key: str) -> str | None:
    row = connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _set_meta(connection: sqlite3.Connection, key: str, value: str) -> None:
    connection.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
