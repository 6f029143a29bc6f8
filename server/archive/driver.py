"""``veil aggregate``: per-(metric, day) aggregates recomputed from the archive with Dask.

:func:`aggregate` plans one task per (metric, day, bucket) from the manifest
(:meth:`~veil.server.archive.layout.Manifest.tasks`), runs
:func:`~veil.server.archive.bucket.aggregate_bucket` on a ``distributed`` cluster (a
local one of worker processes, or a running scheduler), merges the buckets of each
(metric, day) with the statistic's own ``merge`` and, once every task has succeeded, sets
them in the target store with :meth:`~veil.server.storage.Storage.replace_aggregates`.
Setting, not adding: a rerun gives the same aggregates; and a run that fails (a row the
wire's checks refuse, a changed file) sets none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from veil.server.archive.bucket import BucketAggregate, aggregate_bucket
from veil.server.archive.layout import ArchiveError, BucketTask, Manifest, metrics_of
from veil.server.storage.base import Storage, day_range, today, yesterday
from veil.shared.errors import ParameterError
from veil.shared.registry import Metric

if TYPE_CHECKING:
    from distributed import Client

#: ``scheduler`` value that starts a cluster of worker processes on this machine
LOCAL = "local"


@dataclasses.dataclass
class AggregateSummary:
    """What :func:`aggregate` did: ``rows`` read from the archive, ``duplicates`` among them
    left out, ``reports`` counted (``rows - duplicates``), over ``days`` (metric, day)
    pairs of ``metrics`` metrics, in ``tasks`` bucket tasks on ``workers`` workers."""

    archive_dir: Path
    target: str
    metrics: int
    days: int
    tasks: int
    rows: int
    reports: int
    duplicates: int
    workers: int
    seconds: float

    @property
    def reports_per_second(self) -> float:
        """Archive rows processed per second of the whole run (cluster start included when
        it started one)."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        if not self.tasks:
            return (f"the archive {self.archive_dir} has no reports in the range asked; "
                    "nothing to do")
        return (f"aggregated {self.reports:,} reports ({self.duplicates:,} duplicate ids left "
                f"out of {self.rows:,} archived) of {self.metrics} metrics over {self.days} "
                f"(metric, day) pairs into {self.target}: {self.tasks} tasks on "
                f"{self.workers} worker{'s' if self.workers != 1 else ''}, {self.seconds:.1f} s, "
                f"{self.reports_per_second:,.0f} reports/s")


def aggregate(archive_dir: str | Path | Manifest, storage: Storage, *,
              scheduler: str | Client = LOCAL,
              workers: int | None = None, metric: str | None = None,
              start: dt.date | str | None = None, end: dt.date | str | None = None,
              progress: bool | None = None) -> AggregateSummary:
    """Recompute the aggregates of every (metric, day) of the archive at ``archive_dir`` (or
    of its :class:`Manifest`, already loaded) over days ``start``..``end``, for one metric
    or all, and set them in ``storage``.

    ``scheduler``: ``"local"`` starts a cluster of ``workers`` processes (default: one per
    core) with one thread each, closed at the end; an address (``tcp://host:8786``) uses a
    running scheduler, whose workers must see the archive at the same path and have Veil
    installed; a ``distributed.Client`` is used as it is and left open. Every metric of the
    archive must be in ``storage``'s registry with the same parameters. Days of ``storage``
    absent from the archive are left as they are. ``progress``: a tqdm bar (default: when
    stderr is a terminal). Raises :class:`ArchiveError` saying what is wrong, and then sets
    no aggregate: every row of the archive must pass the wire's checks
    (:func:`~veil.server.archive.bucket.check_reports`) before any day is set.
    """
    began = time.monotonic()
    manifest = archive_dir if isinstance(archive_dir, Manifest) else Manifest.load(archive_dir)
    start_text, end_text = day_range(start, end)
    tasks = manifest.tasks(metric, start_text, end_text)
    metrics = target_metrics(manifest, storage, metrics_of(tasks))
    open_days = sorted({task.day for task in tasks if task.day >= today()})
    if open_days:
        raise ArchiveError(
            f"the archive holds reports of {open_days[0]}, a UTC day that is not over: its "
            f"aggregates in {storage.location} would be replaced by the archive's and lose the "
            "reports that arrived after it was written. Aggregate the days that are over "
            f"(--end {yesterday()}), "
            "and archive that day again once it is over")
    for task in tasks:
        for path in task.paths:
            if not os.path.exists(path):
                raise ArchiveError(
                    f"{path} is listed in {manifest.path} but missing; write that day again: "
                    f"veil archive --metric {task.metric} --start {task.day} --end {task.day}")
    summary = AggregateSummary(manifest.root, storage.location, len(metrics),
                               len({(task.metric, task.day) for task in tasks}), len(tasks),
                               0, 0, 0, 0, 0.0)
    if tasks:
        with _client(scheduler, workers) as client:
            summary.workers = len(client.nthreads())
            _run(client, tasks, metrics, storage, summary,
                 sys.stderr.isatty() if progress is None else progress)
    summary.seconds = time.monotonic() - began
    return summary


def target_metrics(manifest: Manifest, storage: Storage, names: list[str]) -> dict[str, Metric]:
    """The archive's metrics ``names``, each checked to be in ``storage``'s registry with the
    same parameters (:class:`ArchiveError` naming the metric and the fix otherwise)."""
    out: dict[str, Metric] = {}
    for name in names:
        archived = manifest.registry[name]  # Manifest.load checked that it is there
        stored = storage.registry.get(name)
        if stored is None:
            raise ArchiveError(
                f"metric {name!r} of the archive is not in the registry of {storage.location}. "
                f"Record it there first: give --config with a registry that defines {name!r} "
                f"with the archive's parameters ({archived.params.to_dict()}, as "
                f"{manifest.path} lists them)")
        if stored.params != archived.params:
            raise ArchiveError(
                f"metric {name!r} has other parameters in {storage.location} "
                f"({stored.params.to_dict()}) than in the archive ({archived.params.to_dict()}): "
                "the archived reports would be misread. Aggregate into a store whose registry "
                f"gives {name!r} the archive's parameters (a new store with --config), or "
                "leave the metric out (--metric)")
        out[name] = archived
    return out


def _distributed() -> Any:
    """The ``distributed`` module, loaded on first use (typed as ``Any``: most of its
    functions carry no annotations)."""
    import distributed

    return distributed


@contextlib.contextmanager
def _client(scheduler: str | Client, workers: int | None) -> Iterator[Any]:
    """A ``distributed`` client for ``scheduler``; what it started is closed on exit."""
    dd = _distributed()
    if isinstance(scheduler, dd.Client):
        yield scheduler
        return
    if scheduler == LOCAL:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ParameterError("workers", f"workers must be a whole number >= 1; got {workers!r}")
        # the scheduler's HTTP server (health, and the dashboard if bokeh is installed)
        # on a free port of the loopback interface, not a fixed public one
        with dd.LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                          processes=True, dashboard_address="127.0.0.1:0") as cluster, \
                dd.Client(cluster) as client:
            yield client
        return
    if workers is not None:
        raise ParameterError("workers", "--workers sizes a local cluster (--scheduler local); "
                                        f"the cluster of {scheduler} has the workers started "
                                        "for it")
    try:
        client = dd.Client(scheduler)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ArchiveError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    with client:
        yield client


def _run(client: Any, tasks: list[BucketTask], metrics: dict[str, Metric], storage: Storage,
         summary: AggregateSummary, progress: bool) -> None:
    """Run the tasks, largest first, and merge the buckets of each (metric, day); once every
    task has succeeded, set the merged aggregates in ``storage``. A task that fails (a file
    the wire's checks refuse, one that changed since it was written) stops the run before
    any aggregate is set, so a refused archive leaves the store as it was. Held until the
    end are the merged aggregates only, one per (metric, day) (a string metric's is its
    cohorts times k counters), never the reports."""
    as_completed = _distributed().as_completed

    run = secrets.token_hex(4)
    futures: dict[Any, BucketTask] = {}
    for task in sorted(tasks, key=lambda t: -t.rows):
        key = f"veil-aggregate-{task.metric}-{task.day}-{task.bucket:02d}-{run}"
        futures[client.submit(aggregate_bucket, metrics[task.metric], task.paths, key=key,
                              pure=False)] = task
    remaining: dict[tuple[str, str], int] = {}
    for task in tasks:
        remaining[(task.metric, task.day)] = remaining.get((task.metric, task.day), 0) + 1
    partial: dict[tuple[str, str], BucketAggregate] = {}
    merged: dict[tuple[str, str], BucketAggregate] = {}
    try:
        with tqdm(total=len(tasks), unit=" tasks", desc="veil aggregate",
                  disable=not progress) as bar:
            for future in as_completed(futures):
                task = futures[future]
                result: BucketAggregate = future.result()
                if result.rows != task.rows:
                    raise ArchiveError(
                        f"the files of metric {task.metric!r}, day {task.day}, bucket "
                        f"{task.bucket} hold {result.rows} reports, but the manifest says "
                        f"{task.rows}: the archive changed since it was written. Write that "
                        f"day again: veil archive --metric {task.metric} --start {task.day} "
                        f"--end {task.day}")
                day = (task.metric, task.day)
                metric = metrics[task.metric]
                partial[day] = partial[day].merge(result, metric) if day in partial else result
                remaining[day] -= 1
                if not remaining[day]:
                    merged[day] = partial.pop(day)
                bar.update(1)
    finally:
        client.cancel(list(futures))
    for (name, date), result in sorted(merged.items()):
        storage.replace_aggregates(name, date, result.reports, result.states)
        summary.rows += result.rows
        summary.duplicates += result.duplicates
        summary.reports += int(result.reports.sum())
