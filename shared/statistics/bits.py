"""``bits``: per cohort, how many reports set each of the ``k`` bits (RAPPOR kinds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.bits import bit_list, payload_bytes
from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import Field, PayloadType, State, Statistic


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


class BitCounts(Statistic):
    """Set-bit counts of ``k``-bit reports; a report is stored as its little-endian bytes."""

    name: ClassVar[str] = "bits"
    fields = (Field("ones", "counts", "bit_counts"),)
    payload_type: ClassVar[PayloadType] = "bytes"
    length_name: ClassVar[str] = "k"

    def length(self, params: MechanismParams) -> int:
        return int(params.k)  # type: ignore[attr-defined]

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
