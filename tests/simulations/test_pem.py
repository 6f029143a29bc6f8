"""PEM, the prefix extension baseline: its OLH reports, estimator and search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from veil.server.analysis.discovery import support_counts
from veil.shared.errors import ParameterError
from veil.shared.kinds.discovery import best_bucket_bits
from veil.simulations.pem import (
    child_fingerprints,
    group_count,
    keep_probability,
    olh_reports,
    padded_values,
    parent_hash,
    prefix_fingerprint,
    run_pem,
    share_estimates,
    value_fingerprints,
)

#: fewer fingerprint bits than the default 24: a 16x smaller transform per round
BITS = 20


def true_buckets(rows: np.ndarray, fingerprint: int) -> np.ndarray:
    """``A x`` over GF(2) for every report's matrix, written independently of the encoder."""
    out = np.zeros(rows.shape[1], dtype=np.int64)
    for r, row in enumerate(rows):
        parity = np.array([bin(int(v) & fingerprint).count("1") & 1 for v in row])
        out |= parity.astype(np.int64) << r
    return out


def test_client_and_server_compute_the_same_fingerprints() -> None:
    values = ["hello world", "héllo", "abc", "x" * 70, ""]
    padded = padded_values(values, 64, 2)
    assert padded.shape == (5, 2 * group_count(64, 2)) == (5, 64)
    assert padded[1].tobytes().startswith("héllo".encode() + b"\x00")
    assert padded[3].tobytes() == b"x" * 64  # as long as max_length: complete, no end marker
    for length in (2, 4, 8, 64):
        client = value_fingerprints(padded, length, 2)
        reference = [prefix_fingerprint(row[:length].tobytes()) for row in padded]
        server = [int(child_fingerprints(np.array([parent_hash(row[:length - 2].tobytes())],
                                                  dtype=np.uint64),
                                         np.array([int.from_bytes(row[length - 2:length], "big")]),
                                         2)[0]) for row in padded]
        assert client.tolist() == reference == server
        assert all(0 <= f < 1 << 24 for f in reference)


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_olh_report_law(epsilon: float) -> None:
    # The bucket equals A x with probability p = e^eps / (e^eps + g - 1) and each of the
    # g - 1 other buckets with (1 - p) / (g - 1): every fraction within 4 binomial
    # standard errors sqrt(P (1 - P) / n) of its probability P.
    rng = np.random.default_rng(11)
    t, n = best_bucket_bits(epsilon, epsilon), 20_000
    g, p = 1 << t, keep_probability(epsilon, t)
    assert math.isclose(p, math.exp(epsilon) / (math.exp(epsilon) + g - 1))
    fingerprint = prefix_fingerprint(b"ab")
    rows, buckets = olh_reports(np.full(n, fingerprint), epsilon, t, rng)
    assert rows.shape == (t, n) and rows.dtype == np.int64
    assert rows.min() >= 0 and rows.max() < 1 << 24
    offsets = np.bincount(buckets ^ true_buckets(rows, fingerprint), minlength=g) / n
    assert abs(offsets[0] - p) <= 4 * math.sqrt(p * (1 - p) / n)
    other = (1 - p) / (g - 1)
    assert np.all(np.abs(offsets[1:] - other) <= 4 * math.sqrt(other * (1 - other) / n))


@pytest.mark.parametrize("share", [0.0, 0.25])
def test_share_estimate_is_unbiased(share: float) -> None:
    # Over n reports, a prefix of true share s is estimated within 4 standard errors
    # sqrt(V / n), V = (s p (1 - p) + (1 - s) q (1 - q)) / (p - q)^2 with q = 1/g: a
    # report of another fingerprint supports it with probability exactly q.
    rng = np.random.default_rng(5)
    epsilon, n = 2.0, 40_000
    t = best_bucket_bits(epsilon, epsilon)
    p, q = keep_probability(epsilon, t), 1 / (1 << t)
    known = prefix_fingerprint(b"ve", bits=BITS)
    others = np.setdiff1d(rng.choice(1 << BITS, 1000, replace=False), [known])
    holders = round(share * n)
    fingerprints = np.concatenate([np.full(holders, known), rng.choice(others, n - holders)])
    rows, buckets = olh_reports(fingerprints, epsilon, t, rng, bits=BITS)
    counts = support_counts(rows, buckets, BITS)
    estimate = float(share_estimates(counts[[known]], n, epsilon, t)[0])
    variance = (share * p * (1 - p) + (1 - share) * q * (1 - q)) / (p - q) ** 2
    assert abs(estimate - share) <= 4 * math.sqrt(variance / n)


class RecordingGenerator:
    """A seeded generator that keeps what each ``multinomial`` call drew (run_pem draws the
    group sizes, then each group's holders of each value, with it); the rest is delegated."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self.multinomials: list[np.ndarray] = []

    def multinomial(self, *args: object, **kwargs: object) -> np.ndarray:
        drawn = self._rng.multinomial(*args, **kwargs)  # type: ignore[arg-type]
        self.multinomials.append(drawn)
        return drawn

    def __getattr__(self, name: str) -> object:
        return getattr(self._rng, name)


def test_pem_recovers_the_top_strings() -> None:
    # 20 strings of 8-20 bytes (one not ASCII) with Zipf(1) weights; the three most
    # frequent are in the output with estimates within 4 standard errors of the share
    # each holds among the last group's users (the ones its estimate is drawn from).
    rng = np.random.default_rng(2024)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789-_./", dtype=np.uint8)
    values = ["café-au-lait"] + [
        bytes(rng.choice(letters, rng.integers(8, 21))).decode() for _ in range(19)]
    weights = 1 / np.arange(1, 21)  # Zipf(1)
    seen: list[tuple[int, int]] = []
    recorded = RecordingGenerator(rng)
    result = run_pem(values, weights, 200_000, 4.0, recorded,  # type: ignore[arg-type]
                     k=8, max_length=24, fingerprint_bits=BITS,
                     progress=lambda done, total: seen.append((done, total)))
    groups = group_count(24, 2)
    assert seen == [(i, groups) for i in range(1, groups + 1)]
    assert len(result.rounds) == groups
    assert all(len(kept) == 8 and len(kept[0][0]) == 2 * (i + 1)
               for i, kept in enumerate(result.rounds))
    found = dict(result.strings)
    assert len(result.strings) <= 8 and result.seconds > 0
    # the draws: the group sizes, then how many of each group's users hold each value
    sizes, *held = recorded.multinomials
    assert sizes.sum() == 200_000 and len(held) == groups
    assert [int(h.sum()) for h in held] == sizes.tolist()
    # The strings' estimates come from the last round, over its n = sizes[-1] users: unbiased
    # for the share s a value holds among them, with the OLH variance at that fixed s,
    # V = (s p (1 - p) + (1 - s) q (1 - q)) / (n (p - q)^2), q = 1/g (a report of another
    # fingerprint supports it with probability exactly q). Against the population share
    # the draw of the users' values would add s (1 - s) / n.
    t = best_bucket_bits(4.0, 4.0)
    p, q = keep_probability(4.0, t), 1 / (1 << t)
    n = int(sizes[-1])
    for index, value in enumerate(values[:3]):
        assert value in found
        share = held[-1][index] / n
        variance = (share * p * (1 - p) + (1 - share) * q * (1 - q)) / (p - q) ** 2
        assert abs(found[value] - share) <= 4 * math.sqrt(variance / n), (value, found[value],
                                                                           share)
    estimates = [share for _, share in result.strings]
    assert estimates == sorted(estimates, reverse=True)
    # not asserted: that the first three outputs are exactly these. A candidate whose
    # fingerprint equals a true prefix's gets its estimate (a "twin"; with 2**BITS
    # fingerprints about 2**16 * k / 2**BITS of them per true prefix and round), so a
    # false string can sit among the top ones, tied with the string it twins.


@pytest.mark.parametrize(("field", "overrides"), [
    ("epsilon", {"epsilon": 0.0}),
    ("epsilon", {"epsilon": -1.0}),
    ("k", {"k": 0}),
    ("reports", {"reports": group_count(24, 2) - 1}),
])
def test_invalid_parameters_name_the_field(field: str, overrides: dict[str, object]) -> None:
    arguments: dict[str, object] = {"reports": 1000, "epsilon": 2.0, "k": 4}
    arguments.update(overrides)
    with pytest.raises(ParameterError) as caught:
        run_pem(["a", "b"], np.array([0.5, 0.5]), rng=np.random.default_rng(0), max_length=24,
                **arguments)
    assert caught.value.field == field
    assert field in str(caught.value)
