"""Bit counts from byte histograms (``bit_counts_by_cohort``) against the sort-and-unpack
reference (``bit_counts_by_group``), on random payloads of every width."""

from __future__ import annotations

import numpy as np
import pytest

from veil.shared.bits import payload_bytes
from veil.shared.statistics.bits import BLOCK_REPORTS, bit_counts_by_cohort, bit_counts_by_group


@pytest.mark.parametrize(("k", "reports", "cohorts"), [
    (128, 2_000, 64), (13, BLOCK_REPORTS + 1_000, 5), (8, 300, 1), (1, 50, 3), (1024, 500, 2),
])
def test_byte_histograms_count_the_bits_of_each_cohort(k, reports, cohorts):
    rng = np.random.default_rng(k)
    payloads = rng.integers(0, 256, size=(reports, payload_bytes(k)), dtype=np.uint8)
    if k % 8:  # wire payloads keep the bits past k clear; counts must ignore them anyway
        payloads[:, -1] |= np.uint8(0xFF << (k % 8) & 0xFF)
    # cohorts in random order, with some cohorts never seen
    groups = rng.choice(np.arange(0, 2 * cohorts, 2), size=reports)
    sizes, ones = bit_counts_by_cohort(groups, payloads, k)
    keys, sums = bit_counts_by_group([row.tobytes() for row in payloads], groups, k)
    assert np.flatnonzero(sizes).tolist() == keys.tolist()
    assert sizes[keys].tolist() == np.bincount(groups)[keys].tolist()
    assert ones.shape == (groups.max() + 1, k)
    assert ones[keys].tolist() == sums.tolist()
    assert not ones[sizes == 0].any()


def test_no_reports_and_wrong_widths():
    sizes, ones = bit_counts_by_cohort(np.zeros(0, int), np.zeros((0, 16), np.uint8), 128)
    assert sizes.shape == (0,) and ones.shape == (0, 128)
    with pytest.raises(ValueError, match=r"must be a \(2, 16\) uint8 array"):
        bit_counts_by_cohort(np.zeros(2, int), np.zeros((2, 4), np.uint8), 128)
    with pytest.raises(ValueError, match="negative"):
        bit_counts_by_cohort(np.array([0, -1]), np.zeros((2, 1), np.uint8), 8)
