"""The decoded result: a table (rows of dicts, or a NumPy record array) and a summary.

Every decoder builds its rows here (:func:`frequency_rows`, :func:`number_row`), so a
table's keys are always its declared columns.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: results.csv columns for strings and categories: google/rappor's plus ``p_value``
FREQUENCY_COLUMNS = (
    "string",
    "estimate",
    "std_error",
    "proportion",
    "prop_std_error",
    "prop_low_95",
    "prop_high_95",
    "p_value",
)
#: results.csv columns for numbers (one row per statistic)
NUMBER_COLUMNS = ("statistic", "estimate", "std_error", "low_95", "high_95")


def frequency_rows(
    labels: Sequence[str],
    shares: np.ndarray,
    std_errors: np.ndarray,
    p_values: np.ndarray,
    total: int,
    z: float,
) -> list[dict[str, Any]]:
    """Rows of :data:`FREQUENCY_COLUMNS`: each share of ``total`` reports as a count and a
    proportion, with its ``z`` interval intersected with [0, 1] (where the true share lies;
    both ends are clipped, so an interval wholly below 0 becomes [0, 0], never empty)."""
    return [
        _row(
            FREQUENCY_COLUMNS,
            label,
            float(share * total),
            float(se * total),
            float(share),
            float(se),
            float(min(max(share - z * se, 0.0), 1.0)),
            float(max(min(share + z * se, 1.0), 0.0)),
            float(p_value),
        )
        for label, share, se, p_value in zip(labels, shares, std_errors, p_values, strict=True)
    ]


def number_row(
    statistic: str, estimate: float, std_error: float, z: float, low: float, high: float
) -> dict[str, Any]:
    """A row of :data:`NUMBER_COLUMNS`: ``estimate`` with its ``z`` interval clipped to
    ``[low, high]``, where the true value lies (the estimate itself stays unclipped)."""
    return _row(
        NUMBER_COLUMNS,
        statistic,
        float(estimate),
        float(std_error),
        float(min(max(estimate - z * std_error, low), high)),
        float(max(min(estimate + z * std_error, high), low)),
    )


def _row(columns: tuple[str, ...], *values: Any) -> dict[str, Any]:
    return dict(zip(columns, values, strict=True))


@dataclasses.dataclass
class DecodeResult:
    """What a decoder found: ``rows`` (one dict per string, category or statistic,
    keyed by ``columns``), ``summary`` (sample size, privacy cost, fit quality) and
    ``headline``, the one line a command prints about it."""

    kind: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    headline: str = ""

    def to_records(self) -> np.recarray:
        """The rows as a NumPy record array (text column first, then floats)."""
        first = self.columns[0]
        width = max([len(str(row[first])) for row in self.rows] + [1])
        dtype = [(first, f"U{width}")] + [(name, "f8") for name in self.columns[1:]]
        values = [
            tuple([str(row[first])] + [_float(row[name]) for name in self.columns[1:]])
            for row in self.rows
        ]
        return np.rec.array(np.array(values, dtype=dtype))

    def column(self, name: str) -> list[Any]:
        """One column as a list."""
        return [row[name] for row in self.rows]

    def write_csv(self, path: str | Path) -> None:
        """Write the rows as CSV with a header (full float precision)."""
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(self.columns)
            for row in self.rows:
                writer.writerow([_csv_value(row[name]) for name in self.columns])

    def write_summary(self, path: str | Path) -> None:
        """Write the summary as indented JSON."""
        Path(path).write_text(json.dumps(_jsonable(self.summary), indent=2) + "\n", encoding="utf-8")


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
