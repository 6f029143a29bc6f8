"""``veil archive``: the raw reports of a store written as a Parquet archive.

:func:`archive` reads the reports of whole UTC days with
:meth:`~veil.server.storage.Storage.iter_reports`, one scan per window of consecutive
days (about :data:`WINDOW_REPORTS` reports), splits them by (metric, day, bucket) and
writes one Parquet file per bucket under a temporary name, renamed to its fixed name
(``part-<source>.parquet``) once complete; the manifest is rewritten after each window.
A rerun of a day therefore replaces its files instead of adding copies, and a run that
stops half-way keeps the windows it finished and leaves the other days as they were
(the next run removes its temporary files). Every file is created 0600 and every
directory 0700, whatever the umask, and a run makes private the files an earlier Veil
left to the umask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import logging
import os
import secrets
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from veil.server.archive.layout import (
    DEFAULT_BUCKETS,
    DEFAULT_SOURCE,
    MANIFEST,
    PRIVATE_DIR,
    PRIVATE_FILE,
    ArchiveError,
    ArchiveFile,
    ArchiveUsageError,
    Manifest,
    bucket_dir,
    bucket_of,
    check_buckets,
    check_source,
    create_private,
    file_name,
    fsync_path,
    make_private_dirs,
    to_table,
)
from veil.server.storage.base import (
    Storage,
    StoredReports,
    day_range,
    merge_registry,
    today,
    yesterday,
)
from veil.shared.errors import ParameterError
from veil.shared.statistics import statistic_for

logger = logging.getLogger("veil.server.archive")

#: reports per Parquet row group: large enough that readers fetch long runs of each column
ROW_GROUP_REPORTS = 1_048_576
#: reports held in memory across all the files being written; beyond it, the largest
#: queues are spilled to temporary parts (which may make shorter row groups)
BUFFERED_REPORTS = 4 * ROW_GROUP_REPORTS
#: Parquet compression of the files (ids and payloads are random; cohorts compress well)
COMPRESSION = "zstd"
#: reports per chunk asked of the store
BATCH_REPORTS = 262_144
#: reports of the days read in one scan of the store, written, then listed in the manifest
#: before the next days: a stopped run keeps the windows it finished, and a store that
#: holds a (metric, day)'s reports until it has them all holds one window's at most
WINDOW_REPORTS = 4 * ROW_GROUP_REPORTS


@dataclasses.dataclass
class ArchiveSummary:
    """What :func:`archive` did.

    ``days``: the (metric, day) pairs written; ``skipped``: pairs already archived and left
    as they were (no ``start`` given); ``empty``: pairs the store counts reports for but
    holds no raw reports of any more (their archived files, if any, were kept).
    """

    out_dir: Path
    start: str | None
    end: str
    days: list[tuple[str, str]]
    reports: int
    files: int
    skipped: int
    empty: list[tuple[str, str]]
    seconds: float

    def __str__(self) -> str:
        span = f"{self.start or 'the first day'} to {self.end}"
        if not self.days:
            text = f"no new days to archive from {span} in {self.out_dir}"
        else:
            text = (f"archived {self.reports:,} reports of {len(self.days)} (metric, day) "
                    f"pairs from {span} into {self.files} files in {self.out_dir} "
                    f"({self.seconds:.1f} s)")
        if self.skipped:
            text += (f"; {self.skipped} (metric, day) pairs already archived were left as "
                     "they are (give --start to write them again)")
        if self.empty:
            text += (f"; {len(self.empty)} (metric, day) pairs have no raw reports left in the "
                     "store, and were kept as archived")
        return text


class _BucketFile:
    """The file of one (metric, day, bucket) being written.

    Reports wait in memory; a full row group, or a queue written early to bound memory
    (:meth:`spill`), goes to a closed temporary part, so that however many days one scan
    of the store interleaves, no file stays open. :meth:`commit` streams the parts and the
    rest of the queue into the file, in row groups of ``row_group`` reports, and renames it.
    """

    def __init__(self, root: Path, relative: str, schema: pa.Schema, row_group: int,
                 compression: str) -> None:
        self.relative = relative
        self.final = root / relative
        self.stem = f".{self.final.name}.{os.getpid()}-{secrets.token_hex(4)}"
        self.temporary = self.final.with_name(f"{self.stem}.tmp")
        self.schema = schema
        self.row_group = row_group
        self.compression = compression
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.parts: list[Path] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        """Queue reports; a full row group goes to a temporary part."""
        if table.schema != self.schema:
            raise ArchiveError(f"{self.relative}: reports of one metric arrive with different "
                               f"columns ({table.schema} and {self.schema})")
        self.pending.append(table)
        self.pending_rows += table.num_rows
        self.rows += table.num_rows
        if self.pending_rows >= self.row_group:
            self.spill()

    def spill(self) -> None:
        """Write the queue to a new temporary part, and empty it."""
        if not self.pending_rows:
            return
        part = self.final.with_name(f"{self.stem}.{len(self.parts)}.tmp")
        make_private_dirs(self.final.parent)
        self.parts.append(part)
        os.close(create_private(part))
        pq.write_table(pa.concat_tables(self.pending), part, compression="none",
                       use_dictionary=False, write_statistics=False)
        self.pending, self.pending_rows = [], 0

    def commit(self) -> None:
        """Write the parts and the queue to the file, make it durable and give it its name."""
        if not self.rows:
            return
        make_private_dirs(self.final.parent)
        os.close(create_private(self.temporary))
        with pq.ParquetWriter(self.temporary, self.schema, compression=self.compression,
                              use_dictionary=["cohort"], write_statistics=["cohort"]) as writer:
            waiting: list[pa.Table] = []
            count = 0
            for table in [*(pq.ParquetFile(part).read() for part in self.parts),
                          *self.pending]:
                waiting.append(table)
                count += table.num_rows
                if count >= self.row_group:
                    whole = pa.concat_tables(waiting)
                    size = (count // self.row_group) * self.row_group
                    writer.write_table(whole.slice(0, size), row_group_size=self.row_group)
                    waiting, count = [whole.slice(size)], count - size
            if count:
                writer.write_table(pa.concat_tables(waiting), row_group_size=self.row_group)
        fsync_path(self.temporary)
        os.replace(self.temporary, self.final)
        fsync_path(self.final.parent)
        self.discard_parts()

    def discard_parts(self) -> None:
        """Remove the temporary parts."""
        for part in self.parts:
            part.unlink(missing_ok=True)
        self.parts = []

    def abort(self) -> None:
        """Remove the temporary file and parts."""
        self.discard_parts()
        self.temporary.unlink(missing_ok=True)


def archive(storage: Storage, out_dir: str | Path, *, metric: str | None = None,
            start: dt.date | str | None = None, end: dt.date | str | None = None,
            buckets: int | None = None, source: str = DEFAULT_SOURCE,
            row_group_reports: int = ROW_GROUP_REPORTS, compression: str = COMPRESSION,
            progress: bool | None = None) -> ArchiveSummary:
    """Write the raw reports of days ``start``..``end`` (UTC, inclusive) of ``storage`` to
    the Parquet archive at ``out_dir`` (created if need be), for one metric or all.

    ``end`` defaults to yesterday: only days that are over, whose reports no longer change
    (a later ``end`` is refused). Without ``start``, the days already
    in the archive from this ``source`` are left as they are, so a nightly run writes only
    the new ones; with ``start``, every day of the range is written again, its files
    replaced. ``buckets`` (1 to 256, default: the archive's, or 16 for a new one) must be
    the archive's. ``source`` names the store in file names (``part-<source>.parquet``):
    archives of several stores of one deployment (shards) can share a directory, and a
    rerun replaces only its own source's files. ``progress``: a tqdm bar (default: when
    stderr is a terminal). Raises :class:`ArchiveError` (or a
    :class:`~veil.server.storage.StorageError`) saying what is wrong.
    """
    began = time.monotonic()
    source = check_source(source)
    if metric is not None:
        storage.metric(metric)
    start_text, end_text = day_range(start, end)
    if end_text is None:
        end_text = yesterday()
        logger.info("archiving the days up to %s, yesterday (UTC): days that are over "
                    "(--end chooses another last day)", end_text)
        start_text, end_text = day_range(start_text, end_text)
    elif end_text > yesterday():
        # a day archived before it is over is left as it is by the nightly run (its files
        # exist), and veil aggregate would then set its counts short of the store's
        raise ArchiveUsageError(
            "end", f"--end {end_text} is a UTC day that is not over (today is {today()}): "
                   f"reports keep arriving under it. Archive the days that are over (--end "
                   f"{yesterday()}, the default); the nightly run archives today once it is over")
    assert end_text is not None
    if isinstance(row_group_reports, bool) or not isinstance(row_group_reports, int) \
            or row_group_reports < 1:
        raise ParameterError("row_group_reports", "row_group_reports must be a whole number "
                                                  f">= 1; got {row_group_reports!r}")
    out = Path(out_dir)
    try:
        make_private_dirs(out)
    except OSError as exc:
        raise ArchiveError(f"cannot create the archive directory {out}: {exc.strerror}") from None
    written: dict[tuple[str, str], int] = {}
    files = 0
    with _locked(out):
        manifest = _open_manifest(out, storage, buckets)
        _remove_temporaries(out)
        _make_private(manifest)
        archived = {(entry.metric, entry.day) for entry in manifest.files
                    if entry.source == source}
        wanted: dict[tuple[str, str], int] = {}
        skipped = 0
        for row in storage.daily_reports(metric, start_text, end_text):
            if start_text is None and (row.metric, row.day) in archived:
                skipped += 1
            else:
                wanted[(row.metric, row.day)] = row.reports
        with tqdm(total=sum(wanted.values()), unit=" reports", unit_scale=True,
                  desc="veil archive",
                  disable=not (sys.stderr.isatty() if progress is None else progress)) as bar:
            for window in _windows(wanted):
                done = _write(storage, manifest, window, metric, source, row_group_reports,
                              compression, bar)
                written.update(_record(manifest, done, source))
                files += len(done)
        manifest.save()  # a new archive with nothing to write yet gets its manifest too
    for key in sorted(written):
        if written[key] != wanted[key]:
            logger.warning("metric %r on %s: %d raw reports archived, but the store's "
                           "aggregates count %d", key[0], key[1], written[key], wanted[key])
    return ArchiveSummary(out, start_text, end_text, sorted(written), sum(written.values()),
                          files, skipped, sorted(set(wanted) - set(written)),
                          time.monotonic() - began)


def _windows(wanted: dict[tuple[str, str], int]) -> Iterator[set[tuple[str, str]]]:
    """The wanted (metric, day) pairs in windows of consecutive days holding about
    :data:`WINDOW_REPORTS` reports at most (a larger day is a window of its own)."""
    by_day: dict[str, list[tuple[str, str]]] = {}
    for key in wanted:
        by_day.setdefault(key[1], []).append(key)
    window: set[tuple[str, str]] = set()
    size = 0
    for day in sorted(by_day):
        reports = sum(wanted[key] for key in by_day[day])
        if window and size + reports > WINDOW_REPORTS:
            yield window
            window, size = set(), 0
        window.update(by_day[day])
        size += reports
    if window:
        yield window


def _open_manifest(out: Path, storage: Storage, buckets: int | None) -> Manifest:
    """The archive's manifest with the store's registry merged in (new: an empty one)."""
    if (out / MANIFEST).exists():
        manifest = Manifest.load(out)
        if buckets is not None and check_buckets(buckets) != manifest.buckets:
            raise ArchiveError(f"the archive {out} has {manifest.buckets} buckets, not "
                               f"{buckets}: leave --buckets out, or write a new archive")
        manifest.registry = merge_registry(
            manifest.registry, storage.registry, {entry.metric for entry in manifest.files},
            f"the archive {out}")
        return manifest
    if any(path.name != ".lock" for path in out.iterdir()):
        raise ArchiveError(f"{out} is not empty and has no {MANIFEST}: it is not a Veil "
                           "archive; choose an empty or new directory")
    manifest = Manifest(out, storage.registry,
                        check_buckets(DEFAULT_BUCKETS if buckets is None else buckets), [])
    # saved before any file is written: a first run stopped half-way (killed, a full disk)
    # leaves an archive the next run continues, not a directory it refuses as foreign
    manifest.save()
    return manifest


def _write(storage: Storage, manifest: Manifest, window: set[tuple[str, str]],
           metric: str | None, source: str, row_group: int, compression: str, bar: Any,
           ) -> dict[tuple[str, str, int], _BucketFile]:
    """Write the reports of the (metric, day) pairs of ``window`` (one scan of its days) to
    temporary files, then give them their names; the files by (metric, day, bucket). On
    failure no file is renamed that was not complete, and the temporary files are removed."""
    files: dict[tuple[str, str, int], _BucketFile] = {}
    days = sorted(day for _, day in window)
    try:
        for chunk in storage.iter_reports(metric, days[0], days[-1], batch_size=BATCH_REPORTS):
            if (chunk.metric, chunk.day) in window and len(chunk):
                _add(chunk, manifest, files, source, row_group, compression)
                bar.update(len(chunk))
                _bound_memory(files)
        for file in files.values():
            file.commit()
    except BaseException:
        for file in files.values():
            file.abort()
        raise
    return files


def _add(chunk: StoredReports, manifest: Manifest,
         files: dict[tuple[str, str, int], _BucketFile], source: str, row_group: int,
         compression: str) -> None:
    """Split a chunk of one (metric, day) by bucket and queue each part in its file."""
    statistic = statistic_for(manifest.registry[chunk.metric].params)
    buckets = bucket_of(chunk.ids, manifest.buckets)
    order = np.argsort(buckets, kind="stable")
    table = to_table(statistic, chunk.ids[order], chunk.cohorts[order], chunk.payloads[order])
    bounds = np.r_[0, np.cumsum(np.bincount(buckets, minlength=manifest.buckets))]
    for bucket in np.flatnonzero(np.diff(bounds)):
        key = (chunk.metric, chunk.day, int(bucket))
        file = files.get(key)
        if file is None:
            relative = f"{bucket_dir(*key)}/{file_name(source)}"
            file = files[key] = _BucketFile(manifest.root, relative, table.schema, row_group,
                                            compression)
        file.add(table.slice(bounds[bucket], bounds[bucket + 1] - bounds[bucket]))


def _bound_memory(files: dict[tuple[str, str, int], _BucketFile]) -> None:
    """Spill the largest queues while more than :data:`BUFFERED_REPORTS` reports wait."""
    pending = sum(file.pending_rows for file in files.values())
    if pending <= BUFFERED_REPORTS:
        return
    for file in sorted(files.values(), key=lambda f: f.pending_rows, reverse=True):
        pending -= file.pending_rows
        file.spill()
        if pending <= BUFFERED_REPORTS // 2:
            return


def _record(manifest: Manifest, files: dict[tuple[str, str, int], _BucketFile],
            source: str) -> dict[tuple[str, str], int]:
    """List the new files in the manifest in place of this source's old files of the same
    days, save it, then delete the old files no longer listed; the reports written per
    (metric, day)."""
    written: dict[tuple[str, str], int] = {}
    for (name, day, _), file in files.items():
        written[(name, day)] = written.get((name, day), 0) + file.rows
    new = [ArchiveFile(file.relative, name, day, bucket, source, file.rows)
           for (name, day, bucket), file in sorted(files.items()) if file.rows]
    paths = {entry.path for entry in new}
    replaced = [entry for entry in manifest.files
                if entry.source == source and (entry.metric, entry.day) in written]
    manifest.files = [entry for entry in manifest.files if entry not in replaced] + new
    manifest.save()
    for entry in replaced:
        if entry.path not in paths:
            (manifest.root / entry.path).unlink(missing_ok=True)
    return written


def _remove_temporaries(out: Path) -> None:
    """Remove the temporary files a run that stopped half-way left behind."""
    for pattern in (".*.tmp", "metric=*/day=*/bucket=*/.*.tmp"):
        for path in out.glob(pattern):
            path.unlink(missing_ok=True)


def _make_private(manifest: Manifest) -> None:
    """Make the files the manifest lists 0600 and their directories 0700, where an earlier
    Veil left them to the umask (0644 and 0755 under the usual 022)."""
    folders: set[Path] = set()
    for entry in manifest.files:
        path = manifest.root / entry.path
        folders.update(path.parents[:3])  # the bucket, day and metric directories
        _restrict(path, PRIVATE_FILE)
    for folder in folders:
        _restrict(folder, PRIVATE_DIR)


def _restrict(path: Path, mode: int) -> None:
    """Give ``path`` ``mode`` if others may read it (a missing path is left to the checks
    that name it)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, mode)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold the archive's lock file (0600, as every archive file): one ``veil archive`` at
    a time writes to it."""
    descriptor = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    with os.fdopen(descriptor, "r+b") as lock:
        os.fchmod(descriptor, PRIVATE_FILE)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ArchiveError(f"another veil archive is writing to {out}; wait for it to "
                               "finish") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

