"""Categories through a frequency oracle: GRR, OUE, OLH or Hadamard response, memoized.

See :mod:`veil.shared.kinds.oracles` for the mechanisms. Every encoder here has the
same two steps:

* the **permanent response** of a category (:meth:`~Encoder.derive`), from the
  :class:`~veil.client.randomness.HmacStream` with purpose ``prr`` and context
  ``fingerprint || 0x00 || utf8(category)`` (the 16 hex digits of the parameters'
  fingerprint, ASCII), so it is the same every time the installation reports the
  category and is memoized, and parameters declared anew under the same metric name
  draw independent permanent responses (reusing the stream across two mechanisms
  would correlate their answers and void the sum of their epsilons);
* the **instantaneous response** (:meth:`~Encoder.finish`), from the CSPRNG for
  every report.

Every probability is exact: a probability ``N / 2**32`` (the parameters' realized
numerators) is a comparison ``u < N`` of a uniform 32-bit word ``u`` (big-endian,
:meth:`~veil.client.randomness.RandomStream.u32`), or for OUE's bit vectors its
bit-sliced form, and a uniform choice among ``n`` is
:meth:`~veil.client.randomness.RandomStream.randbelow` (rejection sampling on whole
bytes, big-endian, the top bits kept). Each class's docstring gives the layout of its
permanent stream: which words are read, in which order.
"""

from __future__ import annotations

from typing import Any, TypeVar

from veil.client.encoders.base import Encoder
from veil.client.encoders.rappor import IRR_MORE_WORDS, lowest_digit
from veil.client.randomness import HmacStream, RandomStream
from veil.shared.bits import (
    PROB_BITS,
    PROB_ONE,
    bernoulli_mask,
    bits_to_hex,
    mask_word_count,
    payload_bytes,
    split_words,
)
from veil.shared.kinds import GrrParams, HadamardParams, OlhParams, OracleParams, OueParams

Q = TypeVar("Q", bound=OracleParams)


class OracleEncoder(Encoder[Q]):
    """What the four oracle encoders share: the memo key, the permanent stream and the
    realized numerators ``N_prr`` and ``N_irr``."""

    def __init__(self, params: Q, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._prr = params.prr_numerator
        self._irr = params.irr_numerator

    def memo_key(self, value: Any) -> bytes:
        """The category's UTF-8 bytes; :class:`~veil.shared.errors.ParameterError` naming
        ``value`` if it is not one of the categories (or not a string)."""
        return self.params.categories[self.params.index(value)].encode()

    def prr_stream(self, key: bytes) -> HmacStream:
        """The permanent response's stream for the category whose UTF-8 bytes are ``key``:
        purpose ``prr``, context ``fingerprint || 0x00 || key`` (see the module docstring)."""
        return self.permanent_stream(b"prr", key)


def keep_or_other(stream: RandomStream, x: int, size: int, keep: int) -> int:
    """Randomized response over ``size`` values: ``x`` if a word ``u = u32()`` is below
    ``keep``, otherwise ``r + (r >= x)`` for ``r = randbelow(size - 1)`` read next (uniform
    among the other ``size - 1``)."""
    if stream.u32() < keep:
        return x
    other = stream.randbelow(size - 1)
    return other + (other >= x)


def keep_or_fresh(stream: RandomStream, x: int, size: int, keep: int) -> int:
    """The instantaneous response: ``x`` if a word ``u = u32()`` is below ``keep``,
    otherwise ``randbelow(size)`` read next (uniform over all ``size``)."""
    if stream.u32() < keep:
        return x
    return stream.randbelow(size)


class GrrEncoder(OracleEncoder[GrrParams]):
    """Generalized randomized response; payload: the reported category's index.

    Permanent response of category ``x`` (stream: :meth:`~OracleEncoder.prr_stream`): the
    first word ``u = u32()``; ``x`` if ``u < N_prr``, otherwise ``r + (r >= x)`` for
    ``r = randbelow(d - 1)`` read next (uniform among the other ``d - 1`` categories).
    Instantaneous response (CSPRNG): a word ``u = u32()``; the permanent index if
    ``u < N_irr``, otherwise ``randbelow(d)`` read next.
    """

    params_type = GrrParams

    def __init__(self, params: GrrParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._d = params.d

    def derive(self, key: bytes) -> int:
        return keep_or_other(self.prr_stream(key), self.params.index(key.decode()), self._d,
                             self._prr)

    def finish(self, permanent: int) -> int:
        return keep_or_fresh(self.fresh, permanent, self._d, self._irr)


class OueEncoder(OracleEncoder[OueParams]):
    """Optimized unary encoding (L-OSUE); payload: ``d`` bits as hex, bit ``i`` category ``i``.

    Permanent response of category ``x`` (stream: :meth:`~OracleEncoder.prr_stream`):
    ``1 + W`` words of ``d`` bits, each ``ceil(d / 8)`` bytes read little-endian (as
    RAPPOR's PRR, :func:`~veil.shared.bits.split_words`), read at once.
    The first is the coin: its bit ``x`` is the category's own bit (1 with probability
    exactly 1/2). The other ``W`` are consumed by :func:`~veil.shared.bits.bernoulli_mask`
    for the numerator ``N_c = 2**32 - N_prr`` (``W`` is 32 minus its trailing zero bits):
    every other category's bit is 1 with probability ``N_c / 2**32``.

    Instantaneous response (CSPRNG): each bit is reported 1 with probability ``N_1 / 2**32``
    where the permanent bit is 1 and ``N_0 / 2**32`` where it is 0, the thresholds of
    :meth:`~veil.shared.kinds.oracles.oue.OueParams.irr_thresholds` (each bit kept with
    probability ``lambda``, otherwise a fair coin). They are symmetric, ``N_1 = 2**32 - N_0``,
    so the report is the permanent response XOR a mask of independent Bernoulli
    (``N_0 / 2**32``) bits: RAPPOR's IRR (:class:`~veil.client.encoders.rappor.BitRappor`)
    with one threshold instead of two. Bit ``i`` of the mask is ``U_i < N_0`` for a uniform
    32-bit ``U_i``; the binary digits of all the ``U_i`` are drawn together, most significant
    first, one ``d``-bit word per digit (little-endian, ``ceil(d / 8)`` bytes), and drawing
    stops once every bit is decided (about ``log2(d) + 1.3`` words).
    """

    params_type = OueParams

    def __init__(self, params: OueParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        d = params.d
        self._d = d
        self._full = (1 << d) - 1
        self._width = payload_bytes(d)
        self._other = params.other_numerator(self._prr)
        self._prr_bytes = (1 + mask_word_count(self._other)) * self._width
        zero, one = params.irr_thresholds(self._irr)
        if zero + one != PROB_ONE:
            raise ValueError(f"OUE thresholds ({zero}, {one}) are not symmetric")
        lowest = lowest_digit(zero)
        #: the digits of N_0 from the most significant down to its lowest 1 (below it, every
        #: undecided U is at least N_0); none when N_0 = 0 (nothing is ever flipped)
        self._digits = tuple((zero >> position) & 1
                             for position in range(PROB_BITS - 1, lowest - 1, -1))
        # first read: a little more than the log2(d) + 1.3 words needed on average
        self._first_bytes = min(len(self._digits), d.bit_length() + 2) * self._width

    def derive(self, key: bytes) -> int:
        own = 1 << self.params.index(key.decode())
        words = split_words(self.prr_stream(key).read(self._prr_bytes), self._d)
        coin = next(words)
        others = bernoulli_mask(self._other, words, self._full)
        return (others & ~own) | (coin & own)

    def flips(self) -> int:
        """A fresh mask of independent Bernoulli(``N_0 / 2**32``) bits (see the class)."""
        if not self._digits:  # N_0 = 0: lambda = 1, nothing is flipped and nothing read
            return 0
        width, read = self._width, self.fresh.read
        buffer, offset = read(self._first_bytes), 0
        undecided, flips = self._full, 0
        for digit in self._digits:
            if offset == len(buffer):
                buffer, offset = read(IRR_MORE_WORDS * width), 0
            # bits above d in the last byte fall outside `undecided` and are never used
            r = int.from_bytes(buffer[offset : offset + width], "little")
            offset += width
            if digit:  # U's digit 0 under N's 1: U < N, flip; equal digits stay undecided
                equal = undecided & r
                flips |= undecided ^ equal
                undecided = equal
            else:  # U's digit 1 over N's 0: U > N, keep
                undecided ^= undecided & r
            if not undecided:
                break
        return flips

    def finish(self, permanent: int) -> str:
        return bits_to_hex(permanent ^ self.flips(), self._d)


class OlhEncoder(OracleEncoder[OlhParams]):
    """Optimized local hashing over the linear family of :class:`OlhParams`; payload:
    ``function * g + bucket``.

    Permanent response of category ``x`` (stream: :meth:`~OracleEncoder.prr_stream`): the
    hash function ``a = randbelow(g**r)`` first, then a word ``u = u32()``; the bucket
    ``h = h_a(x)`` if ``u < N_prr``, otherwise ``r' + (r' >= h)`` for
    ``r' = randbelow(g - 1)`` read next (uniform among the other ``g - 1`` buckets).
    The memoized response is the pair ``(a, bucket)``. Instantaneous response (CSPRNG): a
    word ``u = u32()``; the bucket if ``u < N_irr``, otherwise ``randbelow(g)`` read next.
    """

    params_type = OlhParams

    def __init__(self, params: OlhParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._g = params.buckets
        self._functions = params.functions

    def derive(self, key: bytes) -> tuple[int, int]:
        x = self.params.index(key.decode())
        stream = self.prr_stream(key)
        function = stream.randbelow(self._functions)
        bucket = keep_or_other(stream, self.params.hash(function, x), self._g, self._prr)
        return function, bucket

    def finish(self, permanent: tuple[int, int]) -> int:
        function, bucket = permanent
        return function * self._g + keep_or_fresh(self.fresh, bucket, self._g, self._irr)


class HadamardEncoder(OracleEncoder[HadamardParams]):
    """Hadamard response; payload: a response in ``[0, K)``.

    Permanent response of category ``x`` (stream: :meth:`~OracleEncoder.prr_stream`),
    with ``u = x + 1``: a response ``y = randbelow(K)`` first (``log2(K)`` bits: the top
    bits of ``ceil(log2(K) / 8)`` big-endian bytes, never rejected as ``K`` is a power of
    two), then a word ``w = u32()``: the response lies in
    the category's set ``C_x = {y : popcount(u & y) even}`` iff ``w < N_prr``. If ``y`` is
    on the other side, its bit ``u & -u`` is flipped: a bijection between ``C_x`` and its
    complement, so the response is uniform on the chosen side. Instantaneous response
    (CSPRNG): a word ``w = u32()``; the response if ``w < N_irr``, otherwise
    ``randbelow(K)`` read next.
    """

    params_type = HadamardParams

    def __init__(self, params: HadamardParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self._size = params.size

    def derive(self, key: bytes) -> int:
        u = self.params.index(key.decode()) + 1
        stream = self.prr_stream(key)
        y = stream.randbelow(self._size)
        inside = stream.u32() < self._prr
        if (((u & y).bit_count() & 1) == 0) != inside:
            y ^= u & -u
        return y

    def finish(self, permanent: int) -> int:
        fresh = self.fresh
        if fresh.u32() < self._irr:
            return permanent
        return fresh.randbelow(self._size)


__all__ = [
    "GrrEncoder",
    "HadamardEncoder",
    "OlhEncoder",
    "OracleEncoder",
    "OueEncoder",
]
