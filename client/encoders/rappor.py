"""The two randomized responses RAPPOR applies to a bit vector.

Permanent RR (memoized): each bit is replaced with probability ``f`` by a fair
coin; the coin word and the ``f`` mask come from an :class:`HmacStream`, coin
word first, then the mask words as :func:`~veil.shared.bits.bernoulli_mask`
consumes them. Instantaneous RR (fresh): each bit is reported as 1 with
probability ``q`` if its PRR bit is 1 and ``p`` if it is 0, from the CSPRNG.

The IRR draws, for every bit ``i``, a uniform 32-bit integer ``U_i`` and
reports 1 iff ``U_i`` is below the bit's threshold (``N_q`` where the PRR bit
is 1, ``N_p`` where it is 0, the realized ``q`` and ``p`` times ``2**32``): exactly
probability ``q`` or ``p``. The binary digits of all the ``U_i`` are drawn
together, most significant first (one random word per digit), and drawing stops
once every bit is decided: about ``log2(k) + 2`` words whatever ``p`` and ``q``
(``p = 0.39`` has 32 significant binary digits; a digit-by-digit mask of it
would take 32 words). A threshold of ``2**32`` (``q = 1``, or ``p`` realized as 1)
has no binary digit below ``2**32``: every bit with that threshold is 1 before any
word is read. Fresh noise has no fixed layout to keep; the PRR's does.
"""

from __future__ import annotations

from collections.abc import Iterator

from veil.client.randomness import FreshStream, HmacStream
from veil.shared.bits import (
    PROB_BITS,
    PROB_ONE,
    bernoulli_mask,
    mask_word_count,
    payload_bytes,
    realize,
    split_words,
)

#: words read at a time when the first read for an IRR did not decide every bit
IRR_MORE_WORDS = 8


def lowest_digit(numerator: int) -> int:
    """Position of the lowest 1 digit of ``numerator`` (``PROB_BITS`` for 0)."""
    return (numerator & -numerator).bit_length() - 1 if numerator else PROB_BITS


class BitRappor:
    """PRR and IRR for ``k``-bit vectors with RAPPOR's ``p``, ``q``, ``f``."""

    def __init__(self, k: int, p: float, q: float, f: float) -> None:
        self.k = k
        self.full = (1 << k) - 1
        self.width = payload_bytes(k)
        self.p_num, self.q_num, self.f_num = realize(p), realize(q), realize(f)
        self.prr_words = 1 + mask_word_count(self.f_num)
        #: whether bits whose PRR bit is 1 (resp. 0) are always reported as 1
        self._q_certain = self.q_num >= PROB_ONE
        self._p_certain = self.p_num >= PROB_ONE
        lowest = min(lowest_digit(self.p_num), lowest_digit(self.q_num))
        #: (q digit, p digit) of the two thresholds, most significant first, down to
        #: the last 1 digit of either (below it every undecided U is >= its threshold)
        self._digits = [
            ((self.q_num >> position) & 1, (self.p_num >> position) & 1)
            for position in range(PROB_BITS - 1, lowest - 1, -1)
        ]
        # first read: every digit, or a little more than needed on average: log2(k) + 4
        first = min(len(self._digits), k.bit_length() + 4)
        self._first_bytes = first * self.width
        self._offsets = range(0, self._first_bytes, self.width)

    def prr(self, bits: int, stream: HmacStream) -> int:
        """The permanent randomized response of ``bits``."""
        words = split_words(stream.read(self.prr_words * self.width), self.k)
        coin = next(words)
        replace = bernoulli_mask(self.f_num, words, self.full)
        return (bits & ~replace) | (coin & replace)

    def _words(self, fresh: FreshStream) -> Iterator[int]:
        """Uniform ``k``-bit words from the CSPRNG: one read for most reports, then chunks."""
        full, width = self.full, self.width
        buffer, offsets = fresh.read(self._first_bytes), self._offsets
        while True:
            for offset in offsets:
                yield int.from_bytes(buffer[offset : offset + width], "little") & full
            buffer = fresh.read(IRR_MORE_WORDS * width)
            offsets = range(0, IRR_MORE_WORDS * width, width)

    def irr(self, prr: int, fresh: FreshStream) -> int:
        """A fresh instantaneous randomized response of ``prr``."""
        full = self.full
        prr &= full
        thresholds = (0, full & ~prr, prr, full)  # indexed by 2 * q digit + p digit
        ones = (prr if self._q_certain else 0) | (full & ~prr if self._p_certain else 0)
        undecided = full & ~ones
        if not undecided:
            return ones
        words = self._words(fresh)
        for q_digit, p_digit in self._digits:
            r = next(words)
            t = thresholds[2 * q_digit + p_digit]
            ones |= undecided & t & ~r  # U has a 0 where the threshold has a 1: U < N
            undecided &= ~(t ^ r)  # equal digits: still undecided
            if not undecided:
                break
        return ones
