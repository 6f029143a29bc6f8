"""Decoding day by day: one decode per UTC day, stacked into one tidy table.

Each day's counts are decoded on their own (:func:`decode_days`), so a day's estimates
and intervals are those of that day's reports alone. The table is ``results.csv``'s
with a ``day`` column in front (``by_day.csv``); the chart draws each estimate over
the days with its 95% band.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.server.analysis.charts import TOP_SERIES, plot_days
from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.tables import html_table, period, write_rows
from veil.shared.errors import ParameterError

if TYPE_CHECKING:
    import pandas
    from matplotlib.axes import Axes

@dataclasses.dataclass
class DailyResult:
    """Decodes of one metric, one per day (``days``: ``(day, result)`` oldest first), and
    the days left out (``skipped``: day -> why: too few reports for the metric's
    ``min_reports``, or for an estimate)."""

    metric: str
    days: list[tuple[str, DecodeResult]]
    skipped: dict[str, str]

    @property
    def columns(self) -> tuple[str, ...]:
        """``day``, then the columns of each day's ``results.csv``."""
        return ("day", *self.days[0][1].columns)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every day's rows, each with its ``day``, oldest day first."""
        return [{"day": day, **row} for day, result in self.days for row in result.rows]

    @property
    def summary(self) -> dict[str, Any]:
        """The days decoded and those skipped, with why."""
        return {"days": [day for day, _ in self.days], "skipped": dict(self.skipped)}

    def to_pandas(self) -> pandas.DataFrame:
        """The tidy table as a pandas DataFrame (``day`` as a datetime column)."""
        import pandas

        frame = pandas.DataFrame(self.rows, columns=list(self.columns))
        frame["day"] = pandas.to_datetime(frame["day"])
        return frame

    def write_csv(self, path: str | Path) -> None:
        """Write ``by_day.csv``: the rows with their ``day``."""
        write_rows(path, self.columns, self.rows)

    def plot(self, ax: Axes | None = None, top: int = TOP_SERIES) -> Axes:
        """Draw each day's estimate with its 95% band (for strings and categories the
        ``top`` values most common over the days) on ``ax`` (a new figure when None)."""
        return plot_days(self, ax, top)

    def _repr_html_(self) -> str:
        """A headline and the first rows, for Jupyter."""
        days = [day for day, _ in self.days]
        headline = f"{len(days)} day(s) decoded{period(days[0], days[-1])}"
        if self.skipped:
            headline += f"; {len(self.skipped)} skipped ({', '.join(sorted(self.skipped))})"
        return html_table(self.metric or "decoded", headline, {}, self.rows, extra=("day",))


def decode_days(
    documents: Sequence[tuple[str, dict[str, Any]]],
    candidates: Sequence[str] | None = None,
    skipped: dict[str, str] | None = None,
    **options: Any,
) -> DailyResult:
    """Decode each ``(day, counts document)`` on its own with :func:`decode_counts`
    (``candidates`` and ``options`` as there). A day too small to estimate from (such as
    a single report of a laplace mean) joins ``skipped``; :class:`ParameterError` if no
    day is left."""
    skipped = dict(skipped or {})
    days = []
    for day, document in documents:
        try:
            result = decode_counts(document, candidates, source=f"counts of {day}", **options)
        except ParameterError as exc:
            if exc.field != "counts":
                raise
            skipped[day] = exc.message
            continue
        days.append((day, result))
    if not days:
        reasons = "; ".join(f"{day}: {why}" for day, why in sorted(skipped.items()))
        raise ParameterError("counts", "no day holds enough reports to decode on its own"
                                       + (f" ({reasons})" if reasons else " (no reports)"))
    metric = days[0][1].metric
    return DailyResult(metric, days, skipped)
