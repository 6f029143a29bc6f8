"""String discovery: the prefix-extension channel of a string metric.

A string metric may send a share of its installations to a *discovery channel*
(a ``[metrics.NAME.discovery]`` table in the registry, which becomes the metric
``NAME.discovery`` of this kind). Each installation is assigned once, from its
secret, either to the string channel or to one discovery *level*; it reports
through that channel only, so its privacy cost is the larger of the two
channels' epsilons, never their sum.

A value is read as its UTF-8 bytes, cut at :attr:`DiscoveryParams.max_length`,
followed by the end marker ``0x00`` (unless it fills ``max_length``: a prefix that
long is complete) and padded with ``0x01`` to ``levels * segment`` bytes, where
``levels = ceil(max_length / segment)``. The padding differs from the end marker so
that values which ended at earlier levels (padding only) never land where a value
that ends at this level does (its end marker). Level ``L`` (the report's cohort, ``0 .. levels-1``)
reports the pair ``(fp(P), z)`` of the first ``L`` segments ``P`` (their
fingerprint, :func:`prefix_fingerprint`) and segment ``L`` itself (``z``, the next
``segment`` bytes), as one vector ``x`` of :attr:`~DiscoveryParams.domain_bits`
bits: ``fp(P) << (8 * segment) | z``.

The frequency oracle is local hashing over the linear family of GF(2): a hash
function is a random ``t x D`` bit matrix ``A`` and hashes ``x`` to the ``t``-bit
bucket ``A x``. For ``x != x'`` exactly ``2**-t`` of all matrices collide, so the
estimator is exactly unbiased, and the support counts of every vector of the
domain at once take one Walsh-Hadamard transform (decoding is independent of how
many prefixes are examined). Permanent response (memoized per value): ``A`` and the
bucket through generalized randomized response over ``2**t`` buckets at
``epsilon``; instantaneous response: the bucket kept with probability ``lambda``
(the largest within ``report_epsilon``), else a uniformly random bucket.

Payload: ``t`` rows of ``A`` (row ``i`` gives bit ``i`` of the bucket, each row
``ceil(D / 8)`` bytes big-endian), then the bucket as one byte; hex on the wire.

The collector keeps per level only how many reports fell in each bucket; the
search reads the raw reports (:attr:`DiscoveryParams.reads_raw_reports`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Any, ClassVar

from veil.shared.bits import check_realized
from veil.shared.errors import ParameterError, WireFormatError
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.oracles.base import (
    EPSILON_FIELDS,
    check_report_epsilon,
    log_ratio,
    support_share_variance,
    uninformative_report,
    unrealizable_epsilon,
)
from veil.shared.kinds.oracles.olh import (
    bucket_channel,
    bucket_prr_epsilon,
    numerators,
    zero_share_variance,
)
from veil.shared.privacy import round_up
from veil.shared.validation import Interval, check_fields

#: the ``person`` of the BLAKE2b prefix fingerprint (public: the collector recomputes it)
FINGERPRINT_PERSON = b"veil-discovery"
#: the byte that ends a value
END = 0x00
#: the byte that pads a value after its end
PAD = 0x01
#: largest domain (fingerprint plus segment bits) whose transform the decoder affords
MAX_DOMAIN_BITS = 26
#: the name suffix of a string metric's discovery channel
CHANNEL_SUFFIX = ".discovery"


def prefix_fingerprint(prefix: bytes, bits: int) -> int:
    """The top ``bits`` bits of ``BLAKE2b-64(prefix, person="veil-discovery")``, big-endian."""
    if bits == 0:
        return 0
    digest = hashlib.blake2b(prefix, digest_size=8, person=FINGERPRINT_PERSON).digest()
    return int.from_bytes(digest, "big") >> (64 - bits)


def best_bucket_bits(epsilon: float, report_epsilon: float) -> int:
    """The ``t`` in ``1..8`` of lowest variance
    (:func:`~veil.shared.kinds.oracles.olh.zero_share_variance` with ``2**t`` buckets;
    Wang et al.'s optimum is ``2**t = e^eps + 1``)."""
    return min(range(1, 9), key=lambda t: zero_share_variance(1 << t, epsilon, report_epsilon))


@dataclasses.dataclass(frozen=True)
class DiscoveryParams(MechanismParams):
    """Prefix-extension discovery (see the module docstring).

    ``share``: the fraction of installations on the discovery channel (the rest report
    through the string channel); ``segment``: bytes added per level (1 or 2);
    ``max_length``: bytes of a value that can be discovered (longer values are cut);
    ``epsilon`` / ``report_epsilon``: what all reports / one report of a value reveal
    (``report_epsilon`` defaults to ``epsilon``: one report per value is the usual
    case, and a lower one makes repeated reports differ at a cost in variance);
    ``fingerprint_bits``: bits of the prefix fingerprint; ``bucket_bits``: ``t``
    (chosen for the lowest variance when omitted).
    """

    kind: ClassVar[str] = "discovery"
    channel_of: ClassVar[str] = "string"
    has_cohorts: ClassVar[bool] = True
    reads_raw_reports: ClassVar[bool] = True
    min_wire_version: ClassVar[int] = 2
    sized_by: ClassVar[tuple[str, ...]] = ("max_length", "bucket_bits")

    share: float = 0.9
    segment: int = 2
    max_length: int = 64
    epsilon: float = 4.0
    report_epsilon: float | None = None
    fingerprint_bits: int = 8
    bucket_bits: int | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.report_epsilon is None and isinstance(self.epsilon, int | float):
            object.__setattr__(self, "report_epsilon", self.epsilon)
        check_fields(owner, dataclasses.asdict(self), {
            "share": Interval(float, 0, 1, "neither"),
            "segment": Interval(int, 1, 2),
            "max_length": Interval(int, 1, 1024),
            **EPSILON_FIELDS,
            "fingerprint_bits": Interval(int, 0, 16),
        })
        check_realized(owner, "share", self.share)
        check_report_epsilon(owner, self.epsilon, float(self.report_epsilon or 0.0))
        if self.bucket_bits is None:
            object.__setattr__(self, "bucket_bits",
                               best_bucket_bits(self.epsilon, float(self.report_epsilon or 0)))
        check_fields(owner, {"bucket_bits": self.bucket_bits},
                     {"bucket_bits": Interval(int, 1, 8)})
        if self.domain_bits > MAX_DOMAIN_BITS:
            raise ParameterError(
                "fingerprint_bits",
                f"{owner}: fingerprint_bits + 8 * segment = {self.domain_bits} bits, more than "
                f"the {MAX_DOMAIN_BITS} the decoder transforms; lower fingerprint_bits")
        self._check_informative(owner)

    def _check_informative(self, owner: str) -> None:
        """Refuse epsilons whose realized responses carry no information: the permanent
        response's (``epsilon``), or the instantaneous response's (``report_epsilon``)."""
        prr, irr = self.numerators
        if not bucket_prr_epsilon(self.buckets, prr) > 0:
            raise unrealizable_epsilon(owner, self.epsilon,
                                       bucket_prr_epsilon(self.buckets, prr + 1),
                                       f"over {self.buckets} buckets")
        if irr == 0:
            raise uninformative_report(
                owner, self.report_epsilon, log_ratio(*bucket_channel(self.buckets, prr, 1)),
                f"over {self.buckets} buckets with epsilon={self.epsilon!r}")

    # --- layout ----------------------------------------------------------------------

    @property
    def levels(self) -> int:
        """Number of levels: the segments of ``max_length`` bytes (32 by default, which
        divides the 64 cohorts of string metrics: an installation's level, its cohort seed
        modulo the levels, then says nothing its cohort there does not)."""
        return -(-self.max_length // self.segment)

    @property
    def cohorts(self) -> int:
        return self.levels

    @property
    def channel_share(self) -> float:
        return self.share

    @property
    def segment_bits(self) -> int:
        """Bits of one segment (``8 * segment``)."""
        return 8 * self.segment

    @property
    def domain_bits(self) -> int:
        """``D``: bits of the reported vector, fingerprint then segment."""
        return self.fingerprint_bits + self.segment_bits

    @property
    def buckets(self) -> int:
        """``g = 2**t``."""
        assert self.bucket_bits is not None
        return 1 << self.bucket_bits

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of the hash matrix on the wire."""
        return (self.domain_bits + 7) // 8

    @property
    def report_bytes(self) -> int:
        """Bytes of one report on a compact wire (:attr:`payload_size`), as the oracles state."""
        return self.payload_size

    @property
    def payload_size(self) -> int:
        """Bytes of a payload: the ``t`` rows, then the bucket."""
        assert self.bucket_bits is not None
        return self.bucket_bits * self.row_bytes + 1

    def padded(self, value: bytes) -> bytes:
        """``value`` cut at ``max_length``, ended with ``0x00`` and padded with ``0x01`` (a
        value of ``max_length`` bytes or more has no room for the end marker, nor needs it)."""
        cut = value[: self.max_length]
        if len(cut) == self.max_length:
            return cut.ljust(self.levels * self.segment, bytes([PAD]))
        return (cut + bytes([END])).ljust(self.levels * self.segment, bytes([PAD]))

    def value_of(self, prefix: bytes) -> bytes:
        """The value a complete prefix stands for (the inverse of :meth:`padded`): its bytes
        up to ``max_length`` and before the end marker."""
        return prefix[: self.max_length].split(bytes([END]), 1)[0]

    @property
    def padding_segment(self) -> int:
        """The segment of padding only, as an integer: where values that ended earlier report."""
        return int.from_bytes(bytes([PAD]) * self.segment, "big")

    def vector(self, padded: bytes, level: int) -> int:
        """``x`` of a padded value at ``level``: ``fp(first level segments) << 8*segment | z``."""
        cut = level * self.segment
        z = int.from_bytes(padded[cut: cut + self.segment], "big")
        return prefix_fingerprint(padded[:cut], self.fingerprint_bits) << self.segment_bits | z

    # --- privacy ---------------------------------------------------------------------

    @functools.cached_property
    def numerators(self) -> tuple[int, int]:
        """``(N_prr, N_irr)``: the bucket's permanent and instantaneous numerators."""
        return numerators(self.buckets, self.epsilon, float(self.report_epsilon or 0.0))

    @property
    def support_probs(self) -> tuple[float, float]:
        """``(p, q)``: a report supports its own vector with ``p``, any other with ``1/g``."""
        return bucket_channel(self.buckets, *self.numerators)[0], 1 / self.buckets

    def share_variance(self, share: float = 0.0, reports: int = 1) -> float:
        """Variance of the estimated share of a vector whose true share is ``share``
        (:func:`~veil.shared.kinds.oracles.base.support_share_variance`)."""
        return support_share_variance(*self.support_probs, share, reports)

    @property
    def epsilon_inf(self) -> float:
        return round_up(bucket_prr_epsilon(self.buckets, self.numerators[0]))

    @property
    def epsilon_1(self) -> float:
        kept, other = bucket_channel(self.buckets, *self.numerators)
        # log1p: the ratio is close to 1 at small epsilons, where log(kept / other) rounds
        # below the exact value (the stated epsilon must never be below it)
        return round_up(math.log1p((kept - other) / other))

    # --- reports ---------------------------------------------------------------------

    @property
    def statistic(self) -> str:
        return "buckets"

    def parse_payload(self, payload: Any, field: str = "payload") -> bytes:
        """The payload's bytes; refuses a wrong length, a row with bits beyond ``D`` or a
        bucket beyond ``2**t - 1``."""
        size = self.payload_size
        if not isinstance(payload, str):
            raise WireFormatError(field, f"must be a string of {2 * size} hex digits", "wrong_type")
        if len(payload) != 2 * size:
            raise WireFormatError(
                field, f"must be {2 * size} hex digits; got {len(payload)}", "wrong_length")
        try:
            data = bytes.fromhex(payload)
        except ValueError:
            raise WireFormatError(field, "must contain only lowercase hex digits 0-9a-f",
                                  "bad_hex") from None
        if payload != data.hex():
            raise WireFormatError(field, "must contain only lowercase hex digits 0-9a-f", "bad_hex")
        limit = 1 << self.domain_bits
        rows = self.row_bytes
        for i in range(self.bucket_bits or 0):
            if int.from_bytes(data[i * rows: (i + 1) * rows], "big") >= limit:
                raise WireFormatError(
                    field, f"hash row {i} has bits beyond the {self.domain_bits}-bit domain",
                    "out_of_range")
        if data[-1] >= self.buckets:
            raise WireFormatError(
                field, f"bucket must be in [0, {self.buckets - 1}]; got {data[-1]}", "out_of_range")
        return data
