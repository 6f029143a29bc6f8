"""A Parquet archive of raw reports, and aggregates recomputed from it on a Dask cluster.

``veil archive`` (:func:`archive`) writes the raw reports of days that are over to
Parquet files partitioned by metric, day and bucket, listed in a manifest
(:mod:`~veil.server.archive.layout`). ``veil aggregate`` (:func:`aggregate`) runs one
task per (metric, day, bucket) on Dask ``distributed`` and sets the merged aggregates in
a store. The work of one bucket, :func:`aggregate_bucket`
(:mod:`~veil.server.archive.bucket`), imports no engine: Spark, Ray or a loop can run it.

The public names load lazily (:mod:`veil.server.lazy`), so listing the ``veil``
commands does not import pyarrow or Dask.

>>> with open_storage("veil.db") as storage:                     # doctest: +SKIP
...     archive(storage, "archive/")
...     print(aggregate("archive/", storage, workers=2))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.server.lazy import lazy_getattr

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first use
    from veil.server.archive.bucket import BucketAggregate, aggregate_bucket, first_occurrences
    from veil.server.archive.driver import AggregateSummary, aggregate
    from veil.server.archive.layout import (
        FORMAT_VERSION,
        ArchiveError,
        ArchiveFile,
        BucketTask,
        Manifest,
    )
    from veil.server.archive.writer import ArchiveSummary, archive

_EXPORTS = {
    "BucketAggregate": "veil.server.archive.bucket",
    "aggregate_bucket": "veil.server.archive.bucket",
    "first_occurrences": "veil.server.archive.bucket",
    "AggregateSummary": "veil.server.archive.driver",
    "aggregate": "veil.server.archive.driver",
    "FORMAT_VERSION": "veil.server.archive.layout",
    "ArchiveError": "veil.server.archive.layout",
    "ArchiveFile": "veil.server.archive.layout",
    "BucketTask": "veil.server.archive.layout",
    "Manifest": "veil.server.archive.layout",
    "ArchiveSummary": "veil.server.archive.writer",
    "archive": "veil.server.archive.writer",
}

__all__ = [
    "FORMAT_VERSION",
    "AggregateSummary",
    "ArchiveError",
    "ArchiveFile",
    "ArchiveSummary",
    "BucketAggregate",
    "BucketTask",
    "Manifest",
    "aggregate",
    "aggregate_bucket",
    "archive",
    "first_occurrences",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
