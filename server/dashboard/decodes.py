"""Decodes for the pages, each computed once: cached by metric, day range, the counts they
were computed from and the candidates they were given, and the candidate strings of each
string metric (a file per metric, and the strings its discovery channel found).

A page view reads the counts (a cheap sum of aggregates) and looks its decode up by their
digest: the same counts are never decoded twice, and new reports make a new key, so the
cache is never stale. Old entries fall out least recently used first.
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from veil.server.dashboard.sources import DashboardSource

if TYPE_CHECKING:
    from veil.server.analysis.discovery import DiscoveryResult
    from veil.server.analysis.results import DecodeResult

T = TypeVar("T")
#: entries kept in memory: decodes of a range, and each day's series rows (a few small
#: rows, not the day's decode), so 90 days of 30 metrics stay cached whole
CACHE_ENTRIES = 8192
#: a candidates file's name in the candidates directory: the metric's name and this suffix
CANDIDATES_SUFFIX = ".txt"


def digest(document: Any) -> str:
    """A fingerprint of a document (a counts document, a candidate list): SHA-256 of its
    pickle. Equal bytes mean equal content, so a digest never matches other counts; the
    same content pickled differently would only cost a decode."""
    return hashlib.sha256(pickle.dumps(document, protocol=5)).hexdigest()


class LruCache:
    """A thread-safe least-recently-used map that computes a missing value once, counting
    hits and misses (the benchmark and the tests read them). Requests that miss the same
    key together wait for the one computing it, so concurrent page views decode once."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._values: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._computing: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value of ``key``, computed by ``compute`` on a miss (by one caller at a time:
        the others wait for it, and compute it themselves only if it failed)."""
        while True:
            with self._lock:
                if key in self._values:
                    self._values.move_to_end(key)
                    self.hits += 1
                    value: T = self._values[key]
                    return value
                running = self._computing.get(key)
                if running is None:
                    done = self._computing[key] = threading.Event()
                    self.misses += 1
                    break
            running.wait()
        try:
            value = compute()
            with self._lock:
                self._values[key] = value
                while len(self._values) > self.entries:
                    self._values.popitem(last=False)
            return value
        finally:
            with self._lock:
                del self._computing[key]
            done.set()


class Candidates:
    """Candidate strings of string metrics: ``DIR/<metric>.txt`` (one per line, read again
    when the file changes) and the strings discovery found, merged without repeats."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._files: dict[str, tuple[float, list[str]]] = {}
        self._discovered: dict[str, list[str]] = {}
        self._digests: dict[str, tuple[Hashable, list[str], str]] = {}
        self._lock = threading.Lock()

    def from_file(self, metric: str) -> list[str]:
        """The metric's candidates file's strings ([] without one)."""
        if self.directory is None:
            return []
        path = self.directory / f"{metric}{CANDIDATES_SUFFIX}"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return []
        with self._lock:
            cached = self._files.get(metric)
            if cached is not None and cached[0] == mtime:
                return cached[1]
        from veil.server.analysis.candidate_map import read_candidates

        strings = list(read_candidates(path))
        with self._lock:
            self._files[metric] = (mtime, strings)
        return strings

    def add_discovered(self, metric: str, strings: Sequence[str]) -> None:
        """Remember what discovery found for ``metric``."""
        with self._lock:
            known = self._discovered.setdefault(metric, [])
            known.extend(string for string in strings if string not in known)

    def of(self, metric: str) -> list[str]:
        """Every candidate of ``metric``: its file's, then discovered ones not in it."""
        return self.with_digest(metric)[0]

    def with_digest(self, metric: str) -> tuple[list[str], str]:
        """:meth:`of` and its :func:`digest`, computed once for each list."""
        listed = self.from_file(metric)
        with self._lock:
            discovered = tuple(self._discovered.get(metric, ()))
            key = (metric, id(listed), discovered)
            cached = self._digests.get(metric)
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
        seen = set(listed)
        strings = listed + [string for string in discovered if string not in seen]
        fingerprint = digest(strings)
        with self._lock:
            self._digests[metric] = (key, strings, fingerprint)
        return strings, fingerprint


class Decodes:
    """The dashboard's decodes over one source, cached (see the module docstring)."""

    def __init__(self, source: DashboardSource, candidates: Candidates,
                 cache: LruCache | None = None) -> None:
        self.source = source
        self.candidates = candidates
        self.cache = cache or LruCache()

    def counts(self, metric: str, start: str | None, end: str | None) -> dict[str, Any]:
        """The counts document (not cached: it is what says whether a decode is current)."""
        return self.source.counts(metric, start, end)

    def decode(self, metric: str, start: str | None, end: str | None,
               candidates: Sequence[str] | None = None,
               document: dict[str, Any] | None = None) -> DecodeResult:
        """The decode of ``metric`` over the range with ``candidates`` (string metrics; by
        default all known ones), from ``document`` when the caller read it already."""
        if document is None:
            document = self.counts(metric, start, end)
        if candidates is None:
            candidates, listed = self.candidates.with_digest(metric)
        else:
            listed = digest(list(candidates))
        key = ("decode", metric, start, end, digest(document), listed)

        def compute() -> DecodeResult:
            from veil.server.analysis.decoders import decode_counts

            return decode_counts(document, list(candidates) or None,
                                 source=f"{self.source.name} metric {metric}")

        return self.cache.get(key, compute)

    def derived(self, metric: str, day: str, document: dict[str, Any],
                candidates: Sequence[str], candidates_digest: str, what: Hashable,
                make: Callable[[DecodeResult], T]) -> T:
        """``make`` of the decode of ``metric`` on ``day`` (its counts ``document``) over
        ``candidates`` (whose :func:`digest` is ``candidates_digest``), cached under ``what``
        (whatever else ``make`` depends on). Only ``make``'s value is kept, not the decode."""
        key = ("derived", metric, day, digest(document), candidates_digest, what)

        def compute() -> T:
            from veil.server.analysis.decoders import decode_counts

            return make(decode_counts(document, list(candidates) or None,
                                      source=f"{self.source.name} metric {metric}"))

        return self.cache.get(key, compute)

    def discover(self, metric: str, start: str | None, end: str | None) -> DiscoveryResult:
        """The discovery search of string metric ``metric`` over the range, cached by its
        channel's and its own counts; what it finds joins the metric's candidates."""
        registry = self.source.registry()
        channel = registry.channel(metric)
        assert channel is not None
        key = ("discover", metric, start, end,
               digest(self.counts(channel.name, start, end)),
               digest(self.counts(metric, start, end)))

        def compute() -> DiscoveryResult:
            from veil.server.analysis.api import discover

            return discover(metric, db=self.source.db_url(), server=self.source.server,
                            token=self.source.token, start=start, end=end)

        result = self.cache.get(key, compute)
        self.candidates.add_discovered(metric, [str(row["value"]) for row in result.result.rows])
        return result
