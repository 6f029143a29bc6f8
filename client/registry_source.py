"""Where the client's metric registry comes from: given locally, or fetched and cached.

A registry fetched through the client's transport (``GET /v1/metrics``) is
cached as ``registry.json`` in the state directory, so an application that
starts while the collector is unreachable still knows its metrics.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

from veil.client.errors import RegistryUnavailableError
from veil.client.state import REGISTRY_CACHE_FILE
from veil.client.transport import Transport
from veil.shared.errors import ParameterError, VeilError
from veil.shared.registry import Registry

log = logging.getLogger("veil.client")

#: with a cached registry to fall back on, start-up waits at most this long for the collector
CACHED_FETCH_TIMEOUT = 2.0


def resolve_registry(
    registry: Registry | str | os.PathLike[str] | None,
    url: str,
    directory: Path,
    transport: Transport,
    *,
    token: str | None,
    timeout: float,
) -> Registry:
    """A :class:`Registry` object, a TOML file path, or ``None`` (fetch, else the cache)."""
    if isinstance(registry, Registry):
        return registry
    if isinstance(registry, str | os.PathLike):
        return Registry.load(os.fspath(registry))
    if registry is not None:
        raise ParameterError(
            "registry",
            f"registry must be a Registry, a path to a TOML file, or None (fetch it from the "
            f"collector); got {type(registry).__name__}",
        )
    cache = directory / REGISTRY_CACHE_FILE
    if cache.exists():
        timeout = min(timeout, CACHED_FETCH_TIMEOUT)
    try:
        fetched = transport.fetch_registry(url, token=token, timeout=timeout)
    except VeilError as problem:
        cached = read_cache(cache)
        if cached is None:
            raise RegistryUnavailableError(
                f"cannot fetch the metric registry ({problem}) and no cached copy exists in "
                f"{directory}; start the collector, check the URL, or pass registry= "
                "(a Registry or a TOML file)"
            ) from None
        log.warning("using the cached metric registry: %s", problem)
        return cached
    write_cache(cache, fetched)
    for name, why in fetched.skipped.items():
        log.warning("metric %r of the registry is left out (reporting it raises "
                    "UnknownMetricError): %s", name, why)
    return fetched


def read_cache(path: Path) -> Registry | None:
    """The cached registry, or ``None`` if there is none or it cannot be read."""
    try:
        return Registry.from_dict(json.loads(path.read_text(encoding="utf-8")), lenient=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ParameterError) as exc:
        log.warning("ignoring the unreadable registry cache %s: %s", path, exc)
        return None


def write_cache(path: Path, registry: Registry) -> None:
    """Replace the cached registry atomically (a crash leaves the old or the new copy)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(registry.to_dict(), handle)
    os.replace(temporary, path)
