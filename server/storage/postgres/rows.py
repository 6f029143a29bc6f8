"""How reports and statistics become PostgreSQL rows and back: days as numbers, payload
columns, COPY's text format, counter arrays in binary results, and fields compared with a
recount."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import numpy as np

from veil.server.storage.base import aggregate_columns, payload_array, sums_agree
from veil.server.storage.errors import StorageError
from veil.shared.statistics import State, Statistic

_EPOCH = dt.date(1970, 1, 1)
_PAYLOAD_DTYPES = {"int": "<i8", "float": "<f8"}

#: a report to store: hex id, metric, cohort, hex payload column, stored payload
Row = tuple[str, str, int, str, Any]


def day_number(day: str) -> int:
    """``day`` (``YYYY-MM-DD``) as days since 1970-01-01."""
    return (dt.date.fromisoformat(day) - _EPOCH).days


def day_text(number: int) -> str:
    """The day :func:`day_number` numbers ``number``."""
    return (_EPOCH + dt.timedelta(days=number)).isoformat()


def encode_payload(payload_type: str, stored: Any) -> bytes:
    """A stored payload as the bytes of the ``payload`` column (numbers: 8 bytes, little-endian)."""
    if payload_type == "bytes":
        return bytes(stored)
    return np.array(stored, dtype=_PAYLOAD_DTYPES[payload_type]).tobytes()


def decode_payloads(payload_type: str, blobs: Sequence[bytes], where: str = "",
                    ) -> np.ndarray:
    """``payload`` column values as the array :class:`StoredReports` holds;
    :class:`StorageError` for one whose length Veil never writes (``where`` names the
    metric and day): read joined, a short and a long payload would shift every row after
    them into a wrong one."""
    try:
        if payload_type == "bytes":
            return payload_array(payload_type, blobs)
        width = np.dtype(_PAYLOAD_DTYPES[payload_type]).itemsize
        odd = next((len(blob) for blob in blobs if len(blob) != width), None)
        if odd is not None:
            raise ValueError(f"a stored payload has {odd} bytes where the others have {width}")
    except ValueError as exc:
        raise StorageError(f"{exc}{where}: the row was changed outside Veil (restore the "
                           "database, or delete the row and run veil rebuild-aggregates)") from None
    return np.frombuffer(b"".join(blobs), dtype=_PAYLOAD_DTYPES[payload_type]).astype(
        np.int64 if payload_type == "int" else np.float64)



def aggregate_row(name: str, day: str, cohort: int, shard: int, reports: int,
                  statistic: Statistic, state: State) -> tuple[Any, ...]:
    """The row ``(metric, day, cohort, shard, reports, *COLUMNS)`` of one cohort's state."""
    return (name, day, int(cohort), shard, int(reports),
            *aggregate_columns(statistic, state, lambda v: v.astype(np.int64)))


def copy_line(row: Sequence[Any]) -> str:
    """One line of COPY's text format: counters as array literals, ``None`` as NULL."""
    fields = []
    for value in row:
        if value is None:
            fields.append("\\N")
        elif isinstance(value, np.ndarray):
            fields.append("{" + ",".join(map(str, value.tolist())) + "}")
        else:
            fields.append(str(value))
    return "\t".join(fields) + "\n"



def fields_equal(stored: Any, recounted: Any, reports: int) -> bool:
    """Whether a stored field equals its recount (sums of reals up to the order of addition)."""
    if isinstance(stored, np.ndarray) or isinstance(recounted, np.ndarray):
        return bool(np.array_equal(np.asarray(stored, dtype=np.uint64),
                                   np.asarray(recounted, dtype=np.uint64)))
    if isinstance(stored, float) or isinstance(recounted, float):
        return sums_agree(stored, recounted, reports)
    return bool(stored == recounted)


#: PostgreSQL's binary form of a one-dimensional bigint array: a 20-byte header (dimensions,
#: null flag, element type, length, lower bound), then per element its length and its value
_ARRAY_HEADER = 20
_ARRAY_ELEMENT = np.dtype([("length", ">i4"), ("value", ">i8")])


def array_counters(rows: Sequence[Sequence[Any]], at: int, length: int) -> np.ndarray:
    """Column ``at`` of aggregate rows (``array_send`` of ``length`` counters each) as a
    ``(len(rows), length)`` uint64 array; :class:`StorageError` for a malformed one."""
    blobs = [bytes(row[at])[_ARRAY_HEADER:] for row in rows]
    if any(len(blob) != length * _ARRAY_ELEMENT.itemsize for blob in blobs):
        raise StorageError(f"an aggregate row holds a counter array that is not {length} long")
    elements = np.frombuffer(b"".join(blobs), dtype=_ARRAY_ELEMENT)
    return elements["value"].astype(np.uint64).reshape(len(rows), length)
