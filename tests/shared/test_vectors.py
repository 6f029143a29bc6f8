"""The published test vectors (docs/test-vectors.json) follow from the written
specification in docs/protocol.md: this test re-derives them with an
independent implementation of MurmurHash3 x86_32, the HMAC counter-mode stream
and the PRR construction, and checks the library against both."""

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from veil.client.encoders import make_encoder
from veil.client.randomness import HmacStream
from veil.client.state import derived_cohort_seed
from veil.shared import Metric, StringParams
from veil.shared.hashing import bloom_indices, bloom_indices_all_cohorts

VECTORS = json.loads(
    (Path(__file__).parents[2] / "docs" / "test-vectors.json").read_text(encoding="utf-8")
)
SECRET = bytes.fromhex(VECTORS["secret_hex"])


def murmur3_x86_32(data: bytes, seed: int) -> int:
    """MurmurHash3 x86_32 written from its published description."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    h = seed & mask
    blocks = len(data) // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = rotl((k * c1) & mask, 15) * c2 & mask
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask
    tail = data[4 * blocks :]
    k = 0
    for i, byte in enumerate(tail):
        k |= byte << (8 * i)
    if tail:
        h ^= rotl((k * c1) & mask, 15) * c2 & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


def reference_stream(purpose: bytes, metric: str, context: bytes, n: int) -> bytes:
    out = b""
    counter = 1
    while len(out) < n:
        message = counter.to_bytes(4, "big") + b"veil-v1\0" + purpose + b"\0" + metric.encode() + b"\0" + context
        out += hmac.new(SECRET, message, hashlib.sha256).digest()
        counter += 1
    return out[:n]


def reference_prr(bloom: int, k: int, f: float, stream: bytes) -> int:
    width = (k + 7) // 8
    words = [
        int.from_bytes(stream[i : i + width], "little") & ((1 << k) - 1)
        for i in range(0, len(stream), width)
    ]
    coin, rest = words[0], iter(words[1:])
    numerator = round(f * 2**32)
    replace = 0
    first = (numerator & -numerator).bit_length() - 1
    for position in range(first, 32):
        word = next(rest)
        replace = (word | replace) if (numerator >> position) & 1 else (word & replace)
    return (bloom & ~replace) | (coin & replace)


@pytest.mark.parametrize("vector", VECTORS["bloom"], ids=lambda v: f"{v['value']!r}-c{v['cohort']}")
def test_bloom_indices(vector):
    data = vector["value"].encode("utf-8")
    expected = [
        murmur3_x86_32(data, (vector["cohort"] << 16) | i) % vector["k"] for i in range(vector["h"])
    ]
    assert expected == vector["indices"]
    assert bloom_indices(data, vector["cohort"], vector["k"], vector["h"]) == vector["indices"]


@pytest.mark.parametrize("hashing", ["mmh3", "md5-google"])
def test_all_cohorts_at_once_are_the_per_cohort_indices(hashing: str) -> None:
    """The candidate map hashes every cohort in one call; it must be the client's hashing."""
    for value in ("", "https://example.org/", "\u00e9t\u00e9 \U0001f600"):
        data = value.encode("utf-8")
        expected = [i for cohort in range(37) for i in bloom_indices(data, cohort, 200, 3, hashing)]
        assert bloom_indices_all_cohorts(data, 37, 200, 3, hashing) == expected


def test_murmur_reference_matches_published_values():
    # MurmurHash3 x86_32 reference values from its author's test suite.
    assert murmur3_x86_32(b"", 0) == 0
    assert murmur3_x86_32(b"", 1) == 0x514E28B7
    assert murmur3_x86_32(b"\xff\xff\xff\xff", 0) == 0x76293B50
    assert murmur3_x86_32(b"!Ce\x87", 0) == 0xF55B516B


@pytest.mark.parametrize("vector", VECTORS["stream"], ids=lambda v: v["purpose"])
def test_hmac_stream(vector):
    context = bytes.fromhex(vector["context_hex"])
    expected = bytes.fromhex(vector["first_64_bytes_hex"])
    assert reference_stream(vector["purpose"].encode(), vector["metric"], context, 64) == expected
    stream = HmacStream(SECRET, vector["purpose"].encode(), vector["metric"], context)
    assert stream.read(10) + stream.read(54) == expected


@pytest.mark.parametrize("vector", VECTORS["prr"], ids=lambda v: f"k{v['k']}")
def test_prr(vector):
    k = vector["k"]
    params = StringParams(**{key: vector[key] for key in ("k", "h", "m", "p", "q", "f")})
    data = vector["value"].encode()
    bloom = 0
    for i in range(vector["h"]):
        bloom |= 1 << (murmur3_x86_32(data, (vector["cohort"] << 16) | i) % k)
    assert bloom.to_bytes((k + 7) // 8, "little").hex() == vector["bloom_hex"]
    f_words = 32 - ((round(vector["f"] * 2**32) & -round(vector["f"] * 2**32)).bit_length() - 1)
    width = (k + 7) // 8
    context = vector["cohort"].to_bytes(4, "big") + data
    stream = reference_stream(b"prr", vector["metric"], context, (1 + f_words) * width)
    prr = reference_prr(bloom, k, vector["f"], stream)
    assert prr.to_bytes(width, "little").hex() == vector["prr_hex"]
    encoder = make_encoder(Metric(vector["metric"], params), SECRET, vector["cohort"])
    assert encoder.memoized(encoder.memo_key(vector["value"])) == prr


def test_cohort_seed():
    vector = VECTORS["cohort_seed"]
    seed = int.from_bytes(reference_stream(b"cohort", "", b"", 8), "big")
    assert seed.to_bytes(8, "big").hex() == vector["cohort_seed_hex"]
    assert seed == vector["cohort_seed"] and seed % vector["m"] == vector["cohort"]
    assert derived_cohort_seed(SECRET) == seed
