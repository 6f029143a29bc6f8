"""Discovery of frequent strings nobody listed: prefix extension over the discovery channel.

Level ``L`` of a discovery channel (:mod:`veil.shared.kinds.discovery`) holds
reports of ``(fp(P), z)``: the fingerprint of a value's first ``L`` segments and its
segment ``L``. Its support counts for *every* such pair come from one Walsh-Hadamard
transform (:func:`support_counts`), so a level costs the same however many prefixes
are examined. :class:`PrefixSearch` walks the levels: the prefixes kept at level
``L`` are extended by every possible segment, and an extension is kept when its
estimated share passes a threshold set by the known noise of the level and the
stated number of false prefixes per level (``false_prefixes``): half of it is spent as a
Bonferroni bound over every extension examined, the other half on extensions just below
that bound which the next level confirms (:func:`pair_threshold`); extensions that hold
the end marker (or fill ``max_length``) are the discovered strings. Those then go to the
string decoder over the string channel (:func:`~veil.server.analysis.api.discover`),
which states estimates, standard errors, p-values and controls the false discovery rate:
a false prefix that survives the search is one more candidate under that control.

The share of an extension is corrected for the values of *other* prefixes with the
same fingerprint: their mass at segment ``z`` is the mean over fingerprints that no
kept prefix uses (unbiased: fingerprints are uniform over prefixes).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import normal_isf, walsh_hadamard
from veil.server.counts import CountsArrays
from veil.shared.errors import ParameterError
from veil.shared.kinds.discovery import END, PAD, DiscoveryParams, prefix_fingerprint

#: most entries (``2**t`` per report, int64) of the span :func:`support_counts` builds at once
SPAN_ENTRIES = 1 << 25
#: default expected number of false prefixes kept per level
DEFAULT_FALSE_PREFIXES = 2.0
#: default most prefixes kept per level (the highest estimated shares)
DEFAULT_MAX_PREFIXES = 100
#: default z-score above which an extension is kept if the next level confirms it
DEFAULT_TENTATIVE_Z = 3.0
#: default most extensions per level that wait for the next level's confirmation
DEFAULT_MAX_TENTATIVE = 2000


def payload_rows(params: DiscoveryParams, payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, buckets)`` of payloads held as ``(n, payload_size)`` uint8: the hash matrix
    rows as ``(t, n)`` int64 and the buckets as ``(n,)`` int64."""
    payloads = np.asarray(payloads, dtype=np.uint8)
    t, width = params.bucket_bits or 0, params.row_bytes
    if payloads.ndim != 2 or payloads.shape[1] != params.payload_size:
        raise ParameterError("payloads", f"must be (n, {params.payload_size}) bytes; got "
                                         f"shape {payloads.shape}")
    rows = np.zeros((t, len(payloads)), dtype=np.int64)
    for i in range(t):
        for j in range(width):
            rows[i] = (rows[i] << 8) | payloads[:, i * width + j]
    return rows, payloads[:, -1].astype(np.int64)


def support_counts(rows: np.ndarray, buckets: np.ndarray, domain_bits: int) -> np.ndarray:
    """How many reports support each vector ``x`` of the domain: ``#{i : A_i x = y_i}``.

    ``[A x = y] = 2**-t sum_u (-1)^(u . (A x + y))``, so the counts are the transform of
    ``F(v) = sum_i sum_u (-1)^(u . y_i) [A_i^T u = v]`` divided by ``2**t``: ``n 2**t``
    additions, in chunks of at most :data:`SPAN_ENTRIES` (memory stays bounded however
    many reports), and one transform of ``2**D`` entries.
    """
    t, n = rows.shape
    odd = np.array([[(u & y).bit_count() & 1 for y in range(1 << t)] for u in range(1 << t)],
                   dtype=np.int64)
    tally: np.ndarray | None = None
    step = max(1, SPAN_ENTRIES >> t)
    for start in range(0, n, step):
        part = rows[:, start: start + step]
        span = np.empty((1 << t, part.shape[1]), dtype=np.int64)
        span[0] = 0
        for u in range(1, 1 << t):
            low = (u & -u).bit_length() - 1
            np.bitwise_xor(span[u & (u - 1)], part[low], out=span[u])
        span <<= 1
        span |= odd[:, buckets[start: start + step]]
        counted = np.bincount(span.ravel(), minlength=1 << (domain_bits + 1))
        tally = counted if tally is None else tally + counted
    if tally is None:
        return np.zeros(1 << domain_bits, dtype=np.float32)
    signed = (tally[0::2] - tally[1::2]).astype(np.float32)
    return walsh_hadamard(signed) / np.float32(1 << t)


def level_shares(params: DiscoveryParams, rows: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Unbiased share of each ``(fingerprint, segment)`` pair among one level's reports,
    shape ``(2**fingerprint_bits, 2**(8 * segment))``."""
    n = len(buckets)
    p, q = params.support_probs
    if n == 0:
        return np.zeros((1 << params.fingerprint_bits, 1 << params.segment_bits), np.float32)
    counts = support_counts(rows, buckets, params.domain_bits)
    shares = (counts / np.float32(n) - np.float32(q)) / np.float32(p - q)
    return shares.reshape(1 << params.fingerprint_bits, 1 << params.segment_bits)


@dataclasses.dataclass(frozen=True)
class Level:
    """What the search did at one level: its reports, noise and the prefixes it kept."""

    level: int
    reports: int
    std_error: float
    #: the share an extension had to pass where other prefixes' values add no spread (the
    #: level's noise alone); common segments, and tentative extensions, have their own cut
    threshold: float
    examined: int
    kept: tuple[tuple[bytes, float], ...]
    ended: tuple[tuple[bytes, float], ...]
    #: extensions below the threshold that the next level confirmed
    confirmed: int = 0


@functools.lru_cache(maxsize=256)
def pair_threshold(low: float, width: int, tested: int, false_rate: float) -> float:
    """The ``z`` for which ``tested`` absent extensions, each with its level's z-score ``a``
    above ``low``, pass ``a + M > z`` with ``M`` the largest of ``width`` z-scores of its
    own absent extensions at the next level, ``false_rate`` times in expectation (the
    integral over ``a`` by the trapezoid rule on 4,001 points, ``z`` by bisection)."""
    from scipy import special  # at first use, as the stats module's tails

    grid = np.linspace(low, low + 12.0, 4001)
    weight = np.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi) / float(special.ndtr(-low))

    step = grid[1] - grid[0]

    def passing(z: float) -> float:
        integrand = weight * -np.expm1(width * special.log_ndtr(z - grid))
        return tested * float(step * (integrand.sum() - (integrand[0] + integrand[-1]) / 2))

    lower, upper = low, low + 40.0
    for _ in range(60):
        middle = (lower + upper) / 2
        if passing(middle) > false_rate:
            lower = middle
        else:
            upper = middle
    return upper


@dataclasses.dataclass
class PrefixSearch:
    """Walk the levels of a discovery channel (see the module docstring).

    ``false_prefixes``: expected number of prefixes kept per level that only noise put
    above the threshold (sets the thresholds: half is spent on extensions kept on their
    level's estimate alone, half on those confirmed by the next level). Fingerprint
    twins come on top: when two kept prefixes share a fingerprint, each one's
    extensions also appear under the other, about ``kept**2 / 2**(fingerprint_bits + 1)``
    pairs a level; a twin holds no value, so the next level drops it, or the string
    decoder does if it ended.

    ``max_prefixes``: most prefixes kept per level (the highest estimates);
    ``tentative_z``: extensions whose z-score passes it but not the threshold are kept
    when the next level confirms them (their own z-score plus the largest of their
    extensions' passes :func:`pair_threshold`; only those whose next fingerprint no kept
    prefix or ended string shares, whose extensions the next level sees alone), at most
    ``max_tentative`` a level.

    After :meth:`fit`: ``levels_`` (one :class:`Level` each) and ``strings_``
    (discovered value -> estimated share at the level where it ended). Strings that
    are not valid UTF-8 (whatever noise spelled) are left out.
    """

    params: DiscoveryParams
    false_prefixes: float = DEFAULT_FALSE_PREFIXES
    max_prefixes: int = DEFAULT_MAX_PREFIXES
    tentative_z: float = DEFAULT_TENTATIVE_Z
    max_tentative: int = DEFAULT_MAX_TENTATIVE
    progress: Any = None

    def fit(self, levels: Iterable[tuple[np.ndarray, np.ndarray]]) -> PrefixSearch:
        """Search over ``(rows, buckets)`` of each level in order (:func:`payload_rows`)."""
        if isinstance(self.max_prefixes, bool) or not isinstance(self.max_prefixes, int) \
                or self.max_prefixes < 1:
            raise ParameterError("max_prefixes", f"must be an integer >= 1; got "
                                                 f"{self.max_prefixes!r}")
        # more false prefixes a level than a level keeps would fill it with noise, and from
        # twice the extensions a level examines (the first examines one segment's values) the
        # per-extension rate is no probability: its threshold NaN, nothing found, silently
        first_level = 2 << self.params.segment_bits
        if isinstance(self.false_prefixes, bool) or not isinstance(self.false_prefixes, int | float) \
                or not 0 < self.false_prefixes <= self.max_prefixes \
                or not self.false_prefixes < first_level:
            raise ParameterError("false_prefixes", "false_prefixes (--false-prefixes) must be a "
                                 "number above 0 and at most the "
                                 f"{self.max_prefixes} prefixes a level keeps, and below "
                                 f"{first_level} (twice the extensions the first level "
                                 f"examines); got {self.false_prefixes!r}")
        params = self.params
        started = time.perf_counter()
        self.levels_: list[Level] = []
        self.strings_: dict[str, float] = {}
        stream = iter(levels)
        current = self._shares(next(stream, None))
        kept: list[bytes] = [b""]
        ended: set[bytes] = set()
        for index in range(params.levels):
            if current is None or not kept:
                break
            following = self._shares(next(stream, None)) if index + 1 < params.levels else None
            level = self._extend(index, kept, ended, current, following)
            self.levels_.append(level)
            for prefix, share in level.ended:
                ended.add(prefix)
                value = _text(params.value_of(prefix))
                if value is not None:
                    self.strings_[value] = max(share, self.strings_.get(value, -math.inf))
            kept = [prefix for prefix, _ in level.kept]
            current = following
            if self.progress is not None:
                self.progress(index + 1, params.levels)
        self.seconds_ = time.perf_counter() - started
        return self

    def _shares(self, level: tuple[np.ndarray, np.ndarray] | None,
                ) -> tuple[np.ndarray | None, int] | None:
        if level is None:
            return None
        rows, buckets = level
        return (level_shares(self.params, rows, buckets) if len(buckets) else None), len(buckets)

    def _fingerprints(self, prefixes: Sequence[bytes]) -> set[int]:
        """The fingerprints of ``prefixes``."""
        return {prefix_fingerprint(p, self.params.fingerprint_bits) for p in prefixes}

    def _ended_fingerprints(self, ended: set[bytes], length: int) -> set[int]:
        """Fingerprints of the ended strings' padded prefixes of ``length`` bytes."""
        bits = self.params.fingerprint_bits
        return {prefix_fingerprint(p.ljust(length, bytes([PAD]))[:length], bits) for p in ended}

    def _own(self, shares: np.ndarray, live: Sequence[bytes], ended: set[bytes],
             length: int, std_error: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fingerprints of ``live`` prefixes (``length`` bytes); per fingerprint row, the shares
        less what other prefixes put there (the mean of unused fingerprints; the padding
        segment, where values that ended earlier report, is ruled out: a live prefix does
        not continue with it); and per segment the standard error of that: the level's
        ``std_error``, or the spread over unused fingerprints where other prefixes' values
        make it larger (common segments)."""
        params = self.params
        fingerprints = np.array([prefix_fingerprint(p, params.fingerprint_bits) for p in live],
                                dtype=np.int64)
        ended_fps = np.array(sorted(self._ended_fingerprints(ended, length)), dtype=np.int64)
        free = np.ones(shares.shape[0], dtype=np.bool_)
        free[fingerprints] = False
        free[ended_fps] = False
        background, scale = self._background(shares, free, std_error)
        own = shares[fingerprints] - background
        own[:, params.padding_segment] = -np.inf
        return fingerprints, own, scale

    @staticmethod
    def _background(shares: np.ndarray, free: np.ndarray, std_error: float,
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Per segment, the mean share over the ``free`` fingerprints and the standard error of
        a row less that mean (see :meth:`_own`)."""
        floor = np.float32(std_error)
        if free.sum() < 2:
            width = shares.shape[1]
            return np.zeros(width, np.float32), np.full(width, floor, np.float32)
        unused = shares[free]
        return unused.mean(axis=0), np.maximum(unused.std(axis=0), floor)

    def _extend(self, index: int, kept: Sequence[bytes], ended: set[bytes],
                current: tuple[np.ndarray | None, int],
                following: tuple[np.ndarray | None, int] | None) -> Level:
        params = self.params
        shares, n = current
        width = 1 << params.segment_bits
        examined = len(kept) * width
        std_error = math.sqrt(params.share_variance(0.0, n)) if n else math.inf
        rate = self.false_prefixes / 2
        z_high = normal_isf(rate / examined)
        threshold = z_high * std_error
        if shares is None:
            return Level(index, n, std_error, threshold, examined, (), ())
        _, own, scale = self._own(shares, kept, ended, index * params.segment, std_error)
        z = own / scale
        parents, segments = np.nonzero(z > z_high)
        found = [(float(own[p, s]), kept[int(p)] + int(s).to_bytes(params.segment, "big"))
                 for p, s in zip(parents, segments, strict=True)]
        confirmed = 0
        next_shares, next_n = following if following is not None else (None, 0)
        if next_shares is not None and self.tentative_z < z_high:
            low_p, low_s = np.nonzero((z > self.tentative_z) & (z <= z_high))
            if len(low_p) > self.max_tentative:
                best = np.argsort(z[low_p, low_s])[-self.max_tentative:]
                low_p, low_s = low_p[best], low_s[best]
            tentative = [kept[int(p)] + int(s).to_bytes(params.segment, "big")
                         for p, s in zip(low_p, low_s, strict=True)]
            if tentative:
                next_error = math.sqrt(params.share_variance(0.0, next_n))
                length = (index + 1) * params.segment
                strong = [c for _, c in found]
                taken = self._fingerprints(strong) | self._ended_fingerprints(ended, length)
                free = np.ones(next_shares.shape[0], dtype=np.bool_)
                free[sorted(taken)] = False
                background, next_scale = self._background(next_shares, free, next_error)
                bits = params.fingerprint_bits
                tentative_fps = np.array([prefix_fingerprint(c, bits) for c in tentative])
                fps, row_of = np.unique(tentative_fps, return_inverse=True)
                next_z = (next_shares[fps] - background) / next_scale
                ends = np.array([_ends(c, params.segment) for c in tentative])
                best_next = np.where(ends, next_z[row_of, params.padding_segment],
                                     next_z.max(axis=1)[row_of])
                alone = np.array([fp not in taken for fp in tentative_fps.tolist()])
                pair = z[low_p, low_s] + best_next
                open_cut = pair_threshold(self.tentative_z, width, len(tentative), rate / 2)
                end_cut = pair_threshold(self.tentative_z, 1, len(tentative), rate / 2)
                passed = alone & (pair > np.where(ends, end_cut, open_cut))
                for i in np.flatnonzero(passed):
                    found.append((float(own[low_p[i], low_s[i]]), tentative[i]))
                confirmed = int(passed.sum())
        found.sort(reverse=True)
        found = found[: self.max_prefixes]
        last = index == params.levels - 1  # a prefix of max_length bytes is complete
        done = tuple((c, s) for s, c in found
                     if _ends(c, params.segment) or (last and END not in c[-params.segment:]))
        going = tuple((c, s) for s, c in found
                      if not last and END not in c[-params.segment:])
        return Level(index, n, std_error, threshold, examined, going, done, confirmed)


def _ends(prefix: bytes, segment: int) -> bool:
    """Whether a prefix's last segment is the end marker followed by padding only (what a
    value that ends there reports; an end marker followed by other bytes is impossible)."""
    last = prefix[-segment:]
    return END in last and all(byte == PAD for byte in last[last.index(END) + 1:])


def _text(value: bytes) -> str | None:
    """A found value's bytes as text; ``None`` when they are not UTF-8 (no string reports
    them: noise spelled them)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def reports_by_level(params: DiscoveryParams, chunks: Iterable[tuple[np.ndarray, np.ndarray]],
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Group ``(cohorts, payloads)`` chunks into ``(rows, buckets)`` per level."""
    rows: list[list[np.ndarray]] = [[] for _ in range(params.levels)]
    buckets: list[list[np.ndarray]] = [[] for _ in range(params.levels)]
    for cohorts, payloads in chunks:
        chunk_rows, chunk_buckets = payload_rows(params, payloads)
        order = np.argsort(cohorts, kind="stable")
        bounds = np.searchsorted(cohorts[order], np.arange(params.levels + 1))
        for level in range(params.levels):
            pick = order[bounds[level]: bounds[level + 1]]
            if len(pick):
                rows[level].append(chunk_rows[:, pick])
                buckets[level].append(chunk_buckets[pick])
    t = params.bucket_bits or 0
    return [(np.concatenate(r, axis=1) if r else np.zeros((t, 0), np.int64),
             np.concatenate(b) if b else np.zeros(0, np.int64))
            for r, b in zip(rows, buckets, strict=True)]



@dataclasses.dataclass
class DiscoveryResult:
    """What :func:`~veil.server.analysis.api.discover` found: the string decoder's table
    over the discovered strings (``result``, the tidy schema of ``veil decode``) and the
    prefix search (``search``)."""

    result: DecodeResult
    search: PrefixSearch

    def prefix_rows(self) -> list[dict[str, Any]]:
        """Every prefix the search kept, level by level: ``level``, ``prefix`` (its bytes as
        text, the end marker and padding left out), ``share``, ``ended``."""
        rows = []
        for level in self.search.levels_:
            for ended, prefixes in ((False, level.kept), (True, level.ended)):
                for prefix, share in prefixes:
                    value = self.search.params.value_of(prefix)
                    text = value.decode("utf-8", errors="replace")
                    rows.append({"level": level.level, "prefix": text, "share": share,
                                 "ended": ended})
        return rows


@decodes(DiscoveryParams)
def decode_discovery(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """A discovery channel's counts (buckets per level) hold no strings: its reports are
    searched with :func:`~veil.server.analysis.api.discover` (``veil discover``), which
    reads them raw. Raises a :class:`ParameterError` saying so."""
    raise ParameterError(
        "metric",
        f"{counts.metric or 'this metric'} is a discovery channel: its strings are found from "
        "the raw reports with veil discover --db ... --metric <its string metric> (or "
        "veil.server.analysis.discover), not decoded from counts")
