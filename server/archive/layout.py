"""The archive on disk: partition paths, the Arrow schema of its files, and the manifest.

An archive is a directory of Parquet files, one per (metric, day, bucket, source)::

    manifest.json
    metric=homepage/day=2026-11-01/bucket=00/part-main.parquet
    metric=homepage/day=2026-11-01/bucket=01/part-main.parquet
    ...

Each file holds raw reports as columns ``id`` (``fixed_size_binary(16)``), ``cohort``
(int32) and ``payload``, typed by the metric's statistic (``payload_type``):
``fixed_size_binary(width)`` for ``bytes``, int64 for ``int``, float64 for ``float``.
The partition columns live in the path only (Hive style, as Spark, DuckDB and
``pyarrow.dataset`` read them). A report's bucket is its id's first byte modulo the
number of buckets, so every copy of a replayed id lands in the same bucket and exact
duplicates are found bucket by bucket.

Every file is 0600 and every directory 0700 whatever the umask (:func:`create_private`,
:func:`make_private_dirs`): they hold the raw reports the store keeps.

``manifest.json`` is the archive's table of contents, and the only one readers trust:
a file not listed (a temporary file, a stray copy) is not part of the archive. It holds
the format and its version, the registry the reports were made with
(:meth:`~veil.shared.registry.Registry.to_dict`), the number of buckets, and per file its
path (relative, ``/``-separated), metric, day, bucket, source and rows.

This module does not import Dask: any engine can plan its work with
:meth:`Manifest.tasks` and run :func:`veil.server.archive.bucket.aggregate_bucket`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from veil.server.storage.base import parse_day
from veil.shared.errors import ParameterError, VeilError
from veil.shared.registry import Registry
from veil.shared.statistics import Statistic

#: what ``manifest.json`` says it is
FORMAT = "veil-archive"
#: the layout this Veil writes and reads; another version is refused, never misread
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DEFAULT_BUCKETS = 16
#: a bucket is the first id byte modulo the buckets, so more than 256 would stay empty
MAX_BUCKETS = 256
#: names a source (a store, e.g. one shard of a deployment) in file names
SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_SOURCE = "main"
ID_BYTES = 16
#: the mode of every archive file and directory, whatever the umask: they hold raw reports
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


class ArchiveError(VeilError):
    """The archive cannot be read or written as asked (missing, another format version,
    a file that disagrees with the manifest, a metric the target store does not hold)."""


class ArchiveUsageError(ArchiveError, ParameterError):
    """The caller named what is no archive, a metric it does not hold, or an ``--end`` day
    that is not over: a usage error of a command (exit 2), nothing was done."""

    def __init__(self, field: str, message: str) -> None:
        ParameterError.__init__(self, field, message)


@dataclasses.dataclass(frozen=True)
class ArchiveFile:
    """One Parquet file of the archive, as the manifest lists it."""

    path: str
    metric: str
    day: str
    bucket: int
    source: str
    rows: int

    def to_dict(self) -> dict[str, Any]:
        """The manifest entry."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BucketTask:
    """The files of one (metric, day, bucket): the unit of work of an aggregation.

    ``paths`` are absolute; ``rows`` is what the manifest says they hold together.
    """

    metric: str
    day: str
    bucket: int
    paths: tuple[str, ...]
    rows: int


def bucket_dir(metric: str, day: str, bucket: int) -> str:
    """The partition directory of a (metric, day, bucket), relative to the archive root."""
    return f"metric={metric}/day={day}/bucket={bucket:02d}"


def file_name(source: str) -> str:
    """The name of a source's file in a bucket directory: fixed, so a rerun replaces it."""
    return f"part-{source}.parquet"


def check_source(source: str) -> str:
    """``source`` if it can name files; :class:`ParameterError` otherwise."""
    if not isinstance(source, str) or not SOURCE_NAME.fullmatch(source):
        raise ParameterError("source", f"a source name uses only A-Z, a-z, 0-9, '_' and '-' "
                                       f"(at most 64 characters); got {source!r}")
    return source


def check_buckets(buckets: int) -> int:
    """``buckets`` if it is a whole number in ``[1, 256]``; :class:`ParameterError` otherwise."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) \
            or not 1 <= buckets <= MAX_BUCKETS:
        raise ParameterError("buckets", f"buckets must be an integer in [1, {MAX_BUCKETS}] "
                                        f"(a power of two spreads ids evenly); got {buckets!r}")
    return buckets


def bucket_of(ids: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each report: the first byte of its ``(n, 16)`` uint8 id modulo
    ``buckets`` (ids are random, so buckets are even when ``buckets`` divides 256)."""
    return np.asarray(ids, dtype=np.uint8)[:, 0] % np.uint8(buckets)


def payload_arrow_type(statistic: Statistic, width: int = 0) -> pa.DataType:
    """The Arrow type of the ``payload`` column for ``statistic`` (``width``: bytes per
    payload, for ``bytes`` payloads)."""
    if statistic.payload_type == "bytes":
        return pa.binary(width)
    return pa.int64() if statistic.payload_type == "int" else pa.float64()


def to_table(statistic: Statistic, ids: np.ndarray, cohorts: np.ndarray,
             payloads: np.ndarray) -> pa.Table:
    """Reports as an archive table (arrays as :class:`~veil.server.storage.StoredReports`
    holds them)."""
    ids = np.ascontiguousarray(ids, dtype=np.uint8).reshape(-1, ID_BYTES)
    count = len(ids)
    columns: dict[str, pa.Array] = {
        "id": pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(ID_BYTES), count, [None, pa.py_buffer(ids)]),
        "cohort": pa.array(np.asarray(cohorts, dtype=np.int32)),
    }
    if statistic.payload_type == "bytes":
        raw = np.ascontiguousarray(payloads, dtype=np.uint8)
        width = raw.shape[1] if raw.ndim == 2 else 0
        columns["payload"] = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), count, [None, pa.py_buffer(raw)])
    else:
        dtype = np.int64 if statistic.payload_type == "int" else np.float64
        columns["payload"] = pa.array(np.asarray(payloads, dtype=dtype))
    return pa.table(columns)


def from_table(statistic: Statistic, table: pa.Table, where: str,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, cohorts, payloads)`` of an archive table as NumPy arrays (``(n, 16)`` uint8,
    int64, and payloads as :meth:`Statistic.accumulate_arrays` takes them); ``where``
    names the table in errors (:class:`ArchiveError` for missing columns, wrong types, nulls)."""
    missing = [name for name in ("id", "cohort", "payload") if name not in table.column_names]
    if missing:
        raise ArchiveError(f"{where} has no column {missing[0]!r}; an archive file has "
                           "columns id, cohort and payload")
    ids = _fixed_binary(table.column("id"), f"{where}: column id", ID_BYTES)
    cohort_column = table.column("cohort")
    if not pa.types.is_integer(cohort_column.type) or cohort_column.null_count:
        raise ArchiveError(f"{where}: column cohort must hold integers without nulls; it is "
                           f"{cohort_column.type} with {cohort_column.null_count} nulls")
    cohorts = cohort_column.to_numpy().astype(np.int64, copy=False)
    payload_column = table.column("payload")
    if statistic.payload_type == "bytes":
        width = payload_column.type.byte_width \
            if pa.types.is_fixed_size_binary(payload_column.type) else None
        payloads = _fixed_binary(payload_column, f"{where}: column payload", width)
    else:
        wanted = payload_arrow_type(statistic)
        if payload_column.type != wanted or payload_column.null_count:
            raise ArchiveError(f"{where}: column payload must be {wanted} without nulls for a "
                               f"{statistic.name!r} statistic; it is {payload_column.type}")
        payloads = payload_column.to_numpy()
    return ids, cohorts, payloads


def _fixed_binary(column: pa.ChunkedArray, where: str, width: int | None) -> np.ndarray:
    """A ``fixed_size_binary(width)`` column without nulls as an ``(n, width)`` uint8 array."""
    if width is None or column.type != pa.binary(width) or column.null_count:
        raise ArchiveError(f"{where} must be fixed_size_binary"
                           f"{'' if width is None else f'({width})'} without nulls; it is "
                           f"{column.type} with {column.null_count} nulls")
    parts = []
    for chunk in column.chunks:
        data = chunk.buffers()[1]
        if data is None:
            parts.append(np.zeros((0, width), dtype=np.uint8))
            continue
        parts.append(np.frombuffer(data, dtype=np.uint8, count=len(chunk) * width,
                                   offset=chunk.offset * width).reshape(len(chunk), width))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.uint8)


@dataclasses.dataclass
class Manifest:
    """``manifest.json`` of the archive at ``root``: read with :meth:`load`, written with
    :meth:`save` (atomically: a temporary file renamed over the old one)."""

    root: Path
    registry: Registry
    buckets: int
    files: list[ArchiveFile]

    @property
    def path(self) -> Path:
        """Where the manifest lives."""
        return self.root / MANIFEST

    @classmethod
    def load(cls, root: str | Path) -> Manifest:
        """The manifest of the archive at ``root``; :class:`ArchiveError` saying what is
        wrong when the directory or its manifest is missing or unreadable, or written in
        another format version."""
        root = Path(root)
        if not root.is_dir():
            raise ArchiveUsageError("archive", f"{root} is not a directory; give the --out "
                                               "directory of a veil archive run")
        path = root / MANIFEST
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArchiveError(f"{root} has no {MANIFEST}: it is not a Veil archive, or "
                               "veil archive has not finished writing to it yet") from None
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"cannot read {path}: {exc}") from None
        return cls.from_dict(root, document)

    @classmethod
    def from_dict(cls, root: Path, document: Any) -> Manifest:
        """Parse a manifest document (:class:`ArchiveError` naming the problem)."""
        where = root / MANIFEST
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ArchiveError(f"{where} is not a Veil archive manifest "
                               f"(no \"format\": {FORMAT!r})")
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            newer = isinstance(version, int) and version > FORMAT_VERSION
            raise ArchiveError(
                f"{where} has format version {version!r}; this Veil reads version "
                f"{FORMAT_VERSION}. " + ("Upgrade Veil to read it." if newer else
                                         "Write the archive again with this Veil's veil archive."))
        try:
            registry = Registry.from_record(document["registry"])
            buckets = check_buckets(document["buckets"])
            files = [ArchiveFile(str(entry["path"]), str(entry["metric"]),
                                 str(parse_day(entry["day"], "day")), int(entry["bucket"]),
                                 str(entry["source"]), int(entry["rows"]))
                     for entry in document["files"]]
        except (KeyError, TypeError, ValueError, VeilError) as exc:
            raise ArchiveError(f"{where} is malformed: {exc}") from None
        for entry in files:
            if entry.metric not in registry:
                raise ArchiveError(f"{where} is malformed: it lists files of metric "
                                   f"{entry.metric!r}, which its registry does not define")
            folder, _, name = entry.path.rpartition("/")
            if folder != bucket_dir(entry.metric, entry.day, entry.bucket) \
                    or not name.endswith(".parquet") or name.startswith(".") \
                    or not 0 <= entry.bucket < buckets:
                raise ArchiveError(
                    f"{where} is malformed: {entry.path!r} is not a file of metric "
                    f"{entry.metric!r}, day {entry.day}, bucket {entry.bucket} (expected "
                    f"{bucket_dir(entry.metric, entry.day, entry.bucket)}/NAME.parquet)")
        return cls(root, registry, buckets, files)

    def to_dict(self) -> dict[str, Any]:
        """The manifest document; files sorted by metric, day, bucket and source."""
        files = sorted(self.files, key=lambda f: (f.metric, f.day, f.bucket, f.source))
        return {"format": FORMAT, "format_version": FORMAT_VERSION,
                "registry": self.registry.to_dict(), "buckets": self.buckets,
                "files": [entry.to_dict() for entry in files]}

    def save(self) -> None:
        """Write the manifest atomically and durably (temporary file, fsync, rename)."""
        temporary = self.root / f".{MANIFEST}.{os.getpid()}.tmp"
        with open(create_private(temporary), "w", encoding="utf-8") as stream:
            json.dump(self.to_dict(), stream, indent=1)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, self.path)
        fsync_path(self.root)

    def tasks(self, metric: str | None = None, start: str | None = None,
              end: str | None = None) -> list[BucketTask]:
        """One :class:`BucketTask` per (metric, day, bucket) with files, over days
        ``start``..``end`` (either ``None``: open), for one metric or all; sorted."""
        if metric is not None and metric not in {entry.metric for entry in self.files}:
            known = ", ".join(sorted({entry.metric for entry in self.files})) or "none"
            raise ArchiveUsageError("metric", f"the archive {self.root} has no reports of "
                                              f"metric {metric!r} (it has: {known})")
        grouped: dict[tuple[str, str, int], list[ArchiveFile]] = {}
        for entry in self.files:
            if metric not in (None, entry.metric) or (start and entry.day < start) \
                    or (end and entry.day > end):
                continue
            grouped.setdefault((entry.metric, entry.day, entry.bucket), []).append(entry)
        root = self.root.resolve()
        return [BucketTask(name, day, bucket,
                           tuple(str(root / entry.path) for entry in sorted(
                               entries, key=lambda e: e.source)),
                           sum(entry.rows for entry in entries))
                for (name, day, bucket), entries in sorted(grouped.items())]


def create_private(path: Path) -> int:
    """Open ``path`` for writing, created or truncated, readable and writable by its owner
    only (0600) whatever the umask: archive files hold the same raw reports as the store,
    which is 0600 too. Returns the descriptor; pyarrow then writes the file by name, which
    keeps its mode."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.fchmod(descriptor, PRIVATE_FILE)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def make_private_dirs(path: Path) -> None:
    """Create the directory ``path`` and its missing parents, each 0700 whatever the umask;
    an existing ``path`` that others may enter is made 0700 too (it holds the archive)."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue
        os.chmod(folder, PRIVATE_DIR)
    if stat.S_IMODE(path.stat().st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)


def fsync_path(path: Path) -> None:
    """fsync a file, so its contents survive a power cut, or a directory, so the renames
    into it do."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def metrics_of(tasks: Iterable[BucketTask]) -> list[str]:
    """The metrics the tasks cover, sorted."""
    return sorted({task.metric for task in tasks})
