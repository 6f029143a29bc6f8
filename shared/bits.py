"""Bit vectors as Python integers, their hex payload, and bit-sliced Bernoulli masks.

A report of ``k`` bits is an integer whose bit ``i`` (``1 << i``) is report bit
``i``, the convention google/rappor uses. On the wire it is
``bits.to_bytes(ceil(k / 8), "little").hex()``: bit ``i`` lives in byte
``i // 8`` at position ``i % 8`` (least significant first).

Probabilities are realized exactly as dyadic rationals ``N / 2**32``
(:func:`realize`). :func:`bernoulli_mask` turns ``32 - tz(N)`` uniformly random
words into a word whose bits are independent Bernoulli(``N / 2**32``) draws,
processing the binary digits of ``N`` from the least significant set digit
upwards: ``m = r | m`` for a 1 digit, ``m = r & m`` for a 0 digit.
"""

from __future__ import annotations

from collections.abc import Iterator

from veil.shared.errors import ParameterError, WireFormatError

PROB_BITS = 32
PROB_ONE = 1 << PROB_BITS


def realize(probability: float) -> int:
    """The numerator ``N`` of the dyadic probability ``N / 2**32`` used for ``probability``."""
    return round(probability * PROB_ONE)


def realized(probability: float) -> float:
    """The probability the encoders actually use for a nominal ``probability``."""
    return realize(probability) / PROB_ONE


def check_realized(owner: str, name: str, probability: float, *, zero: bool = False) -> None:
    """Refuse a ``probability`` (the parameter ``name`` of ``owner``, already checked to lie
    in [0, 1]) that :func:`realize` rounds to 1, or to 0 (unless ``zero``): a value refused
    as it is declared must be refused as it is realized, so the margin to an end it may not
    take is at least ``2**-32``."""
    numerator = realize(probability)
    for end, allowed, at in ((0, zero, 0), (1, False, PROB_ONE)):
        if numerator == at and not allowed:
            bound = "at least 2**-32" if end == 0 else "at most 1 - 2**-32"
            raise ParameterError(
                name, f"The {name!r} parameter of {owner} is realized as {end} (probabilities "
                      f"are N / 2**32, N = round({name} * 2**32)), the value it may not take; "
                      f"it must be {bound}. Got {probability!r} instead.")


def mask_word_count(numerator: int) -> int:
    """How many random words :func:`bernoulli_mask` consumes for ``numerator``."""
    if numerator <= 0 or numerator >= PROB_ONE:
        return 0
    trailing = (numerator & -numerator).bit_length() - 1
    return PROB_BITS - trailing


def bernoulli_mask(numerator: int, words: Iterator[int], full: int) -> int:
    """A word of independent Bernoulli(``numerator / 2**32``) bits.

    ``words`` yields uniformly random words (already masked to ``full``);
    exactly :func:`mask_word_count` of them are consumed.
    """
    if numerator <= 0:
        return 0
    if numerator >= PROB_ONE:
        return full
    trailing = (numerator & -numerator).bit_length() - 1
    mask = 0
    for position in range(trailing, PROB_BITS):
        r = next(words)
        mask = (r | mask) if (numerator >> position) & 1 else (r & mask)
    return mask


def payload_bytes(k: int) -> int:
    """Bytes needed for a ``k``-bit report."""
    return (k + 7) // 8


def split_words(buffer: bytes, k: int) -> Iterator[int]:
    """Consecutive ``k``-bit little-endian words read from ``buffer``."""
    width = payload_bytes(k)
    full = (1 << k) - 1
    for offset in range(0, len(buffer) - width + 1, width):
        yield int.from_bytes(buffer[offset : offset + width], "little") & full


def bits_to_hex(bits: int, k: int) -> str:
    """The wire payload for a ``k``-bit report."""
    return bits.to_bytes(payload_bytes(k), "little").hex()


HEX_DIGITS = "0123456789abcdef"


def hex_to_bits(payload: object, k: int, field: str = "payload") -> int:
    """Parse and check a wire payload of ``k`` bits; raise :class:`WireFormatError`."""
    if (
        type(payload) is str
        and len(payload) == 2 * payload_bytes(k)
        and not payload.strip(HEX_DIGITS)
    ):
        bits = int.from_bytes(bytes.fromhex(payload), "little")
        if not bits >> k:
            return bits
    raise _payload_error(payload, k, field)


def _payload_error(payload: object, k: int, field: str) -> WireFormatError:
    """The error that says what is wrong with a payload :func:`hex_to_bits` refused."""
    width = 2 * payload_bytes(k)
    if not isinstance(payload, str):
        return WireFormatError(
            field, f"must be a string of {width} lowercase hex digits ({k} bits)", "wrong_type"
        )
    if len(payload) != width:
        return WireFormatError(
            field,
            f"must be {width} hex digits for k={k} bits; got {len(payload)} characters",
            "wrong_length",
        )
    if payload.strip(HEX_DIGITS):
        return WireFormatError(field, "must contain only lowercase hex digits 0-9a-f", "bad_hex")
    return WireFormatError(
        field, f"sets bits at or above k={k}; pad bits must be zero", "pad_bits"
    )


def bit_list(bits: int, k: int) -> list[int]:
    """The ``k`` bits of ``bits`` as a list of 0/1, bit 0 first."""
    return [(bits >> i) & 1 for i in range(k)]
