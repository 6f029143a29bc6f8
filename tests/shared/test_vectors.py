"""The published test vectors (docs/test-vectors.json) follow from the written
specification in docs/protocol.md: this module derives them with an independent
implementation of MurmurHash3 x86_32, the parameter fingerprint, the HMAC
counter-mode stream and the memoized responses of strings, RAPPOR categories,
booleans and numbers (both stream layouts), of the FLH and HCMS string oracles
(with an independent MurmurHash3 x64_128 and their multiply-shift hashing), and, in
:mod:`tests.shared.vector_oracles`, of the GRR, OUE, OLH and Hadamard category oracles and
of joint metrics; checks that the file holds exactly what it derives, and checks the
library against the file.

Run it as a script (``python tests/shared/test_vectors.py``) to write the file anew
after a deliberate change of the protocol; bump :data:`VERSION` with the layout.
Two fields are not derived independently: the ``laplace`` report (the protocol names
the exact discrete Laplace sampler by its paper, not byte by byte, so that report is the
library's; its stream is given, and derived here) and the string oracles' ``N_prr`` (the
largest numerator within epsilon, found by a search; the response is derived from it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from veil.client.encoders import make_encoder
from veil.client.randomness import STREAM_LAYOUT, HmacStream
from veil.client.state_dir import derived_cohort_seed
from veil.shared import Metric
from veil.shared.hashing import bloom_indices, bloom_indices_all_cohorts
from veil.shared.kinds import params_from_dict

PATH = Path(__file__).parents[2] / "docs" / "test-vectors.json"
#: the stream layout the vectors are for (docs/protocol.md, section 4)
VERSION = 2
SECRET = bytes(range(32))
WORD = 2**32

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


def reference_fingerprint(params: dict[str, Any]) -> str:
    """Section 7: SHA-256 of the compact, key-sorted JSON, first 16 hex digits."""
    text = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reference_context(layout: int, fingerprint: str, context: bytes) -> bytes:
    """Section 4: layout 2 puts ``fingerprint || 0x00`` before every memoized context."""
    return context if layout == 1 else fingerprint.encode() + b"\0" + context


def words(stream: bytes, count: int) -> list[int]:
    return [int.from_bytes(stream[4 * i : 4 * i + 4], "big") for i in range(count)]


def reference_prr(bloom: int, k: int, f: float, stream: bytes) -> int:
    width = (k + 7) // 8
    chunks = [
        int.from_bytes(stream[i : i + width], "little") & ((1 << k) - 1)
        for i in range(0, len(stream), width)
    ]
    coin, rest = chunks[0], iter(chunks[1:])
    numerator = round(f * WORD)
    replace = 0
    first = (numerator & -numerator).bit_length() - 1
    for position in range(first, 32):
        word = next(rest)
        replace = (word | replace) if (numerator >> position) & 1 else (word & replace)
    return (bloom & ~replace) | (coin & replace)


def prr_vector(metric: str, value: str, cohort: int, params: dict[str, Any], layout: int,
               bloom: int) -> dict[str, Any]:
    """The permanent response of ``bloom`` (a string's filter or a category's one-hot bit)."""
    k, f = params.get("k") or len(params["categories"]), params["f"]
    numerator = round(f * WORD)
    f_words = 32 - ((numerator & -numerator).bit_length() - 1)
    width = (k + 7) // 8
    fp = reference_fingerprint(params)
    context = (cohort.to_bytes(4, "big") if params["kind"] == "string" else b"") + value.encode()
    stream = reference_stream(b"prr", metric, reference_context(layout, fp, context),
                              (1 + f_words) * width)
    prr = reference_prr(bloom, k, f, stream)
    return {"metric": metric, "value": value, "cohort": cohort, "layout": layout,
            "params": params, "fingerprint": fp,
            "bits_hex": bloom.to_bytes(width, "little").hex(),
            "prr_hex": prr.to_bytes(width, "little").hex()}


def string_bloom(value: str, cohort: int, k: int, h: int) -> int:
    bloom = 0
    for i in range(h):
        bloom |= 1 << (murmur3_x86_32(value.encode(), (cohort << 16) | i) % k)
    return bloom


MASK64 = (1 << 64) - 1


def murmur3_x64_128_h1(data: bytes, seed: int = 0) -> int:
    """The first 64-bit half of MurmurHash3 x64_128, written from its published description."""
    c1, c2 = 0x87C37B91114253D5, 0x4CF5AD432745937F

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (64 - r))) & MASK64

    def fmix(k: int) -> int:
        k = ((k ^ (k >> 33)) * 0xFF51AFD7ED558CCD) & MASK64
        k = ((k ^ (k >> 33)) * 0xC4CEB9FE1A85EC53) & MASK64
        return k ^ (k >> 33)

    def mix1(k1: int) -> int:
        return (rotl((k1 * c1) & MASK64, 31) * c2) & MASK64

    def mix2(k2: int) -> int:
        return (rotl((k2 * c2) & MASK64, 33) * c1) & MASK64

    h1 = h2 = seed
    blocks = len(data) // 16
    for i in range(blocks):
        h1 ^= mix1(int.from_bytes(data[16 * i : 16 * i + 8], "little"))
        h1 = ((rotl(h1, 27) + h2) * 5 + 0x52DCE729) & MASK64
        h2 ^= mix2(int.from_bytes(data[16 * i + 8 : 16 * i + 16], "little"))
        h2 = ((rotl(h2, 31) + h1) * 5 + 0x38495AB5) & MASK64
    tail = data[16 * blocks :]
    if len(tail) > 8:
        h2 ^= mix2(int.from_bytes(tail[8:], "little"))
    if tail:
        h1 ^= mix1(int.from_bytes(tail[:8], "little"))
    h1, h2 = h1 ^ len(data), h2 ^ len(data)
    h1 = (h1 + h2) & MASK64
    h2 = (h2 + h1) & MASK64
    h1, h2 = fmix(h1), fmix(h2)
    return (h1 + h2) & MASK64


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def reference_bucket(j: int, u: int, n: int) -> int:
    """Section 5, string oracles: ``h_j(u)`` in ``[0, n)``, multiply-shift with hash
    function ``j``'s keys ``a_j = splitmix64(2j) | 1`` and ``b_j = splitmix64(2j + 1)``."""
    a, b = splitmix64(2 * j) | 1, splitmix64(2 * j + 1)
    return ((((a * u + b) & MASK64) >> 32) * n) >> 32


class Reader:
    """Section 4's samplers over a stream's bytes, read in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, n: int) -> bytes:
        self.at += n
        assert self.at <= len(self.data), "the vector's stream is too short"
        return self.data[self.at - n : self.at]

    def u32(self) -> int:
        return int.from_bytes(self.read(4), "big")

    def randbelow(self, n: int) -> int:
        if n <= 1:
            return 0
        bits = (n - 1).bit_length()
        width = (bits + 7) // 8
        while True:
            candidate = int.from_bytes(self.read(width), "big") >> (8 * width - bits)
            if candidate < n:
                return candidate


def string_oracle_vector(value: str, cohort: int, params: dict[str, Any],
                         prr_numerator: int) -> dict[str, Any]:
    """Section 5, ``flh`` and ``hcms``: the value's key and bucket under the cohort's hash
    function, and the permanent response (``prr_numerator`` is the library's ``N_prr``,
    the largest within epsilon: section 5 defines it by a search, given here as data)."""
    fp = reference_fingerprint(params)
    u = murmur3_x64_128_h1(value.encode())
    size = params["g"] if params["oracle"] == "flh" else params["columns"]
    bucket = reference_bucket(cohort, u, size)
    context = reference_context(STREAM_LAYOUT, fp, cohort.to_bytes(4, "big") + value.encode())
    stream = reference_stream(b"prr", "homepage", context, 64)
    reader = Reader(stream)
    if params["oracle"] == "flh":
        if reader.u32() < prr_numerator:
            permanent = bucket
        else:
            other = reader.randbelow(size - 1)
            permanent = other + (other >= bucket)
    else:
        coefficient = reader.randbelow(size)
        sign = (coefficient & bucket).bit_count() & 1
        permanent = 2 * coefficient + (sign if reader.u32() < prr_numerator else 1 - sign)
    return {"metric": "homepage", "value": value, "cohort": cohort, "layout": STREAM_LAYOUT,
            "params": params, "fingerprint": fp, "value_key": u, "bucket": bucket,
            "prr_numerator": prr_numerator, "first_64_bytes_hex": stream.hex(),
            "permanent": permanent}


def boolean_vector(value: bool, params: dict[str, Any], layout: int) -> dict[str, Any]:
    fp = reference_fingerprint(params)
    context = reference_context(layout, fp, b"\x01" if value else b"\x00")
    u1, u2 = words(reference_stream(b"rr", "dark_mode", context, 8), 2)
    answer = int(value) if u1 < round(params["alpha"] * WORD) else int(u2 < round(params["beta"] * WORD))
    return {"metric": "dark_mode", "value": value, "layout": layout, "params": params,
            "fingerprint": fp, "u1": u1, "u2": u2, "answer": answer}


def number_vector(value: float, params: dict[str, Any], layout: int) -> dict[str, Any]:
    """Section 5, ``number``: the rounding threshold, the grid point, the noise stream and,
    for ``1bitmean``, the answer (for ``laplace`` the library's report)."""
    fp = reference_fingerprint(params)
    threshold = words(reference_stream(b"alpha", "load_time", reference_context(layout, fp, b""), 4), 1)[0]
    low, high, resolution = params["low"], params["high"], params["resolution"]
    step = (high - low) / resolution
    position = (min(max(value, low), high) - low) / step
    below = min(math.floor(position), resolution)
    j = min(below + ((position - below) * WORD > threshold), resolution)
    key = j.to_bytes(4, "big")
    noise = reference_stream(b"noise", "load_time", reference_context(layout, fp, key), 64)
    vector = {"metric": "load_time", "value": value, "layout": layout, "params": params,
              "fingerprint": fp, "threshold": threshold, "grid_point": j,
              "noise_stream_hex": noise.hex()}
    if params["mechanism"] == "1bitmean":
        e = math.exp(params["epsilon"])
        numerator = min(max(round((1 + j / resolution * (e - 1)) / (e + 1) * WORD), 1), WORD - 1)
        vector["answer"] = int(words(noise, 1)[0] < numerator)
    else:
        metric = Metric("load_time", params_from_dict(params))
        vector["answer"] = make_encoder(metric, SECRET, layout=layout).encode(value)
    return vector


STRING_PARAMS = [
    ("homepage", "example.com", 3,
     {"kind": "string", "k": 32, "h": 2, "m": 64, "p": 0.5, "q": 0.75, "f": 0.5}),
    ("homepage", "example.com", 3,
     {"kind": "string", "k": 128, "h": 2, "m": 64, "p": 0.5, "q": 0.75, "f": 0.5}),
    ("search", "cats", 0,
     {"kind": "string", "k": 16, "h": 2, "m": 4, "p": 0.39, "q": 0.61, "f": 0.45}),
]
CATEGORY_PARAMS = {"kind": "category", "categories": ["firefox", "chrome", "safari", "edge"],
                   "p": 0.5, "q": 0.75, "f": 0.5}
BOOLEAN_PARAMS = {"kind": "boolean", "alpha": 0.5, "beta": 0.5}
STRING_ORACLE_PARAMS = [
    {"kind": "string", "oracle": "flh", "epsilon": 2.0, "report_epsilon": 1.0, "g": 4,
     "functions": 16384},
    {"kind": "string", "oracle": "hcms", "epsilon": 2.0, "report_epsilon": 1.0, "rows": 4096,
     "columns": 16},
]
STRING_ORACLE_VALUES = [("example.com", 3), ("", 0), ("h\u00e9llo w\u00f6rld \u2713", 4095),
                        ("a value longer than sixteen bytes", 77)]
NUMBER_PARAMS = [
    {"kind": "number", "low": 0.0, "high": 10.0, "mechanism": "1bitmean", "epsilon": 1.0,
     "delta": None, "resolution": 10},
    {"kind": "number", "low": 0.0, "high": 10.0, "mechanism": "laplace", "epsilon": 1.0,
     "delta": None, "resolution": 10},
]


def build_vectors() -> dict[str, Any]:
    """Every vector, derived from the protocol's text (the ``laplace`` answer aside)."""
    # imported here, not above: vector_oracles builds on this module
    from tests.shared.vector_oracles import category_oracle_vectors, joint_vectors

    layouts = (STREAM_LAYOUT, 1)
    home = reference_fingerprint(STRING_PARAMS[0][3])
    context = (3).to_bytes(4, "big") + b"example.com"
    categories = CATEGORY_PARAMS["categories"]
    seed = int.from_bytes(reference_stream(b"cohort", "", b"", 8), "big")
    return {
        "version": VERSION,
        "secret_hex": SECRET.hex(),
        "bloom": [
            {"value": value, "cohort": cohort, "k": k, "h": h,
             "indices": [murmur3_x86_32(value.encode(), (cohort << 16) | i) % k for i in range(h)]}
            for value, cohort, k, h in [("", 0, 16, 2), ("example.com", 0, 128, 2),
                                        ("example.com", 3, 128, 2), ("v1", 63, 32, 4),
                                        ("h\u00e9llo w\u00f6rld \u2713", 7, 4096, 16)]
        ],
        "stream": [
            {"purpose": "prr", "metric": "homepage", "layout": layout,
             "context_hex": reference_context(layout, home, context).hex(),
             "first_64_bytes_hex": reference_stream(
                 b"prr", "homepage", reference_context(layout, home, context), 64).hex()}
            for layout in layouts
        ],
        "prr": [
            prr_vector(metric, value, cohort, params, layout,
                       string_bloom(value, cohort, params["k"], params["h"]))
            for layout in layouts for metric, value, cohort, params in STRING_PARAMS
        ],
        "category": [
            prr_vector("browser", "chrome", 0, CATEGORY_PARAMS, layout,
                       1 << categories.index("chrome"))
            for layout in layouts
        ],
        "boolean": [boolean_vector(value, BOOLEAN_PARAMS, layout)
                    for layout in layouts for value in (True, False)],
        "number": [number_vector(3.7, params, layout)
                   for layout in layouts for params in NUMBER_PARAMS],
        "string_oracle": [
            string_oracle_vector(value, cohort, params,
                                 params_from_dict(params).prr_numerator)
            for params in STRING_ORACLE_PARAMS for value, cohort in STRING_ORACLE_VALUES
        ],
        "category_oracle": category_oracle_vectors(),
        "joint": joint_vectors(),
        "cohort_seed": {"cohort_seed_hex": seed.to_bytes(8, "big").hex(), "cohort_seed": seed,
                        "m": 64, "cohort": seed % 64},
    }


VECTORS = json.loads(PATH.read_text(encoding="utf-8"))


def published(section: str) -> list[dict[str, Any]]:
    """The file's vectors of ``section`` (none while a new section is being written: the
    whole-file check above still fails until the file is regenerated)."""
    return list(VECTORS.get(section, []))


def vector_id(vector: dict[str, Any]) -> str:
    return f"{vector['params']['kind']}-{vector['value']}-layout{vector['layout']}"


def test_the_file_holds_what_the_protocol_derives() -> None:
    assert build_vectors() == VECTORS, "run python tests/shared/test_vectors.py after a change"


def vector_encoder(vector: dict[str, Any], cohort_seed: int = 0) -> Any:
    params = params_from_dict(vector["params"])
    assert params.fingerprint == vector["fingerprint"]
    return make_encoder(Metric(vector["metric"], params), SECRET, cohort_seed,
                        layout=vector["layout"])


@pytest.mark.parametrize("vector", published("bloom"), ids=lambda v: f"{v['value']!r}-c{v['cohort']}")
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


@pytest.mark.parametrize("vector", published("stream"), ids=lambda v: f"layout{v['layout']}")
def test_hmac_stream(vector):
    context = bytes.fromhex(vector["context_hex"])
    expected = bytes.fromhex(vector["first_64_bytes_hex"])
    assert reference_stream(vector["purpose"].encode(), vector["metric"], context, 64) == expected
    stream = HmacStream(SECRET, vector["purpose"].encode(), vector["metric"], context)
    assert stream.read(10) + stream.read(54) == expected


@pytest.mark.parametrize("vector", published("prr") + published("category"), ids=vector_id)
def test_prr(vector: dict[str, Any]) -> None:
    encoder = vector_encoder(vector, vector["cohort"])
    if vector["params"]["kind"] == "string":
        assert encoder.bloom(vector["value"].encode()) == int.from_bytes(
            bytes.fromhex(vector["bits_hex"]), "little")
    prr = int.from_bytes(bytes.fromhex(vector["prr_hex"]), "little")
    assert encoder.memoized(encoder.memo_key(vector["value"])) == prr


@pytest.mark.parametrize("vector", published("boolean"), ids=vector_id)
def test_boolean(vector: dict[str, Any]) -> None:
    assert vector_encoder(vector).encode(vector["value"]) == vector["answer"]


@pytest.mark.parametrize("vector", published("number"),
                         ids=lambda v: f"{v['params']['mechanism']}-layout{v['layout']}")
def test_number(vector: dict[str, Any]) -> None:
    encoder = vector_encoder(vector)
    assert encoder.grid_point(vector["value"]) == vector["grid_point"]
    assert encoder.encode(vector["value"]) == vector["answer"]


@pytest.mark.parametrize("vector", published("string_oracle"),
                         ids=lambda v: f"{v['params']['oracle']}-{v['cohort']}")
def test_string_oracle(vector: dict[str, Any]) -> None:
    from veil.shared.kinds.string_oracles import bucket, value_key

    data = vector["value"].encode()
    assert value_key(data) == vector["value_key"]
    encoder = vector_encoder(vector, vector["cohort"])
    assert encoder.cohort == vector["cohort"]
    assert bucket(vector["cohort"], vector["value_key"], encoder.params.buckets) == vector["bucket"]
    assert encoder.params.prr_numerator == vector["prr_numerator"]
    stream = encoder.prr_stream(data)
    assert stream.read(64) == bytes.fromhex(vector["first_64_bytes_hex"])
    assert encoder.memoized(encoder.memo_key(vector["value"])) == vector["permanent"]


def kept(oracle: str) -> Callable[[int], bytes]:
    """Fresh bytes under which the instantaneous response keeps the permanent one: zero
    bytes (``u32() = 0 < N_irr``) for GRR, OLH and Hadamard; for OUE all ones (every
    ``U_i = 2^32 - 1`` is at least ``N_0``: no bit flips)."""
    fill = b"\xff" if oracle == "oue" else b"\x00"
    return lambda n: fill * n


def declared_encoder(vector: dict[str, Any], oracle: str, cohort_seed: int = 0) -> Any:
    """The SDK's encoder of the vector's metric declared without ``g`` (chosen by default):
    its parameters must be the vector's, as ``to_dict()`` writes them. Fresh bytes from the
    CSPRNG when ``lambda = 1`` (every report is the permanent response), else :func:`kept`."""
    params = params_from_dict({k: v for k, v in vector["params"].items() if k != "g"})
    assert json.loads(json.dumps(params.to_dict())) == vector["params"]
    assert params.fingerprint == vector["fingerprint"]
    fresh = os.urandom if params.report_epsilon == params.epsilon else kept(oracle)
    return make_encoder(Metric(vector["metric"], params), SECRET, cohort_seed, fresh,
                        layout=vector["layout"])


@pytest.mark.parametrize("vector", published("category_oracle"), ids=lambda v: (
    f"{v['params']['oracle']}-{v['params']['epsilon']}-{v['params']['report_epsilon']}-"
    f"{v['value']}"))
def test_category_oracle(vector: dict[str, Any]) -> None:
    oracle = vector["params"]["oracle"]
    encoder = declared_encoder(vector, oracle)
    assert encoder.params.index(vector["value"]) == vector["index"]
    assert encoder.params.prr_numerator == vector["prr_numerator"]
    stream = encoder.prr_stream(vector["value"].encode())
    assert stream.read(64) == bytes.fromhex(vector["first_64_bytes_hex"])
    if oracle == "olh":
        function, _ = encoder.memoized(encoder.memo_key(vector["value"]))
        assert function == vector["function"]
        assert encoder.params.hash(function, vector["index"]) == vector["bucket"]
    assert encoder.encode(vector["value"]) == vector["permanent"]


@pytest.mark.parametrize("vector", published("joint"),
                         ids=lambda v: f"{v['metric']}-{v['cell']}")
def test_joint(vector: dict[str, Any]) -> None:
    """The SDK's path: the installation's cohort seed, the tuple's cell, the cell oracle."""
    oracle = vector["params"]["encoding"]
    encoder = declared_encoder(vector, oracle, derived_cohort_seed(SECRET))
    assert encoder.cohort == vector["cohort"]
    key = encoder.memo_key(vector["value"])
    assert key == vector["category"].encode() == str(vector["cell"]).encode()
    assert encoder.params.cell_oracle.prr_numerator == vector["prr_numerator"]
    stream = encoder.permanent_stream(b"prr", key)
    assert stream.read(64) == bytes.fromhex(vector["first_64_bytes_hex"])
    if oracle == "olh":
        function, _ = encoder.memoized(key)
        assert function == vector["function"]
        assert encoder.params.cell_oracle.hash(function, vector["cell"]) == vector["bucket"]
    assert encoder.encode(vector["value"]) == vector["permanent"]


def test_the_joint_vectors_name_what_auto_chooses() -> None:
    """Section 9: the pair's ``grr`` and the three variables' ``olh`` are ``auto``'s choices."""
    for vector in published("joint"):
        if vector["params"]["encoding"] in ("grr", "olh"):
            declared = {k: v for k, v in vector["params"].items() if k != "g"}
            params = params_from_dict({**declared, "encoding": "auto"})
            assert json.loads(json.dumps(params.to_dict())) == vector["params"]


def test_the_murmur_x64_reference_is_the_hashing_library() -> None:
    import mmh3

    for data in (b"", b"a", b"example.com", b"exactly 16 bytes", b"seventeen bytes!!", bytes(range(40))):
        assert murmur3_x64_128_h1(data) == mmh3.hash64(data, 0, True, signed=False)[0]


def test_the_layouts_differ_only_by_the_fingerprint() -> None:
    """Layout 1 is the layout 2 stream without ``fingerprint || 0x00``: one answer each."""
    new, old = VECTORS["stream"]
    assert (new["layout"], old["layout"]) == (2, 1)
    assert bytes.fromhex(new["context_hex"]).endswith(bytes.fromhex(old["context_hex"]))
    assert new["first_64_bytes_hex"] != old["first_64_bytes_hex"]


def test_cohort_seed():
    vector = VECTORS["cohort_seed"]
    seed = int.from_bytes(reference_stream(b"cohort", "", b"", 8), "big")
    assert seed.to_bytes(8, "big").hex() == vector["cohort_seed_hex"]
    assert seed == vector["cohort_seed"] and seed % vector["m"] == vector["cohort"]
    assert derived_cohort_seed(SECRET) == seed


if __name__ == "__main__":
    # a script has its own folder on the path, not the checkout's: vector_oracles needs it
    sys.path.insert(0, str(Path(__file__).parents[2]))
    PATH.write_text(json.dumps(build_vectors(), indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")
