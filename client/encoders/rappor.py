"""The two randomized responses RAPPOR applies to a bit vector.

Permanent RR (memoized): each bit is replaced with probability ``f`` by a fair
coin; the coin word and the ``f`` mask come from an :class:`HmacStream`, coin
word first, then the mask words as :func:`~veil.shared.bits.bernoulli_mask`
consumes them. Instantaneous RR (fresh): each bit is reported as 1 with
probability ``q`` if its PRR bit is 1 and ``p`` if it is 0, from the CSPRNG.
"""

from __future__ import annotations

from veil.client.randomness import FreshStream, HmacStream
from veil.shared.bits import bernoulli_mask, mask_word_count, payload_bytes, realize, split_words


class BitRappor:
    """PRR and IRR for ``k``-bit vectors with RAPPOR's ``p``, ``q``, ``f``."""

    def __init__(self, k: int, p: float, q: float, f: float) -> None:
        self.k = k
        self.full = (1 << k) - 1
        self.width = payload_bytes(k)
        self.p_num, self.q_num, self.f_num = realize(p), realize(q), realize(f)
        self.prr_words = 1 + mask_word_count(self.f_num)
        irr_words = mask_word_count(self.p_num) + mask_word_count(self.q_num)
        self.irr_bytes = irr_words * self.width
        self._offsets = range(0, self.irr_bytes, self.width)

    def prr(self, bits: int, stream: HmacStream) -> int:
        """The permanent randomized response of ``bits``."""
        words = split_words(stream.read(self.prr_words * self.width), self.k)
        coin = next(words)
        replace = bernoulli_mask(self.f_num, words, self.full)
        return (bits & ~replace) | (coin & replace)

    def irr(self, prr: int, fresh: FreshStream) -> int:
        """A fresh instantaneous randomized response of ``prr``."""
        buffer = fresh.read(self.irr_bytes)
        full, width = self.full, self.width
        words = iter([int.from_bytes(buffer[o : o + width], "little") & full for o in self._offsets])
        p_mask = bernoulli_mask(self.p_num, words, full)
        q_mask = bernoulli_mask(self.q_num, words, full)
        return (prr & q_mask) | (~prr & p_mask)
