"""Sources of randomness for the encoders.

* :class:`FreshStream` draws from the operating system's CSPRNG
  (``os.urandom``) for noise that must be new in every report (RAPPOR's IRR).
* :class:`HmacStream` is a deterministic stream keyed by the installation
  secret, for noise that must be the same every time a value is reported
  (RAPPOR's PRR and every other memoized response). Block ``i`` (from 1) is::

      HMAC-SHA256(secret, be32(i) || "veil-v1" || 0x00 || purpose || 0x00 || metric || 0x00 || context)

  which is the counter-mode key derivation of NIST SP 800-108 with HMAC-SHA256.

Since stream layout 2 (:data:`STREAM_LAYOUT`) every memoized response's ``context``
begins with the parameters' fingerprint and ``0x00`` (see
:meth:`veil.client.encoders.base.Encoder.permanent_stream`), so that two parameter sets
declared under one metric name draw independent responses.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from fractions import Fraction

DOMAIN = b"veil-v1"

#: the layout of the memoized streams this SDK derives for parameters it has not reported
#: under before (docs/protocol.md, section 4). Layout 1, of older SDKs, left the fingerprint
#: out of the contexts of strings, RAPPOR categories, booleans and numbers; an installation
#: keeps it for the parameter sets it reported under then (:mod:`veil.client.accounting`)
STREAM_LAYOUT = 2


class RandomStream:
    """Uniform bytes plus the exact integer samplers built on them."""

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def u32(self) -> int:
        """A uniform integer in ``[0, 2**32)`` (4 bytes, big-endian)."""
        return int.from_bytes(self.read(4), "big")

    def randbelow(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` by rejection sampling (exact)."""
        if n <= 1:
            return 0
        bits = (n - 1).bit_length()
        nbytes = (bits + 7) // 8
        excess = nbytes * 8 - bits
        while True:
            candidate = int.from_bytes(self.read(nbytes), "big") >> excess
            if candidate < n:
                return candidate

    def bernoulli(self, probability: Fraction) -> bool:
        """True with exactly ``probability`` (a rational in [0, 1])."""
        return self.randbelow(probability.denominator) < probability.numerator


class FreshStream(RandomStream):
    """Fresh randomness from a byte source (``os.urandom`` unless a test injects one)."""

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self.random_bytes = random_bytes

    def read(self, n: int) -> bytes:
        return self.random_bytes(n)


def keyed(secret: bytes) -> hmac.HMAC:
    """HMAC-SHA256 keyed with ``secret``, to give :class:`HmacStream` instead of the secret
    when one party derives many streams (the key schedule is then computed once)."""
    return hmac.new(secret, digestmod=hashlib.sha256)


class HmacStream(RandomStream):
    """Deterministic bytes derived from ``secret`` for (``purpose``, ``metric``, ``context``)."""

    def __init__(self, secret: bytes | hmac.HMAC, purpose: bytes, metric: str,
                 context: bytes) -> None:
        # a keyed HMAC (:func:`keyed`) is only ever copied, so many streams share one
        self._mac = keyed(secret) if isinstance(secret, bytes) else secret
        self._suffix = DOMAIN + b"\0" + purpose + b"\0" + metric.encode() + b"\0" + context
        self._counter = 0
        self._buffer = b""

    def read(self, n: int) -> bytes:
        blocks = [self._buffer]
        have = len(self._buffer)
        while have < n:
            self._counter += 1
            mac = self._mac.copy()
            mac.update(self._counter.to_bytes(4, "big") + self._suffix)
            block = mac.digest()
            blocks.append(block)
            have += len(block)
        data = b"".join(blocks)
        self._buffer = data[n:]
        return data[:n]
