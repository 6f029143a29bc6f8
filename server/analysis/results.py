"""The decoded result: one tidy table for every kind, a summary, and its views.

A :class:`DecodeResult` holds the rows a decoder built (:mod:`veil.server.analysis.tables`)
and turns into a pandas DataFrame (:meth:`~DecodeResult.to_pandas`), a NumPy record
array, CSV, an HTML table in a notebook and a chart (:meth:`~DecodeResult.plot`, drawn by
:mod:`veil.server.analysis.charts`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from veil.server.analysis.charts import Chart, plot_result
from veil.server.analysis.tables import TEXT_COLUMNS, html_table, interval_column, write_rows

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes


@dataclasses.dataclass
class DecodeResult:
    """What a decoder found: ``rows`` (one dict per string, category or statistic,
    keyed by ``columns``), ``summary`` (sample, days covered, privacy cost, fit quality),
    ``headline``, the one line a command prints about it, and ``chart``, how
    :meth:`plot` draws it."""

    kind: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    headline: str = ""
    chart: Chart = "shares"

    def __post_init__(self) -> None:
        """Name the interval columns for the confidence decoded at (``low_90`` at 0.9): the
        decoders write them as at the default 0.95."""
        confidence = float(self.summary.get("confidence") or 0.95)
        if interval_column("low_95", confidence) != "low_95":
            self.columns = tuple(interval_column(name, confidence) for name in self.columns)
            self.rows = [{interval_column(name, confidence): value
                          for name, value in row.items()} for row in self.rows]

    @property
    def metric(self) -> str:
        """The metric's name ("" when the counts did not name one)."""
        return str(self.summary.get("metric") or "")

    def to_records(self) -> np.recarray:
        """The rows as a NumPy record array (text columns as text, the rest as floats)."""
        dtype = [
            (name, f"U{max([len(str(row[name])) for row in self.rows] + [1])}")
            if name in TEXT_COLUMNS else (name, "f8")
            for name in self.columns
        ]
        values = [
            tuple(str(row[name]) if name in TEXT_COLUMNS else _float(row[name])
                  for name in self.columns)
            for row in self.rows
        ]
        return np.rec.array(np.array(values, dtype=dtype))

    def to_pandas(self) -> pandas.DataFrame:
        """The table as a tidy pandas DataFrame, one row per value, the columns of
        ``results.csv``, numbers as floats (an empty cell as NaN); pandas is the ``analysis``
        extra's, imported here only."""
        import pandas

        frame = pandas.DataFrame(self.rows, columns=list(self.columns))
        numbers = [name for name in self.columns if name not in TEXT_COLUMNS]
        return frame.astype(dict.fromkeys(numbers, float))

    def column(self, name: str) -> list[Any]:
        """One column as a list."""
        return [row[name] for row in self.rows]

    def plot(self, ax: Axes | None = None, top: int = 30) -> Axes:
        """Draw the estimates with their intervals on ``ax`` (a new figure when None);
        return the axes. Numbers show the mean on its metric's range, booleans the share
        answering true, strings and categories a bar per value (the ``top`` first)."""
        return plot_result(self, ax, top)

    def write_csv(self, path: str | Path) -> None:
        """Write the rows as CSV with a header (full float precision)."""
        write_rows(path, self.columns, self.rows)

    def extra_files(self, out: Path) -> dict[str, Path]:
        """Write the files a kind adds to ``results.csv``, ``summary.json`` and
        ``estimates.png`` into the directory ``out`` and return their paths (none here; a
        joint table adds its conditionals, marginals and heatmap)."""
        return {}

    def write_summary(self, path: str | Path) -> None:
        """Write the summary as indented JSON."""
        Path(path).write_text(json.dumps(_jsonable(self.summary), indent=2) + "\n", encoding="utf-8")

    def _repr_html_(self) -> str:
        """A headline and a compact table, for Jupyter."""
        return html_table(self.metric or "decoded", self.headline, self.summary, self.rows)


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


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
