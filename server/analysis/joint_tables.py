"""Pieces of a joint decode's tables that the whole table and the assigned marginals
(:mod:`veil.server.analysis.joint`, :mod:`veil.server.analysis.joint_marginals`) share: the
marginals' columns, a result whose variable columns stay text, a share's interval row."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import z_quantile
from veil.server.analysis.tables import interval_column, write_rows

if TYPE_CHECKING:
    import pandas

#: columns of ``marginals.csv``
MARGINAL_COLUMNS = ("metric", "variable", "value", "proportion", "prop_std_error",
                    "prop_low_95", "prop_high_95")



@dataclasses.dataclass
class TextColumnsResult(DecodeResult):
    """A result whose ``text_columns`` (the variables' values among them) stay text in
    :meth:`to_records` and :meth:`to_pandas`."""

    text_columns: tuple[str, ...] = ()

    def to_records(self) -> np.recarray:
        """As :meth:`DecodeResult.to_records`, the variables' columns as text."""
        dtype = [(name, f"U{max([len(str(row[name])) for row in self.rows] + [1])}")
                 if name in self.text_columns else (name, "f8") for name in self.columns]
        values = [tuple(str(row[name]) if name in self.text_columns else float(row[name])
                        for name in self.columns) for row in self.rows]
        return np.rec.array(np.array(values, dtype=dtype))

    def to_pandas(self) -> pandas.DataFrame:
        """The cells as a tidy DataFrame, one row per cell, the variables' columns as text and
        the rest as floats."""
        import pandas

        frame = pandas.DataFrame(self.rows, columns=list(self.columns))
        numbers = [name for name in self.columns if name not in self.text_columns]
        return frame.astype(dict.fromkeys(numbers, float))


@dataclasses.dataclass
class JointTablesResult(TextColumnsResult):
    """A decoded joint metric: ``rows`` one per cell, ``marginal_rows`` each variable's
    shares (``marginals.csv``), ``shape`` the number of values of each variable; the side
    tables (:meth:`side_tables`) and the heatmap are :meth:`extra_files`."""

    marginal_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    shape: tuple[int, ...] = ()

    def marginals_to_pandas(self) -> pandas.DataFrame:
        """``marginals.csv`` as a DataFrame."""
        return self.side_frame(MARGINAL_COLUMNS, self.marginal_rows)

    def interval_named(self, columns: Sequence[str], rows: Sequence[dict[str, Any]],
                       ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """A side table's columns and rows with the interval columns named for the decode's
        confidence (``low_90`` at 0.9), as :attr:`rows` are."""
        confidence = float(self.summary.get("confidence") or 0.95)
        names = {column: interval_column(column, confidence) for column in columns}
        return (tuple(names.values()),
                [{names.get(key, key): value for key, value in row.items()} for row in rows])

    def side_frame(self, columns: Sequence[str], rows: Sequence[dict[str, Any]],
                   ) -> pandas.DataFrame:
        """A side table as a DataFrame, its interval columns named (:meth:`interval_named`)."""
        import pandas

        named, renamed = self.interval_named(columns, rows)
        return pandas.DataFrame(renamed, columns=list(named))

    def side_tables(self) -> dict[str, tuple[tuple[str, ...], list[dict[str, Any]]]]:
        """``{name: (columns, rows)}`` of each ``name.csv`` written beside the results."""
        return {"marginals": (MARGINAL_COLUMNS, self.marginal_rows)}

    def save_heatmap(self, path: Path) -> None:
        """Draw the result's heatmap to ``path``."""
        raise NotImplementedError

    def extra_files(self, out: Path) -> dict[str, Path]:
        """Each side table as ``name.csv`` and ``heatmap.png`` in ``out``."""
        paths = {}
        for name, (columns, rows) in self.side_tables().items():
            paths[name] = out / f"{name}.csv"
            write_rows(paths[name], *self.interval_named(columns, rows))
        paths["heatmap"] = out / "heatmap.png"
        self.save_heatmap(paths["heatmap"])
        return paths


def interval_row(metric: str, share: float, se: float, z: float) -> dict[str, Any]:
    """A share's row of ``marginals.csv``: the share, its error and its interval in [0, 1]."""
    return {"metric": metric, "proportion": share, "prop_std_error": se,
            "prop_low_95": min(max(share - z * se, 0.0), 1.0),
            "prop_high_95": max(min(share + z * se, 1.0), 0.0)}


def one_way_rows(metric: str, variables: Sequence[tuple[str, Sequence[str]]],
                 estimates: Iterable[tuple[np.ndarray, np.ndarray]], confidence: float,
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each variable's shares as rows of ``marginals.csv`` and as the summary's
    ``{variable: {value: {proportion, ...}}}`` (interval keys named for ``confidence``, as
    the tables' columns are): ``variables`` the (name, values) pairs, ``estimates`` each
    one's shares and standard errors, in the same order."""
    z = z_quantile(confidence)
    keys = {key: interval_column(key, confidence) for key in MARGINAL_COLUMNS[3:]}
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for (name, labels), (shares, errors) in zip(variables, estimates, strict=True):
        summary[name] = {}
        for label, share, se in zip(labels, shares, errors, strict=True):
            row = {**interval_row(metric, float(share), float(se), z),
                   "variable": name, "value": label}
            rows.append(row)
            summary[name][label] = {named: row[key] for key, named in keys.items()}
    return rows, summary
