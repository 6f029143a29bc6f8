"""The collector's operational metrics, served at ``GET /metrics`` in Prometheus' text format.

Aggregate counters only: reports accepted, duplicates and rejected (by error
code), batches refused whole (by error code), the time to store a batch, and
the size of the database; the serving process's own ``process_*`` metrics
(CPU, memory, open files) and ``veil_build_info`` with the version. The common
error codes' counters are present at 0 from the start. No label carries anything a client sent: the only
label is ``code``, one of the API's own error codes. Each batch costs a few
counter updates, never one per report.

With several ``veil serve`` workers, each process keeps its own counters;
prometheus_client's multiprocess mode adds them up at each scrape from the
files its processes write to ``PROMETHEUS_MULTIPROC_DIR`` (``veil serve --workers
N`` makes a private one, and removes it when it stops). prometheus_client chooses
its mode when it is first imported, from whether that variable is set, and this
module follows the same rule: set the variable before this module is imported.
Under another WSGI server (gunicorn), follow prometheus_client's multiprocess
documentation.
"""

from __future__ import annotations

import os
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from veil.server.storage.sqlite.files import store_file_bytes
from veil.shared.version import __version__

__all__ = [
    "BATCH_REFUSAL_CODES",
    "BATCH_SECONDS_BUCKETS",
    "CONTENT_TYPE",
    "REPORT_REJECTION_CODES",
    "BuildInfo",
    "ServerMetrics",
    "StorageSize",
    "multiprocess_mode",
]

#: the error codes a batch is most often refused with whole, and a report one by one: their
#: counters are exported at 0 from the start, so that an alert on a rate of them sees a
#: series before the first event (a code not listed appears at its first event)
BATCH_REFUSAL_CODES = ("unauthorized", "rate_limited", "body_too_large", "too_many", "bad_json",
                       "unsupported_media_type", "wrong_type", "empty", "unknown_field",
                       "unsupported_version", "unavailable")
REPORT_REJECTION_CODES = ("wrong_type", "missing", "bad_hex", "unknown_field", "unknown_metric",
                          "stale_params", "bad_cohort", "out_of_range", "invalid")

#: the ``Content-Type`` of the exposition
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: histogram buckets of the time to store a batch, in seconds: from a small batch (a few ms)
#: through an id merge (0.5 to 1 s) to the storage's 30 s wait for its write lock
BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def multiprocess_mode() -> bool:
    """Whether prometheus_client keeps its values in files shared by processes (the variable
    ``PROMETHEUS_MULTIPROC_DIR`` is set, as prometheus_client itself decides)."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ


class StorageSize(Collector):
    """``veil_storage_bytes``: the database file and its write-ahead log, measured at each
    scrape; nothing for a store that is not a file."""

    def __init__(self, location: str) -> None:
        self.path = Path(location)

    def collect(self) -> Iterator[Metric]:
        """The gauge, if the store is a file."""
        size = store_file_bytes(str(self.path))
        if size is None:
            return
        yield GaugeMetricFamily("veil_storage_bytes",
                                "Bytes of the database file and its write-ahead log", value=size)


class BuildInfo(Collector):
    """``veil_build_info{version="..."} 1``: which Veil serves (a gauge written at each scrape,
    the same in every worker, so it needs no multiprocess file)."""

    def collect(self) -> Iterator[Metric]:
        """The constant gauge."""
        info = GaugeMetricFamily("veil_build_info", "The Veil version serving, as a label",
                                 labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info


class ServerMetrics:
    """The metrics of one collector app, and their exposition for ``GET /metrics``."""

    def __init__(self, storage_location: str) -> None:
        # in multiprocess mode values live in the processes' files, read at each scrape
        registry = None if multiprocess_mode() else CollectorRegistry()
        self.registry = registry
        self.storage_size = StorageSize(storage_location)
        self.accepted = Counter(
            "veil_reports_accepted", "Reports stored (new report ids)", registry=registry)
        self.duplicates = Counter(
            "veil_reports_duplicate",
            "Reports acknowledged without storing them again (their id was stored before)",
            registry=registry)
        self.rejected = Counter(
            "veil_reports_rejected",
            "Reports refused one by one in batches that were otherwise taken, by error code",
            ["code"], registry=registry)
        self.refused = Counter(
            "veil_batches_refused", "Batches refused whole (nothing stored), by error code",
            ["code"], registry=registry)
        self.batch_seconds = Histogram(
            "veil_batch_seconds",
            "Seconds to read, validate and durably store a batch, for batches answered 200",
            buckets=BATCH_SECONDS_BUCKETS, registry=registry)
        for code in REPORT_REJECTION_CODES:
            self.rejected.labels(code)
        for code in BATCH_REFUSAL_CODES:
            self.refused.labels(code)
        if registry is not None:
            registry.register(self.storage_size)
            registry.register(BuildInfo())
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)

    def batch_stored(self, accepted: int, duplicates: int, error_codes: Iterable[str],
                     seconds: float) -> None:
        """Count a batch answered 200: its new and duplicate reports, its refused ones by
        code, and how long it took."""
        self.accepted.inc(accepted)
        if duplicates:
            self.duplicates.inc(duplicates)
        for code, count in Tally(error_codes).items():
            self.rejected.labels(code).inc(count)
        self.batch_seconds.observe(seconds)

    def batch_refused(self, code: str) -> None:
        """Count a batch refused whole with the API error ``code``."""
        self.refused.labels(code).inc()

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format (all processes' in multiprocess mode)."""
        registry = self.registry
        if registry is None:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            registry.register(self.storage_size)
            registry.register(BuildInfo())
            # process_* of the process answering the scrape (prometheus_client's multiprocess
            # mode keeps no per-process gauges of its own)
            ProcessCollector(registry=registry)
        return generate_latest(registry)
