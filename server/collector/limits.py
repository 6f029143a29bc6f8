"""Rate limits on uploads: how many reports a source network or an upload token may send.

Forged reports cannot be told from honest ones (docs/threat-model.md), so the
collector bounds how many any one source can contribute. Each limit is a token
bucket of reports: ``rate`` reports a second on average, bursts of up to
``burst``. A batch that would overdraw its bucket is refused whole with 429 and
``Retry-After``; the SDK retries it later.

Sources are never stored or logged: a bucket is keyed by a keyed hash (BLAKE2b
with a random key drawn when the process starts) of the source's network (the
address's /24 for IPv4, /48 for IPv6) or of the upload token. Buckets live in
the memory of each worker process and are forgotten on restart; ``veil serve``
divides the configured rates among its workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

#: buckets kept at most per limiter; the least recently used go first (a full one is
#: the same as a forgotten one, so only a source flooding from more networks than this
#: loses its debt)
MAX_BUCKETS = 100_000


def network_of(address: str | None) -> str:
    """The network a client address belongs to for rate limiting: /24 (IPv4), /48 (IPv6)."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = 24 if ip.version == 4 else 48
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def _keyed_name(key: bytes, source: str) -> bytes:
    """What a bucket is kept under: a keyed hash of ``source``, never the source itself."""
    return hashlib.blake2b(source.encode("utf-8", "surrogatepass"), key=key, digest_size=16).digest()


class RateLimiter:
    """Token buckets of reports per source; thread-safe, bounded in memory."""

    def __init__(self, rate: float, burst: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(burst) and burst >= 1):
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1; got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._key = os.urandom(32)
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, source: str, reports: int) -> float | None:
        """Charge ``reports`` to ``source``: ``None`` if allowed, else the seconds to wait.

        A batch larger than the burst can never pass: it is refused with the time
        after which a full bucket would have to be split (the client splits
        batches on 413, not 429, so keep ``burst`` above the largest batch).
        """
        name = _keyed_name(self._key, source)
        now = self._clock()
        with self._lock:
            level, stamp = self._buckets.pop(name, (self.burst, now))
            level = min(self.burst, level + (now - stamp) * self.rate)
            if reports <= level:
                self._buckets[name] = (level - reports, now)
                allowed = True
            else:
                self._buckets[name] = (level, now)
                allowed = False
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        if allowed:
            return None
        return max((min(reports, self.burst) - level) / self.rate, 1.0)


class DailyCap:
    """At most ``limit`` reports per source and UTC day; thread-safe, bounded in memory."""

    def __init__(self, limit: int, *, clock: Callable[[], float] = time.time) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a daily cap needs a positive integer; got {limit!r}")
        self.limit = limit
        self._clock = clock
        self._key = os.urandom(32)
        self._counts: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, source: str, reports: int) -> float | None:
        """Count ``reports`` for ``source`` today: ``None`` if within the cap, else the
        seconds until the next UTC day (nothing is counted then)."""
        name = _keyed_name(self._key, source)
        now = self._clock()
        day = int(now // 86_400)
        with self._lock:
            counted_day, count = self._counts.pop(name, (day, 0))
            if counted_day != day:
                count = 0
            allowed = count + reports <= self.limit
            self._counts[name] = (day, count + reports if allowed else count)
            while len(self._counts) > MAX_BUCKETS:
                self._counts.popitem(last=False)
        return None if allowed else max((day + 1) * 86_400 - now, 1.0)


@dataclasses.dataclass(frozen=True)
class UploadLimits:
    """The limits a collector process applies to uploads (``None``: that limit is off)."""

    network: RateLimiter | None = None
    token: RateLimiter | None = None
    token_daily: DailyCap | None = None

    def check(self, network: str, token: str | None, reports: int) -> tuple[float, str] | None:
        """``None`` if ``reports`` more may be taken, else ``(seconds to wait, why)``.

        Limits are charged in order and a refusal charges nothing further; a batch
        refused by a later limit keeps what earlier ones charged (conservative).
        """
        if self.network is not None:
            wait = self.network.take(network, reports)
            if wait is not None:
                return wait, f"this network sent more than {self.network.rate:g} reports a second"
        if token is not None and self.token is not None:
            wait = self.token.take(token, reports)
            if wait is not None:
                return wait, f"this upload token sent more than {self.token.rate:g} reports a second"
        if token is not None and self.token_daily is not None:
            wait = self.token_daily.take(token, reports)
            if wait is not None:
                return wait, (f"this upload token reached its cap of {self.token_daily.limit} "
                              "reports today (UTC)")
        return None


def upload_limits(config: Mapping[str, Any]) -> UploadLimits:
    """The limits of one worker process: the configured rates and cap divided among
    ``WORKERS`` processes (each takes its share of the connections), bursts at least
    one full batch so that any accepted batch size can pass."""
    workers = max(int(config.get("WORKERS", 1)), 1)
    largest = int(config["MAX_REPORTS_PER_BATCH"])
    seconds = float(config["RATE_BURST_SECONDS"])

    def limiter(rate: float) -> RateLimiter | None:
        if not rate:
            return None
        share = float(rate) / workers
        return RateLimiter(share, max(share * seconds, largest))

    cap = int(config["TOKEN_DAILY_CAP"])
    return UploadLimits(limiter(config["NETWORK_RATE"]), limiter(config["TOKEN_RATE"]),
                        DailyCap(max(math.ceil(cap / workers), largest)) if cap else None)
