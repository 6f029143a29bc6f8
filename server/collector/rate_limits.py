"""Rate limits on uploads: how many reports a source network or an upload token may send.

Forged reports cannot be told from honest ones (docs/threat-model.md), so the
collector bounds how many any one source can contribute. Each rate limit is a
token bucket of reports: ``rate`` reports a second on average, bursts of up to
``burst``. A batch that would overdraw its bucket is refused whole with 429 and
``Retry-After``; the SDK retries it later.

Sources are never stored or logged: a bucket is keyed by a keyed hash (BLAKE2b
with a random key drawn when the process starts) of the source's network (the
address's /24 for IPv4, /48 for IPv6) or of the upload token. Buckets live in
the memory of each worker process and are forgotten on restart; ``veil serve``
divides the configured rates among its workers.

The daily cap per upload token is not a bucket: the store counts each token's
reports per UTC day in the transaction that stores them (:class:`DailyCap`), so
it holds across workers, restarts and collectors sharing a database.
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

from veil.server.storage.base import DailyCap
from veil.shared.errors import ParameterError

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


#: what an upload token's daily count is stored under: SHA-256 of this label and the token
TOKEN_CAP_LABEL = b"veil upload token daily cap\x00"


def token_cap_key(token: bytes) -> bytes:
    """The key the store counts an upload token's reports under: a SHA-256 of the token
    (after :data:`TOKEN_CAP_LABEL`), never the token itself.

    Not keyed: every collector sharing a database must derive the same key, so a key would
    have to live in that database beside the counts and would hide nothing from whoever
    reads them. What makes the hash impossible to invert is the token's own entropy
    (``veil init`` draws 256 bits); the label keeps the digest from equalling a plain
    SHA-256 of the token kept anywhere else.
    """
    return hashlib.sha256(TOKEN_CAP_LABEL + token).digest()


@dataclasses.dataclass(frozen=True)
class UploadLimits:
    """The limits a collector process applies to uploads (``None`` or 0: that limit is off)."""

    network: RateLimiter | None = None
    token: RateLimiter | None = None
    #: reports each upload token may have stored per UTC day (counted by the store)
    token_daily_cap: int = 0

    def check(self, network: str, token: str | None, reports: int) -> tuple[float, str] | None:
        """``None`` if ``reports`` more may be taken, else ``(seconds to wait, why)``.

        Limits are charged in order and a refusal charges nothing further; a batch
        refused by a later limit (or by the daily cap, at the store) keeps what earlier
        ones charged (conservative).
        """
        if self.network is not None:
            wait = self.network.take(network, reports)
            if wait is not None:
                return wait, f"this network sent more than {self.network.rate:g} reports a second"
        if token is not None and self.token is not None:
            wait = self.token.take(token, reports)
            if wait is not None:
                return wait, f"this upload token sent more than {self.token.rate:g} reports a second"
        return None

    def daily_cap(self, token: bytes | None) -> DailyCap | None:
        """The cap the store applies to an upload by ``token`` (``None``: uncapped)."""
        if token is None or not self.token_daily_cap:
            return None
        return DailyCap(token_cap_key(token), self.token_daily_cap)


def token_daily_cap(config: Mapping[str, Any]) -> int:
    """``TOKEN_DAILY_CAP`` (0: off), checked against the settings it depends on.

    A cap is a number of reports per upload token, so it needs ``UPLOAD_TOKEN`` (with open
    uploads it would cap nothing). It may not be smaller than ``MAX_REPORTS_PER_BATCH``: a
    batch is stored whole or refused whole, the SDK splits batches only on 413 (never on
    429), so a full batch above the cap would be refused every day, for good.
    """
    cap = config.get("TOKEN_DAILY_CAP") or 0
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ParameterError("token_daily_cap", "--token-daily-cap (TOKEN_DAILY_CAP) must be 0 "
                             f"(off) or a positive integer; got {cap!r}")
    if not cap:
        return 0
    if not config.get("UPLOAD_TOKEN"):
        raise ParameterError("token_daily_cap", f"--token-daily-cap {cap} caps each upload "
                             "token, but uploads are open (no --upload-token; UPLOAD_TOKEN): "
                             "give upload tokens, or leave the cap out and use --network-rate")
    largest = int(config["MAX_REPORTS_PER_BATCH"])
    if cap < largest:
        raise ParameterError("token_daily_cap", f"--token-daily-cap {cap} is smaller than "
                             f"--max-reports {largest} (TOKEN_DAILY_CAP, MAX_REPORTS_PER_BATCH): "
                             "a batch is stored or refused whole, and a batch above the cap "
                             f"would be refused every day. Lower --max-reports to {cap} or less "
                             "(clients split their batches to fit), or raise the cap")
    return cap


@dataclasses.dataclass(frozen=True)
class _Sizing:
    """How ``veil serve`` sizes one worker's buckets: the ``workers``, the ``largest`` batch
    and the ``seconds`` of burst."""

    workers: int
    largest: int
    seconds: float

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> _Sizing:
        return cls(max(int(config.get("WORKERS", 1)), 1), int(config["MAX_REPORTS_PER_BATCH"]),
                   float(config["RATE_BURST_SECONDS"]))

    def limiter(self, rate: float) -> RateLimiter | None:
        """A worker's bucket for ``rate`` (``None``: off): its share of the rate, bursting
        ``seconds`` of it and at least one full batch, so that any accepted batch can pass."""
        if not rate:
            return None
        share = float(rate) / self.workers
        return RateLimiter(share, max(share * self.seconds, self.largest))


def burst_warnings(config: Mapping[str, Any]) -> list[str]:
    """What ``veil serve`` warns about its rates: a rate whose share per worker bursts less
    than one full batch gets a full batch in every worker (:func:`upload_limits`), so a
    source may send ``WORKERS`` batches at once, more than ``RATE_BURST_SECONDS`` of the rate."""
    sizing = _Sizing.of(config)
    workers, largest, seconds = sizing.workers, sizing.largest, sizing.seconds
    out = []
    for key, option in (("NETWORK_RATE", "--network-rate"), ("TOKEN_RATE", "--token-rate")):
        rate = float(config.get(key) or 0)
        limiter = sizing.limiter(rate)
        if limiter is not None and workers > 1 and limiter.burst > limiter.rate * seconds:
            out.append(
                f"{option} {rate:g} with --burst-seconds {seconds:g} bursts {rate * seconds:g} "
                f"reports, but each of the {workers} workers keeps its own bucket of at least one "
                f"batch (--max-reports {largest}): a source may send {workers * largest} reports "
                f"at once. Lower --max-reports to {max(int(rate * seconds / workers), 1)} or "
                f"raise --burst-seconds to {math.ceil(workers * largest / rate)}")
    return out


def upload_limits(config: Mapping[str, Any]) -> UploadLimits:
    """The limits of one worker process: the configured rates divided among ``WORKERS``
    processes (each takes its share of the connections), bursts at least one full batch so
    that any accepted batch size can pass; the daily cap whole (the store counts it)."""
    sizing = _Sizing.of(config)
    return UploadLimits(sizing.limiter(config["NETWORK_RATE"]),
                        sizing.limiter(config["TOKEN_RATE"]), token_daily_cap(config))
