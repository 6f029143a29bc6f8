"""``buckets``: per cohort, how many reports carried each bucket (discovery channels).

A discovery report (:mod:`veil.shared.kinds.discovery`) is ``t`` rows of a hash
matrix and one bucket in ``[0, 2**t)``, its last byte; the cohort is the report's
level. The counts vector has one counter per bucket (``params.buckets``). The rows
differ from report to report, so they stay in the stored payloads, which keep
every report's bytes.

The vector lives in the ``bit_counts`` aggregate column, the counter column the
``bits`` and ``responses`` statistics use: a metric keeps one statistic, so they
never share a row, and the stores need no column of their own for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import Field, PayloadType
from veil.shared.statistics.responses import ResponseCounts


class BucketCounts(ResponseCounts):
    """Counts of each bucket (a payload's last byte); a report is stored as its bytes."""

    name: ClassVar[str] = "buckets"
    fields = (Field("counts", "counts", "bit_counts"),)
    payload_type: ClassVar[PayloadType] = "bytes"

    def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> bytes:
        return bytes(value)

    def index(self, stored: Any) -> int:
        return int(stored[-1])

    def indices(self, stored: Sequence[Any]) -> np.ndarray:
        return np.fromiter((payload[-1] for payload in stored), dtype=np.int64,
                           count=len(stored))

    def index_array(self, payloads: np.ndarray) -> np.ndarray:
        return np.asarray(payloads, dtype=np.uint8)[:, -1].astype(np.int64)
