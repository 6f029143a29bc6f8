"""Bit payloads and the bit-sliced Bernoulli construction."""

import itertools
from fractions import Fraction

import pytest

from veil.shared.bits import (
    PROB_ONE,
    bernoulli_mask,
    bits_to_hex,
    hex_to_bits,
    mask_word_count,
    realize,
    realized,
)
from veil.shared.errors import WireFormatError


@pytest.mark.parametrize(
    "numerator",
    [1 << 31, 3 << 30, 1 << 30, (PROB_ONE >> 12) * 1234, realize(0.39) >> 20 << 20, 1 << 20],
)
def test_bernoulli_mask_probability_is_exact(numerator):
    # Exhaustive: every combination of one-bit random words is equally likely,
    # so the share of combinations giving 1 is the exact probability.
    count = mask_word_count(numerator)
    assert count <= 12
    ones = sum(
        bernoulli_mask(numerator, iter(words), 1)
        for words in itertools.product((0, 1), repeat=count)
    )
    assert Fraction(ones, 2**count) == Fraction(numerator, PROB_ONE)


def test_bernoulli_mask_uses_the_stated_number_of_words():
    words = iter(range(100))
    bernoulli_mask(realize(0.39), words, 0xFF)
    assert next(words) == mask_word_count(realize(0.39))


def test_bernoulli_mask_extremes_need_no_randomness():
    assert bernoulli_mask(0, iter(()), 0xFF) == 0
    assert bernoulli_mask(PROB_ONE, iter(()), 0xFF) == 0xFF
    assert mask_word_count(0) == mask_word_count(PROB_ONE) == 0


def test_bits_are_independent_across_positions():
    # With 2-bit words, the 4 outcomes of a p=3/4 mask have probabilities
    # (1/4)^2, 3/16, 3/16, (3/4)^2: the product of the per-bit probabilities.
    numerator = 3 << 30
    count = mask_word_count(numerator)
    tally = {0: 0, 1: 0, 2: 0, 3: 0}
    for words in itertools.product(range(4), repeat=count):
        tally[bernoulli_mask(numerator, iter(words), 3)] += 1
    total = 4**count
    assert Fraction(tally[3], total) == Fraction(9, 16)
    assert Fraction(tally[1], total) == Fraction(tally[2], total) == Fraction(3, 16)


def test_realized_probability_is_within_half_a_unit():
    for p in (0.39, 0.61, 0.45, 0.225, 1 / 3):
        assert abs(realized(p) - p) <= 0.5 / PROB_ONE


@pytest.mark.parametrize("k", [1, 7, 8, 9, 32, 128, 4096])
def test_hex_round_trip(k):
    bits = (1 << k) - 1 if k < 64 else (0xA5 << (k - 8)) | 1
    payload = bits_to_hex(bits, k)
    assert len(payload) == 2 * ((k + 7) // 8)
    assert hex_to_bits(payload, k) == bits


def test_bit_i_is_byte_i_div_8_lsb_first():
    assert bits_to_hex(1 << 9, 16) == "0002"
    assert bits_to_hex(1, 16) == "0100"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("00", "wrong_length"),
        ("ABCD", "bad_hex"),
        ("zz00", "bad_hex"),
        ("00f0", "pad_bits"),
        (12, "wrong_type"),
        ("０１", "wrong_length"),
    ],
)
def test_bad_payloads_name_the_problem(payload, code):
    with pytest.raises(WireFormatError) as info:
        hex_to_bits(payload, 12, "reports[0].payload")
    assert info.value.code == code
    assert info.value.field == "reports[0].payload"
