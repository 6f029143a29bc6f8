"""google/rappor's hashing (``hashing = "md5-google"``) against its published test vectors.

google/rappor's ``bin/hash_candidates_test.py`` lists the map rows of three
candidates for k=16, h=2, m=4: the candidate, then ``c*k + bit + 1`` for cohort
``c`` = 0..3 and hash ``i`` = 0..1, where its client sets bit
``MD5(be32(c) || utf8(value))[i] mod k``.
"""

from __future__ import annotations

import pytest

from veil.shared.errors import ParameterError
from veil.shared.hashing import bloom_bits, bloom_indices
from veil.shared.kinds import StringParams
from veil.shared.registry import Metric, Registry

#: google/rappor's hash_candidates_test.py: k=16, h=2, m=4
GOOGLE_ROWS = {
    "apple": [5, 1, 26, 26, 38, 34, 63, 62],
    "banana": [12, 14, 28, 24, 37, 34, 62, 49],
    "carrot": [4, 12, 25, 21, 48, 38, 61, 54],
}
K, H, M = 16, 2, 4


@pytest.mark.parametrize("value", sorted(GOOGLE_ROWS))
def test_md5_google_reproduces_google_test_vectors(value: str) -> None:
    row = [
        cohort * K + bit + 1
        for cohort in range(M)
        for bit in bloom_indices(value.encode(), cohort, K, H, "md5-google")
    ]
    assert row == GOOGLE_ROWS[value]


def test_md5_google_bloom_bits_are_the_or_of_the_indices() -> None:
    # apple in cohort 1 hashes twice to bit 9 (row entries 26, 26): one bit set
    assert bloom_bits("apple", 1, K, H, "md5-google") == 1 << 9
    assert bloom_bits("apple", 0, K, H, "md5-google") == (1 << 4) | (1 << 0)


def test_mmh3_stays_the_default() -> None:
    assert bloom_indices(b"apple", 3, 128, 2) == bloom_indices(b"apple", 3, 128, 2, "mmh3")
    assert StringParams().hashing == "mmh3"


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"h": 17}, "h"), ({"k": 257}, "k"), ({"hashing": "md5"}, "hashing"), ({"hashing": 1}, "hashing")],
)
def test_md5_google_limits_are_refused_by_name(changes: dict[str, object], field: str) -> None:
    settings: dict[str, object] = {"k": 16, "h": 2, "m": 4, "hashing": "md5-google", **changes}
    with pytest.raises(ParameterError) as info:
        StringParams.from_dict(settings)
    assert info.value.field == field


def test_md5_google_accepts_its_largest_filter() -> None:
    params = StringParams(k=256, h=16, m=1, hashing="md5-google")
    assert max(bloom_indices(b"x", 0, params.k, params.h, params.hashing)) < 256
    assert StringParams(k=1024, h=64).hashing == "mmh3"  # the limits are md5-google's only


def test_default_hashing_keeps_fingerprints_and_registries_unchanged() -> None:
    """``hashing`` is left out of ``to_dict`` (so of the fingerprint) while it is "mmh3"."""
    assert "hashing" not in StringParams().to_dict()
    assert StringParams().fingerprint == "4304110a10d8a531"  # docs/protocol.md section 8
    google = StringParams(hashing="md5-google")
    assert google.to_dict()["hashing"] == "md5-google"
    assert google.fingerprint != StringParams().fingerprint
    registry = Registry([Metric("old", StringParams()), Metric("google", google)])
    assert Registry.from_toml(registry.to_toml()) == registry
    assert Registry.from_dict(registry.to_dict()) == registry
    assert 'hashing = "md5-google"' in registry.to_toml()
    assert registry.to_toml().count("hashing") == 1
