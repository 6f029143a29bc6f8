"""``bits``: per cohort, how many reports set each of the ``k`` bits (RAPPOR kinds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.bits import bit_list, payload_bytes
from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import CohortCounters, Field, PayloadType, State, Statistic

#: ``BYTE_BITS[b, i]`` is bit ``i`` (least significant first) of the byte value ``b``: the
#: table that turns a histogram of byte values into counts of set bits
BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1,
                          bitorder="little").astype(np.int64)
#: reports per block of :func:`bit_counts_by_cohort`: a block's histogram indices stay in
#: the CPU cache (65,536 was the fastest of 16,384 to 262,144, measured at k=128, m=64)
BLOCK_REPORTS = 65_536


def bit_counts_by_group(payloads: Sequence[bytes], groups: np.ndarray, k: int,
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Per-group bit counts of equal-length little-endian payloads.

    ``groups`` gives each payload's group number; returns the distinct groups
    (sorted) and a ``(len(groups), k)`` uint64 array of set-bit counts.
    """
    width = payload_bytes(k)
    raw = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(len(payloads), width)
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    bits = np.unpackbits(raw[order], axis=1, bitorder="little", count=k)
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    sums = np.add.reduceat(bits, starts, axis=0, dtype=np.uint64)
    return sorted_groups[starts], sums


def bit_counts_by_cohort(cohorts: np.ndarray, payloads: np.ndarray, k: int,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Reports and set-bit counts per cohort of payloads held as one ``(n, width)`` uint8
    array of little-endian bytes.

    Returns ``reports`` (``(size,)`` int64) and ``ones`` (``(size, k)`` int64) for the
    cohorts ``0 .. size - 1``, ``size`` being the largest cohort plus one. No sort and no
    unpacking of bits: per byte position, one ``bincount`` of ``cohort * 256 + byte``
    gives each cohort's histogram of byte values, and :data:`BYTE_BITS` turns the
    histograms into bit counts (about 16 passes over 1 byte a report at k=128).
    """
    cohorts = np.asarray(cohorts, dtype=np.intp)
    payloads = np.asarray(payloads, dtype=np.uint8)
    width = payload_bytes(k)
    if payloads.ndim != 2 or payloads.shape != (len(cohorts), width):
        raise ValueError(f"payloads of k={k} bits must be a ({len(cohorts)}, {width}) uint8 "
                         f"array; got shape {payloads.shape}")
    if not len(cohorts):
        return np.zeros(0, dtype=np.int64), np.zeros((0, k), dtype=np.int64)
    if cohorts.min() < 0:
        raise ValueError("a cohort is negative")
    size = int(cohorts.max()) + 1
    bins = size * 256
    histograms = np.zeros((width, bins), dtype=np.int64)
    index = np.empty(min(BLOCK_REPORTS, len(cohorts)), dtype=np.intp)
    for first in range(0, len(cohorts), BLOCK_REPORTS):
        base = cohorts[first:first + BLOCK_REPORTS] * 256
        columns = np.ascontiguousarray(payloads[first:first + BLOCK_REPORTS].T)
        block = index[:len(base)]
        for position in range(width):
            np.add(base, columns[position], out=block)
            histograms[position] += np.bincount(block, minlength=bins)
    bits = histograms.reshape(width * size, 256) @ BYTE_BITS
    ones = bits.reshape(width, size, 8).transpose(1, 0, 2).reshape(size, width * 8)[:, :k]
    return np.bincount(cohorts, minlength=size).astype(np.int64), ones


class BitCounts(Statistic):
    """Set-bit counts of ``k``-bit reports; a report is stored as its little-endian bytes."""

    name: ClassVar[str] = "bits"
    fields = (Field("ones", "counts", "bit_counts"),)
    payload_type: ClassVar[PayloadType] = "bytes"

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> bytes:
        return bytes.fromhex(payload)

    def of_report(self, params: MechanismParams, stored: Any) -> State:
        bits = int.from_bytes(stored, "little")
        return {"ones": np.array(bit_list(bits, self.length(params)), dtype=np.uint64)}

    def accumulate(self, params: MechanismParams, cohorts: np.ndarray, stored: Sequence[Any],
                   ) -> list[tuple[int, int, State]]:
        keys, sums = bit_counts_by_group(stored, cohorts, self.length(params))
        reports = np.bincount(cohorts)[keys]
        return [(int(c), int(n), {"ones": s}) for c, n, s in zip(keys, reports, sums, strict=True)]

    def accumulate_arrays(self, params: MechanismParams, cohorts: np.ndarray,
                          payloads: np.ndarray) -> list[tuple[int, int, State]]:
        """From byte histograms (:func:`bit_counts_by_cohort`): over 10 million reports a
        second on one core at k=128 (``benchmarks/bench_aggregate.py``)."""
        return self.accumulate_counters(params, cohorts, payloads).states("ones")

    def accumulate_counters(self, params: MechanismParams, cohorts: np.ndarray,
                            payloads: np.ndarray) -> CohortCounters:
        reports, ones = bit_counts_by_cohort(cohorts, payloads, self.length(params))
        present = np.flatnonzero(reports)
        return CohortCounters(present.astype(np.int64), reports[present],
                              ones[present].astype(np.uint64))
