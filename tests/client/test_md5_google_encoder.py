"""The SDK encoder hashes with google/rappor's MD5 when a metric says ``hashing = "md5-google"``.

Expected Bloom bits come from google/rappor's published map rows for k=16, h=2,
m=4 (``bin/hash_candidates_test.py``): row entry ``c*k + bit + 1``.
"""

from __future__ import annotations

import random

from veil.client.encoders import make_encoder
from veil.shared.kinds import StringParams
from veil.shared.registry import Metric

#: google/rappor's hash_candidates_test.py: k=16, h=2, m=4
GOOGLE_ROWS = {
    "apple": [5, 1, 26, 26, 38, 34, 63, 62],
    "banana": [12, 14, 28, 24, 37, 34, 62, 49],
    "carrot": [4, 12, 25, 21, 48, 38, 61, 54],
}
K, H, M = 16, 2, 4


def google_bloom(value: str, cohort: int) -> int:
    """Cohort ``cohort``'s Bloom filter of ``value`` read off Google's map row."""
    bits = 0
    for entry in GOOGLE_ROWS[value][cohort * H : (cohort + 1) * H]:
        bits |= 1 << (entry - 1 - cohort * K)
    return bits


def test_encoder_bloom_filters_are_googles_in_every_cohort() -> None:
    metric = Metric("homepage", StringParams(k=K, h=H, m=M, hashing="md5-google"))
    rnd = random.Random(12)
    seen = set()
    for seed in range(40):
        encoder = make_encoder(metric, rnd.randbytes(32), seed)
        assert encoder.cohort is not None
        seen.add(encoder.cohort)
        for value in GOOGLE_ROWS:
            assert encoder.bloom(value.encode()) == google_bloom(value, encoder.cohort)  # type: ignore[attr-defined]
    assert seen == set(range(M))


def test_noiseless_reports_are_googles_bloom_filters() -> None:
    """With f=0, p=0, q=1 a report is its Bloom filter: the wire carries Google's bits."""
    params = StringParams(k=K, h=H, m=M, p=0.0, q=1.0, f=0.0, hashing="md5-google")
    metric = Metric("homepage", params)
    rnd = random.Random(3)
    for seed in range(12):
        encoder = make_encoder(metric, rnd.randbytes(32), seed, rnd.randbytes)
        assert encoder.cohort is not None
        for value in GOOGLE_ROWS:
            payload = int.from_bytes(bytes.fromhex(encoder.encode(value)), "little")
            assert payload == google_bloom(value, encoder.cohort)
