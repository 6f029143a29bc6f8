"""Where the client's metric registry comes from: given locally, or fetched and cached.

A registry fetched through the client's transport (``GET /v1/metrics``) is
cached as ``registry.json`` in the state directory, so an application that
starts while the collector is unreachable still knows its metrics. The client
fetches in a background thread (:func:`fetch_registry`) and never waits for it
when it is created; only ``strict=True`` resolves the registry before the
constructor returns (:func:`resolve_registry`), raising when there is none.
Until a registry is loaded, the values reported wait in memory
(:class:`WaitingValues`).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from veil.client.errors import RegistryUnavailableError
from veil.client.state_dir import REGISTRY_CACHE_FILE
from veil.client.transport import Transport
from veil.shared.errors import ParameterError, VeilError
from veil.shared.registry import Registry

log = logging.getLogger("veil.client")

#: with a cached registry to fall back on, a strict client waits at most this long for the collector
CACHED_FETCH_TIMEOUT = 2.0


class WaitingValues:
    """Values reported before the registry arrived, waiting to be encoded.

    They are raw values, so they stay in memory, never on disk, and their wait
    is bounded: at most ``limit`` values wait, and each is kept for sure for
    ``seconds`` after it was reported (:meth:`expire` removes the older ones).

    Two locks. ``lock`` guards the values; the client also holds it while it
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
    if isinstance(registry, str | os.PathLike):
        return Registry.load(os.fspath(registry))
    raise ParameterError(
        "registry",
        f"registry must be a Registry, a path to a TOML file, or None (fetch it from the "
        f"collector); got {type(registry).__name__}",
    )


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
