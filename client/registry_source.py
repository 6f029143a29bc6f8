"""Where the client's metric registry comes from, and the values that wait for it.

A registry is given locally, or fetched through the client's transport
(``GET /v1/metrics``) and cached as ``registry.json`` in the state directory,
so an application that starts while the collector is unreachable still knows
its metrics. :class:`RegistryLoader` owns the registry in use: it installs a
given or cached one, fetches the collector's in a background thread (the
client never waits for it when it is created; only ``strict=True`` resolves
the registry before the constructor returns, :func:`resolve_registry`,
raising when there is none), and keeps the values reported before a registry
arrived in memory (:class:`WaitingValues`), bounded in count and time.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from veil.client.encoders.base import Encoder
from veil.client.errors import RegistryUnavailableError, shown_metric
from veil.client.privacy_limits import PrivacyLimits
from veil.client.state_dir import REGISTRY_CACHE_FILE
from veil.client.transport import Transport
from veil.shared.errors import ParameterError, VeilError
from veil.shared.registry import Metric, Registry

log = logging.getLogger("veil.client")

#: with a cached registry to fall back on, a strict client waits at most this long for the collector
CACHED_FETCH_TIMEOUT = 2.0
#: values that may wait in memory for the registry (raw values: never written to disk) ...
MAX_WAITING = 1_000
#: ... and how long after it was reported each is kept for sure: the next value that has to
#: wait, or the next failed fetch of the registry, drops those reported longer ago
WAITING_SECONDS = 10.0
#: a report waiting for the registry starts a new fetch at most this often
FETCH_RETRY_SECONDS = 5.0


class WaitingValues:
    """Values reported before the registry arrived, waiting to be encoded.

    They are raw values, so they stay in memory, never on disk, and their wait
    is bounded: at most ``limit`` values wait, and each is kept for sure for
    ``seconds`` after it was reported (:meth:`expire` removes the older ones).

    Two locks. ``lock`` guards the values; the loader also holds it while it
    switches registries, so that no value starts waiting for a registry that is
    loaded already. ``settling`` is held while values move from here to the
    outbox (taken, then encoded and queued one by one, or dropped), and by
    whoever counts what is pending: a value is then always counted in exactly
    one place, here or in the outbox, never in neither. It is reentrant, so a
    logging handler that reads the count while values move does not deadlock.
    """

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit = limit
        self.seconds = seconds
        self.lock = threading.Lock()
        self.settling = threading.RLock()
        #: (metric, value, time.monotonic() when reported), oldest first
        self._values: collections.deque[tuple[Any, Any, float]] = collections.deque()

    def __len__(self) -> int:
        return len(self._values)

    def add(self, metric: Any, value: Any, now: float) -> tuple[bool, int]:
        """Keep a value reported at ``now`` unless ``limit`` values wait; return whether it was
        kept and how many older values :meth:`expire` removed first. Hold ``lock``."""
        expired = self.expire(now)
        kept = len(self._values) < self.limit
        if kept:
            self._values.append((metric, value, now))
        return kept, expired

    def expire(self, now: float) -> int:
        """Remove the values reported more than ``seconds`` before ``now``; return how many.
        Hold ``lock``."""
        values, expired = self._values, 0
        while values and now - values[0][2] > self.seconds:
            values.popleft()
            expired += 1
        return expired

    def take(self) -> list[tuple[Any, Any]]:
        """Remove and return every value waiting, oldest first, as (metric, value). Hold
        ``lock``, and ``settling`` until each is queued or dropped."""
        taken = [(metric, value) for metric, value, _ in self._values]
        self._values.clear()
        return taken


def given_registry(registry: Registry | str | os.PathLike[str] | None) -> Registry | None:
    """The registry the application passed (a :class:`Registry` or a TOML file path), or
    ``None`` when it passed none (fetch it from the collector)."""
    if registry is None or isinstance(registry, Registry):
        return registry
    return Registry.load(os.fspath(registry))


def fetch_registry(
    transport: Transport, url: str, directory: Path, *, token: str | None, timeout: float
) -> Registry:
    """The collector's registry, cached in ``directory``; :class:`RegistryUnavailableError`
    (naming the cause) if it cannot be fetched."""
    fetched = transport.fetch_registry(url, token=token, timeout=timeout)
    try:
        write_cache(directory, fetched)
    except OSError as exc:
        log.warning("cannot cache the metric registry in %s: %s", directory, exc.strerror)
    for name, why in fetched.skipped.items():
        log.warning("metric %r of the registry is left out (its reports are dropped as "
                    "unknown_metric): %s", name, why)
    return fetched


def resolve_registry(
    url: str, directory: Path, transport: Transport, *, token: str | None, timeout: float
) -> Registry:
    """Fetch the registry now, else read the cache (a strict client's start-up).

    With a cache the fetch waits at most :data:`CACHED_FETCH_TIMEOUT` seconds;
    with neither, :class:`RegistryUnavailableError` says what to do.
    """
    if cache_path(directory).exists():
        timeout = min(timeout, CACHED_FETCH_TIMEOUT)
    try:
        return fetch_registry(transport, url, directory, token=token, timeout=timeout)
    except VeilError as problem:
        cached = read_cache(directory)
        if cached is None:
            raise RegistryUnavailableError(
                f"cannot fetch the metric registry ({problem}) and no cached copy exists in "
                f"{directory}; start the collector, check the URL, or pass registry= "
                "(a Registry or a TOML file)"
            ) from None
        log.warning("using the cached metric registry: %s", problem)
        return cached


def cache_path(directory: Path) -> Path:
    """Where the registry is cached in the state directory ``directory``."""
    return directory / REGISTRY_CACHE_FILE


def read_cache(directory: Path) -> Registry | None:
    """The registry cached in ``directory``, or ``None`` if there is none or it cannot be read."""
    path = cache_path(directory)
    try:
        return Registry.from_dict(json.loads(path.read_text(encoding="utf-8")), lenient=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ParameterError) as exc:
        log.warning("ignoring the unreadable registry cache %s: %s", path, exc)
        return None


def write_cache(directory: Path, registry: Registry) -> None:
    """Replace the registry cached in ``directory`` atomically (a crash leaves the old or the
    new copy)."""
    path = cache_path(directory)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(registry.to_dict(), handle)
    os.replace(temporary, path)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The registry in use and what derives from it; replaced whole when another arrives.

    ``refused`` names the metrics the application's limits refuse, with why;
    ``prepared`` maps each metric reported so far (and not refused) to its
    :class:`Metric` and encoder: the one lookup of a report.
    """

    registry: Registry
    refused: dict[str, str]
    prepared: dict[str, tuple[Metric, Encoder[Any]]] = dataclasses.field(default_factory=dict)

    @property
    def loaded(self) -> bool:
        """False for the stand-in used until a registry arrives."""
        return self is not NOT_LOADED

    def uses(self, registry: Registry) -> bool:
        """Whether ``registry`` is the one loaded already."""
        return self.loaded and self.registry == registry


NOT_LOADED = Metrics(Registry([]), {})


class Drop(Protocol):
    """How the loader hands over the values it drops: ``count`` reports for ``cause``, logged
    with ``message`` (at WARNING level the first time for the cause, or with ``warn``; at DEBUG
    level with ``quiet``)."""

    def __call__(
        self, cause: str, message: str, count: int = 1, *, warn: bool = False, quiet: bool = False
    ) -> None:
        ...


def counted_values(count: int, noun: str = "value") -> str:
    """``1 value``, ``2 values`` (or another ``noun``): counts in log lines and errors."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class RegistryLoader:
    """The metric registry a client uses, and the values reported before it arrived.

    It installs a registry given or cached (:meth:`install`), fetches the
    collector's in a daemon thread, ``veil-registry`` (:meth:`start_fetch`), or
    in the caller's thread when the client closes, and works out which metrics
    the application's ``limits`` refuse. Values reported while no registry is
    loaded, or while a refresh that a value waits for is under way, wait in
    :attr:`waiting` (:meth:`wait`); once a registry is loaded each goes to
    ``submit`` (to be encoded and queued, or dropped), and the ones given up go
    to ``drop``. ``hold(True)`` is called while values wait in memory only (the
    client's exit hook then keeps it alive), ``hold(False)`` once none does.
    A fetch that finds the collector unreachable goes to ``unreachable`` (what
    failed, and what that means for the application), one it answers to ``reached``:
    the outage under way (:mod:`veil.client.outage`) counts the one, and the other ends it.
    While an outage that another run announced lasts (``unreachable`` returned
    ``True``), the values it costs this run are counted and logged at DEBUG level:
    its WARNING said they would be dropped.
    """

    def __init__(
        self, transport: Transport, url: str, directory: Path, *, token: str | None,
        timeout: float, limits: PrivacyLimits, submit: Callable[[Any, Any], None], drop: Drop,
        hold: Callable[[bool], None], unreachable: Callable[[str, str], bool],
        reached: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.url = url
        self.directory = directory
        self.token = token
        self.timeout = timeout
        self.limits = limits
        self._submit = submit
        self._drop = drop
        self._hold = hold
        self._unreachable = unreachable
        self._reached = reached
        #: the registry in use (:data:`NOT_LOADED` until one arrives)
        self.metrics = NOT_LOADED
        #: why the last fetch failed (``None``: it did not)
        self.problem: str | None = None
        self._warned = False
        #: the last fetch failed in an outage another run announced: its losses are not news
        self._quiet = False
        self._fetched = threading.Event()
        self._fetch_ended = -math.inf
        self.forked()

    def forked(self) -> None:
        """Fresh waiting values and fetch state for this process (at creation, and in a forked
        child: the values that waited in the parent stay the parent's to encode)."""
        self.waiting = WaitingValues(MAX_WAITING, WAITING_SECONDS)
        self._fetching = False

    @property
    def fetching(self) -> bool:
        """Whether a fetch is under way."""
        return self._fetching

    def install(self, registry: Registry) -> None:
        """Use ``registry`` from now on, and report the values that waited for it."""
        refused = self.limits.refusals(registry)
        with self.waiting.settling:
            previous, ready, _ = self._end_fetch(Metrics(registry, refused), None)
            if not previous.uses(registry):
                for name, why in refused.items():
                    if previous.refused.get(name) != why:
                        log.error("%s", why)
                for name in sorted(set(self.limits.pinned) - set(registry)):
                    log.warning("pinned metric %r is not in the registry", name)
            self._report_waiting(ready)

    def _report_waiting(self, values: list[tuple[Any, Any]]) -> None:
        """Report the values that waited for the registry, each on its own. ``submit``
        (not strict) turns any failure into a counted, logged drop, so one value never
        stops the others nor the ``veil-registry`` thread this runs in."""
        for metric, value in values:
            self._submit(metric, value)

    def _end_fetch(
        self, metrics: Metrics | None, problem: str | None
    ) -> tuple[Metrics, list[tuple[Any, Any]], int]:
        """A fetch of the registry ended (or a registry was given or cached): use ``metrics``
        unless its registry is in use already; ``None``: the fetch failed with ``problem``.

        Returns the metrics in use until now, the values to report now (once a
        registry is loaded, every value waiting) and, after a failed fetch, how
        many values it removed for waiting too long. Call it holding
        ``waiting.settling`` until those values are reported.
        """
        now = time.monotonic()
        ready: list[tuple[Any, Any]] = []
        with self.waiting.lock:
            previous = self.metrics
            if metrics is not None and not previous.uses(metrics.registry):
                self.metrics = metrics
            self._fetching = False
            self._fetch_ended = now
            expired = 0 if metrics is not None else self.waiting.expire(now)
            if self.metrics.loaded:
                ready = self.waiting.take()
            self._hold(bool(self.waiting))
        self.problem = problem
        if problem is None:
            self._warned = self._quiet = False
        return previous, ready, expired

    def start_fetch(
        self, *, unless_within: float = 0.0, inline: float | None = None
    ) -> threading.Event:
        """Fetch the registry in a daemon thread, or with ``inline`` (seconds at most) in this
        one, unless a fetch is at it or the last attempt ended less than ``unless_within``
        seconds ago; the event is set when it ends."""
        with self.waiting.lock:
            if self._fetching or time.monotonic() - self._fetch_ended < unless_within:
                return self._fetched
            self._fetching = True
            done = self._fetched = threading.Event()
        if inline is not None:
            self._fetch(done, inline)
            return done
        thread = threading.Thread(target=self._fetch, args=(done, self.timeout),
                                  name="veil-registry", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            # the interpreter is shutting down (Python 3.12 and later start no thread then):
            # the values keep waiting, and the exit hook fetches in its own thread
            with self.waiting.lock:
                self._fetching = False
            done.set()
        return done

    def _fetch(self, done: threading.Event, timeout: float) -> None:
        try:
            registry = fetch_registry(self.transport, self.url, self.directory,
                                      token=self.token, timeout=timeout)
        except VeilError as problem:
            self._unavailable(str(problem), unreachable=getattr(problem, "unreachable", False))
        except Exception as problem:
            log.exception("fetching the metric registry failed")
            self._unavailable(f"{type(problem).__name__}: {problem}", unreachable=None)
        else:
            self._reached()
            self.install(registry)
        finally:
            done.set()

    def _unavailable(self, problem: str, *, unreachable: bool | None) -> None:
        """A fetch failed: forget the values that waited too long; with a registry loaded (this
        was a refresh), the values that waited for it are reported against the one in use.

        ``unreachable``: the collector did not answer (a failure of the outage under
        way); ``False``: it answered with no registry; ``None``: the transport broke."""
        with self.waiting.settling:
            previous, retry, expired = self._end_fetch(None, problem)
            if unreachable:
                self._quiet = self._unreachable(problem, (
                    "The metric registry loaded stays in use; reports stay queued and will be "
                    "retried" if previous.loaded else
                    f"Values reported wait in memory for the metric registry (at most "
                    f"{MAX_WAITING}); those reported more than {WAITING_SECONDS:g} s before a "
                    "later failed fetch, and all still waiting when the client closes, are "
                    "dropped and counted in client.drops['no_registry']"
                ))
            else:
                self._quiet = False
                self._log_unavailable(problem, refresh=previous.loaded)
            self._drop_waiting(
                expired,
                f"for more than {WAITING_SECONDS:g} s (it could not be fetched: {problem})",
            )
            self._report_waiting(retry)
        if unreachable is False:
            self._reached()

    def _log_unavailable(self, problem: str, *, refresh: bool) -> None:
        """Log a fetch the collector answered without a registry (or a broken transport): at
        INFO level for a ``refresh``, else as a WARNING once until a registry arrives."""
        if refresh:
            log.info("could not refresh the metric registry; using the one loaded: %s", problem)
        elif not self._warned:
            self._warned = True
            log.warning(
                "the metric registry is not available yet: %s. Up to %d values wait in memory "
                "for it; one reported more than %g s ago is dropped when the next value waits "
                "or the next fetch fails, and counted in client.drops['no_registry']",
                problem, MAX_WAITING, WAITING_SECONDS,
            )

    def _drop_waiting(self, count: int, why: str) -> None:
        """Count and log ``count`` values dropped after waiting for the registry (``why`` ends
        the message: how long they waited)."""
        if count:
            self._drop("no_registry", f"dropped {counted_values(count)} that waited for the "
                       f"metric registry {why}", count, quiet=self._quiet)

    def wait(self, metrics: Metrics, metric: Any, value: Any) -> bool:
        """Keep ``value`` in memory until the registry arrives (bounded in count and time), if
        ``metrics`` are still those in use and need it; ``False``: the registry arrived
        meanwhile, report the value now."""
        with self.waiting.lock:
            current = self.metrics is metrics and (not metrics.loaded or self._fetching)
            if current:
                kept, expired = self.waiting.add(metric, value, time.monotonic())
                self._hold(True)
        if not current:
            return False
        self._drop_waiting(expired, f"for more than {WAITING_SECONDS:g} s")
        if not kept:
            self._drop("no_registry", f"dropped a report of {shown_metric(metric)}: "
                       f"{MAX_WAITING} values already wait in memory for the metric registry")
        self.start_fetch(unless_within=FETCH_RETRY_SECONDS)
        return True

    def await_registry(self, deadline: float | None, *, inline: bool = False) -> None:
        """Wait (at most until ``deadline``, or ``timeout``) for the registry, or for the refresh
        values wait for, fetching it if no fetch is under way (``inline``: in this thread)."""
        if self.metrics.loaded and not self.waiting:
            return
        limit = self.timeout if deadline is None else deadline - time.monotonic()
        if not inline:
            done = self.start_fetch()
        elif limit > 0:
            done = self.start_fetch(inline=min(limit, self.timeout))
        else:
            return
        done.wait(max(limit if deadline is None else deadline - time.monotonic(), 0.0))

    def abandon(self, when: str) -> int:
        """At close: drop the values still waiting (counted, and logged as a WARNING naming
        ``when`` it happened, or at DEBUG level in an outage another run announced); return
        how many. Call it holding ``waiting.settling``."""
        with self.waiting.lock:
            lost = len(self.waiting.take())
            self._hold(False)
        if lost:
            self._drop(
                "no_registry",
                f"lost {counted_values(lost)} reported before the metric registry arrived: it "
                f"could not be fetched {when} ({self.problem or 'the fetch was still under way'}"
                "); they are counted in client.drops['no_registry']",
                lost, warn=True, quiet=self._quiet,
            )
        return lost
