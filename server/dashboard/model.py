"""What a page is made of, whatever it shows: tables, charts drawn from those tables, facts
and notes. The HTML page, its JSON twin and its CSV twin are three renderings of one
:class:`Page`, so a chart and its twin always show the same numbers: a chart names the
table and the columns it draws, and its points are that table's rows.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any, Literal

ChartType = Literal["bars", "lines", "spark"]


@dataclasses.dataclass
class Table:
    """Rows under named columns (``columns``: key -> label shown in the page)."""

    name: str
    title: str
    columns: dict[str, str]
    rows: list[dict[str, Any]]
    caption: str = ""

    def to_json(self) -> dict[str, Any]:
        """The table for the JSON twin (non-finite numbers as null)."""
        return {"name": self.name, "title": self.title, "columns": list(self.columns),
                "rows": [{key: _finite(row.get(key)) for key in self.columns}
                         for row in self.rows]}

    def to_csv(self) -> str:
        """The table as CSV with a header of its column keys, its text cells safe to open in
        a spreadsheet (:func:`~veil.server.analysis.tables.spreadsheet_safe`)."""
        from veil.server.analysis.tables import AnalystCsv

        out = io.StringIO()
        writer = AnalystCsv(out)
        writer.writerow(list(self.columns))
        for row in self.rows:
            writer.writerow(["" if _finite(row.get(key)) is None else row.get(key)
                             for key in self.columns])
        return out.getvalue()


@dataclasses.dataclass
class Chart:
    """A chart of ``table``: ``x`` against ``y`` with the interval ``low``..``high`` (when
    given), one series per value of ``series`` (when given), over the rows matching
    ``where``. ``lines`` and ``spark`` put days on ``x``; ``bars`` draws one bar a row."""

    id: str
    title: str
    table: str
    type: ChartType
    x: str
    y: str
    y_label: str
    low: str | None = None
    high: str | None = None
    series: str | None = None
    where: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: series drawn muted (grey, dashed): aggregates such as "other" beside the values
    muted: list[str] = dataclasses.field(default_factory=list)

    def points(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The columns this chart reads of ``rows`` (its table's rows matching ``where``)."""
        keys = [key for key in (self.x, self.y, self.low, self.high, self.series) if key]
        return [{key: _finite(row.get(key)) for key in keys} for row in rows]

    def to_json(self) -> dict[str, Any]:
        """The chart's description for the JSON twin and the page's script."""
        return {key: value for key, value in dataclasses.asdict(self).items()
                if value not in (None, {}, [])}


@dataclasses.dataclass
class Page:
    """One page: its ``title``, ``facts`` (label -> value shown above the tables),
    ``tables``, ``charts`` and ``notes``; its ``subject`` (a metric) and the ``related``
    pages about it."""

    kind: str
    title: str
    tables: list[Table] = dataclasses.field(default_factory=list)
    charts: list[Chart] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    subject: str = ""
    #: other pages about the same subject: label -> (view, metric)
    related: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)

    def table(self, name: str) -> Table:
        """The table called ``name``."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    def to_json(self, state: dict[str, Any]) -> dict[str, Any]:
        """The JSON twin: the state, facts, notes, every table and every chart."""
        return {"page": self.kind, "title": self.title, "subject": self.subject,
                "state": state, "facts": {key: _finite(value) for key, value in self.facts.items()},
                "notes": self.notes, "tables": [table.to_json() for table in self.tables],
                "charts": [chart.to_json() for chart in self.charts]}

    def chart_data(self) -> dict[str, dict[str, Any]]:
        """What the page's script draws for each chart, by id: its description and points.
        A table's rows are grouped by the columns charts filter on once, not per chart."""
        groups: dict[tuple[str, tuple[str, ...]], dict[tuple[Any, ...], list[dict[str, Any]]]]
        groups = {}
        drawn = {}
        for chart in self.charts:
            keys = tuple(sorted(chart.where))
            grouped = groups.get((chart.table, keys))
            if grouped is None:
                grouped = groups[(chart.table, keys)] = {}
                for row in self.table(chart.table).rows:
                    grouped.setdefault(tuple(row.get(key) for key in keys), []).append(row)
            rows = grouped.get(tuple(chart.where[key] for key in keys), [])
            drawn[chart.id] = {**chart.to_json(), "points": chart.points(rows)}
        return drawn


def _finite(value: Any) -> Any:
    """``value``, with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: how pages label the columns every decoder's table shares (docs/analysis.md names them)
RESULT_LABELS = {
    "metric": "Metric", "kind": "Kind", "value": "Value", "string": "String",
    "estimate": "Estimate", "std_error": "Std. error", "low_95": "95% low", "high_95": "95% high",
    "proportion": "Share", "prop_std_error": "Share std. error", "prop_low_95": "Share 95% low",
    "prop_high_95": "Share 95% high", "p_value": "p-value", "log10_p_value": "log10 p-value",
}


def result_columns(columns: Sequence[str]) -> dict[str, str]:
    """A decoder's columns with the labels pages show (its own name for one not listed)."""
    return {column: RESULT_LABELS.get(column, column) for column in columns}


def share_columns(extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The columns of a table of shares with their 95% intervals."""
    return {**dict(extra), "proportion": "Share", "prop_std_error": "Std. error",
            "prop_low_95": "95% low", "prop_high_95": "95% high"}
