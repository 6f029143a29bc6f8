"""Charts of decoded results: one decode, a day-by-day decode, a prefix search.

The drawing functions take a Matplotlib ``Axes`` (or make a figure with pyplot, for
notebooks) and return it; files are drawn on a bare Agg canvas, without pyplot.
:class:`ChartWorker` loads matplotlib in a helper process while the caller decodes.
matplotlib loads at the first chart.

The charts read a result through the few attributes they draw (:class:`Charted`,
:class:`ChartedDays`, :class:`SearchLevel`), so the result classes can offer ``plot()``
without this module importing them.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from veil.server.analysis.tables import confidence_label, interval_keys, period
from veil.shared.privacy import format_epsilon

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: how a result is drawn: ``range`` one statistic on its metric's [low, high]; ``share``
#: the first row's share alone (a yes-share); ``shares`` a bar per row
Chart = Literal["range", "share", "shares"]


class Charted(Protocol):
    """What a chart of one decode reads (a :class:`~veil.server.analysis.results.DecodeResult`)."""

    @property
    def chart(self) -> Chart: ...
    @property
    def rows(self) -> list[dict[str, Any]]: ...
    @property
    def summary(self) -> dict[str, Any]: ...


class ChartedDays(Protocol):
    """What the day-by-day chart reads (a :class:`~veil.server.analysis.daily.DailyResult`)."""

    @property
    def metric(self) -> str: ...
    @property
    def days(self) -> Sequence[tuple[str, Charted]]: ...
    @property
    def skipped(self) -> Mapping[str, str]: ...


class SearchLevel(Protocol):
    """What the prefix-search chart reads of one level
    (a :class:`~veil.server.analysis.discovery.Level`)."""

    @property
    def level(self) -> int: ...
    @property
    def threshold(self) -> float: ...
    @property
    def kept(self) -> tuple[tuple[bytes, float], ...]: ...
    @property
    def ended(self) -> tuple[tuple[bytes, float], ...]: ...


#: how many rows the chart shows at most
TOP = 30
#: how many values the day-by-day chart follows at most (the most common over the days)
TOP_SERIES = 5
#: the colour of estimates, and of the share no listed value accounts for
ESTIMATE_COLOUR = "tab:blue"
MISSING_COLOUR = "tab:gray"
#: the saved charts' resolution (drawn at it from the start: text measured for the layout
#: is then not measured again at another resolution when the file is written)
DPI = 110


class ChartWorker:
    """A helper process that loads matplotlib while the caller decodes, then draws.

    Loading matplotlib takes about as long as importing SciPy and decoding a small metric
    (docs/analysis.md, Performance), so ``veil decode`` starts this first and
    the two overlap on a second core::

        with ChartWorker() as charts:
            result = decode_counts(...)
            write_outputs(result, out, charts=charts)

    Leaving the block early (an error while decoding) cancels the charts not yet drawn and
    waits for the helper to stop (with the chart being drawn, if any): a pool left
    running at exit can print a traceback from its own exit hook (a wake-up pipe already
    closed) after the command's one-line error.
    """

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        # fork copies this process as it is, so the helper starts in a millisecond; a
        # process with threads must not fork, and spawning a fresh interpreter costs
        # what it would save: then the caller draws the chart itself
        if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("fork"),
                initializer=_load_matplotlib,
            )
            self._pool.submit(int)  # start the process now, not at the first chart

    def __enter__(self) -> Executor | None:
        return self._pool

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _load_matplotlib() -> None:
    from matplotlib import figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401


def _title(result: Charted) -> str:
    summary = result.summary
    name = summary.get("metric") or "decoded"
    title = (
        f"{name}: {summary['reports']:,} report{'s' * (summary['reports'] != 1)}"
        f"{period(summary.get('start'), summary.get('end'))}"
        "\nprivacy cost "
        f"\u03b5\u2081 = {format_epsilon(summary['epsilon_1'])} per report, "
        f"\u03b5\u221e = {format_epsilon(summary['epsilon_inf'])} per value"
    )
    if "detected" in summary:  # a decoder that selects among candidates
        title += (
            f"\n{summary['detected']} of {summary['candidates']:,} candidates detected "
            f"({summary['correction']}, \u03b1 = {summary['alpha']:g}), "
            f"detectable from \u2248 {summary['min_detectable_proportion']:.2%}"
        )
    return title


def _figure(
    width: float, height: float, layout: Literal["constrained"] | None = "constrained",
) -> Figure:
    """A figure on a bare Agg canvas (no pyplot: it would add a fifth of a second)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(figure)
    return figure


def _fit_margins(figure: Figure, ax: Axes) -> None:
    """Give a one-axes figure the margins its title, axis labels and tick labels need
    (texts inside the axes, such as the shares written beside bars, must fit there).

    It measures those few texts once, where the constrained layout measures every text
    of the chart twice (the time it saves: docs/analysis.md, Performance).
    """
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    points = figure.dpi / 72.0
    border, tick = 6 * points, 8 * points  # the edge's gap; tick length plus its pad

    def extent(text: Any) -> tuple[float, float]:
        if not text.get_visible() or not text.get_text():
            return 0.0, 0.0
        box = text.get_window_extent(renderer)
        return box.width, box.height

    tick_font = ax.xaxis.get_major_ticks()[0].label1.get_fontproperties()
    tick_width, tick_height, _ = renderer.get_text_width_height_descent("100%", tick_font, False)
    left = max((extent(label)[0] for label in ax.get_yticklabels()), default=0.0)
    left += tick + extent(ax.yaxis.label)[0] + (4 * points if ax.get_ylabel() else 0.0)
    bottom = tick + tick_height + extent(ax.xaxis.label)[1] + 4 * points
    top = extent(ax.title)[1] + 6 * points
    width, height = figure.bbox.width, figure.bbox.height
    figure.subplots_adjust(
        left=(left + border) / width, right=1 - (tick_width / 2 + border) / width,
        bottom=(bottom + border) / height, top=1 - (top + border) / height,
    )


def _axes(ax: Axes | None, width: float, height: float) -> Axes:
    """``ax``, or the axes of a new pyplot figure (shown by notebooks)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, new = plt.subplots(figsize=(width, height), layout="constrained")
    return new


def chart_size(result: Charted, top: int = TOP) -> tuple[float, float]:
    """Width and height in inches that fit ``result``'s chart."""
    if result.chart != "shares":
        return 7.5, 2.3
    bars = min(len(result.rows), top) + (result.summary.get("missing_proportion") is not None)
    return 9.0, max(2.6, 0.34 * bars + 1.6)


def plot_result(result: Charted, ax: Axes | None = None, top: int = TOP) -> Axes:
    """Draw ``result`` on ``ax`` (a new figure when None) and return the axes: a number's
    mean and interval on its range, a boolean's share answering true, or a bar per value
    (the first ``top``) with the share no listed value accounts for."""
    ax = _axes(ax, *chart_size(result, top))
    if result.chart == "range":
        _draw_range(ax, result)
    elif result.chart == "share":
        _draw_share(ax, result)
    else:
        _draw_shares(ax, result, top)
    ax.set_title(_title(result), fontsize=9)
    return ax


def plot_estimates(result: Charted, path: str | Path, top: int = TOP) -> None:
    """Save :func:`plot_result`'s chart of ``result`` as a PNG at ``path``."""
    shares = result.chart == "shares"  # the long chart; the others are a few texts
    figure = _figure(*chart_size(result, top), layout=None if shares else "constrained")
    ax = plot_result(result, figure.subplots(), top)
    if shares:
        _fit_margins(figure, ax)
    figure.savefig(path)


def _level(summary: Mapping[str, Any]) -> str:
    """The confidence of a result's intervals, as its charts write it: ``95%``."""
    return f"{confidence_label(float(summary.get('confidence') or 0.95))}%"


def _whole_numbers(axis: Any) -> None:
    """Ticks of a Matplotlib axis of levels or counts on whole numbers only (no level 2.5)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _percent_axis(axis: Any) -> None:
    """Label a Matplotlib axis (``ax.xaxis`` or ``ax.yaxis``) of shares as percentages."""
    from matplotlib.ticker import PercentFormatter

    axis.set_major_formatter(PercentFormatter(1.0, decimals=None))


def _draw_range(ax: Axes, result: Charted) -> None:
    """The mean's interval as a band on a track from ``low`` to ``high``, the estimate
    as a tick, each labelled with its value."""
    row, summary = result.rows[0], result.summary
    low, high = summary["low"], summary["high"]
    low_key, high_key = interval_keys(summary)
    level = _level(summary)
    estimate, lower, upper = row["estimate"], row[low_key], row[high_key]
    ax.hlines(0, low, high, color="0.85", linewidth=14)
    ax.hlines(0, lower, upper, color=ESTIMATE_COLOUR, linewidth=14, alpha=0.6)
    ax.plot([estimate], [0], marker="|", markersize=26, markeredgewidth=3, color="navy")
    ax.annotate(f"mean {estimate:.4g}  ({level} interval {lower:.4g} to {upper:.4g})",
                (estimate, 0), xytext=(0, 16), textcoords="offset points", ha="center",
                fontsize=9)
    margin = 0.04 * (high - low)
    ax.set_xlim(min(low, estimate) - margin, max(high, estimate) + margin)
    ax.set_ylim(-1, 1.4)
    ax.set_yticks([])
    name = summary.get("metric") or "value"
    unit = f" ({summary['description']})" if summary.get("description") else ""
    ax.set_xlabel(f"{name}{unit}: the mean (tick) and its {level} interval (band) on the "
                  f"metric's range, {low:g} to {high:g} (grey)")


def _draw_share(ax: Axes, result: Charted) -> None:
    """The first row's share (a boolean's true answers) as one bar on [0, 1] with its
    interval: the other answer's share is the rest of the bar."""
    row = result.rows[0]
    low_key, high_key = interval_keys(result.summary, share=True)
    level = _level(result.summary)
    share, lower, upper = row["proportion"], row[low_key], row[high_key]
    ax.barh([0], [1.0], color="0.9", height=0.5)
    ax.barh([0], [share], color=ESTIMATE_COLOUR, alpha=0.6, height=0.5)
    # the unbiased share may lie outside its interval (clipped to [0, 1]) at small N
    ax.hlines(0, lower, upper, color="navy")
    ax.plot([lower, upper], [0, 0], marker="|", markersize=14, color="navy", linestyle="none")
    ax.plot([share], [0], marker="o", color="navy")
    ax.annotate(f"{share:.1%} {row['value']}  ({level} interval {lower:.1%} to {upper:.1%})",
                (share, 0), xytext=(0, 22), textcoords="offset points", ha="center", fontsize=9)
    ax.set_xlim(min(0.0, share) - 0.02, max(1.0, share) + 0.02)
    ax.set_ylim(-0.6, 1.0)
    ax.set_yticks([])
    _percent_axis(ax.xaxis)
    ax.set_xlabel(f"share of reports that are {row['value']} (bar), with its {level} interval")


def _draw_shares(ax: Axes, result: Charted, top: int) -> None:
    """A bar per value (the first ``top`` rows) with its interval and share written
    beside it, and below them the share of reports no row accounts for, when known."""
    rows = result.rows[:top]
    labels = [_short(str(row["value"])) for row in rows]
    values = [row["proportion"] for row in rows]
    low_key, high_key = interval_keys(result.summary, share=True)
    lows = [row[low_key] for row in rows]
    highs = [row[high_key] for row in rows]
    colours = [ESTIMATE_COLOUR] * len(rows)
    missing = result.summary.get("missing_proportion")
    if missing is not None:
        # the unbiased estimate with its interval within [0, 1] (the summary's)
        labels.append("not in the table\n(unlisted or undetected)")
        values.append(missing)
        lows.append(result.summary["missing_proportion_low"])
        highs.append(result.summary["missing_proportion_high"])
        colours.append(MISSING_COLOUR)
    if not values:
        ax.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_yticks([])
        return
    positions = list(range(len(values)))[::-1]
    ax.barh(positions, values, color=colours, alpha=0.45)
    ax.hlines(positions, lows, highs, color=colours)
    ax.scatter(values, positions, color=colours, zorder=3, s=14)
    for position, value, high in zip(positions, values, highs, strict=True):
        ax.annotate(f"{value:.1%}", (max(value, high), position), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(positions, labels)
    # unbiased estimates may fall below 0 at small N: keep their dots in view
    ax.set_xlim(min(0.0, 1.1 * min(values)), max(highs) * 1.12 + 0.01)
    if min(values) < 0:
        ax.axvline(0, color="k", linewidth=0.8)
    _percent_axis(ax.xaxis)
    ax.set_xlabel(f"share of reports (bar), with its {_level(result.summary)} interval (line)")
    ax.grid(axis="x", alpha=0.3)
    if not rows:
        ax.text(0.5, 0.96, "no string detected", ha="center", va="top",
                transform=ax.transAxes)


def _series(daily: ChartedDays, top: int) -> tuple[list[str], str]:
    """The values to draw over the days, and the column to draw for them."""
    first = daily.days[0][1]
    if first.chart == "range":
        return [str(first.rows[0]["value"])], "estimate"
    if first.chart == "share":
        return [str(first.rows[0]["value"])], "proportion"
    totals: dict[str, float] = {}
    for _, result in daily.days:
        for row in result.rows:
            totals[row["value"]] = totals.get(row["value"], 0.0) + row["proportion"]
    ranked = sorted(totals, key=lambda value: -totals[value])
    return ranked[:top], "proportion"


def plot_days(daily: ChartedDays, ax: Axes | None = None, top: int = TOP_SERIES) -> Axes:
    """Draw each day's estimate with its interval band, one line per value (the ``top`` most
    common over the days for strings and categories), on ``ax`` (a new figure when None);
    return the axes."""
    import numpy as np
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, DayLocator

    ax = _axes(ax, 9.0, 4.2)
    values, column = _series(daily, top)
    first_summary = daily.days[0][1].summary
    low_column, high_column = interval_keys(first_summary, share=column != "estimate")
    for value in values:
        points = [(day, row) for day, result in daily.days
                  for row in result.rows if row["value"] == value]
        days = np.array([day for day, _ in points], dtype="datetime64[D]")
        estimates = [row[column] for _, row in points]
        lows = [row[low_column] for _, row in points]
        highs = [row[high_column] for _, row in points]
        line = ax.plot(days, estimates, marker="o", markersize=4, label=_short(value, 30))[0]
        ax.fill_between(days, lows, highs, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.vlines(days, lows, highs, color=line.get_color(), alpha=0.5, linewidth=1)
    first_day, last_day = np.array([daily.days[0][0], daily.days[-1][0]], dtype="datetime64[D]")
    span = int((last_day - first_day) // np.timedelta64(1, "D"))
    # whole days only: an automatic locator puts hours between days a few days apart
    locator = (DayLocator(interval=1 + span // 8) if span <= 60  # type: ignore[no-untyped-call]
               else AutoDateLocator(maxticks=8))  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    if span == 0:  # a range of one day: give the date axis a width
        ax.set_xlim(first_day - 1, first_day + 1)
    first = daily.days[0][1]
    name = daily.metric or "value"
    if column == "estimate":
        unit = f" ({first.summary['description']})" if first.summary.get("description") else ""
        ax.set_ylabel(f"mean {name}{unit}")
    else:
        _percent_axis(ax.yaxis)
        ax.set_ylabel("share of the day's reports" if first.chart == "shares"
                      else f"share of reports that are {values[0]}")
    ax.set_xlabel(f"day (UTC); each day decoded on its own, {_level(first_summary)} band")
    ax.grid(alpha=0.3)
    ax.set_title(f"{name}: {len(daily.days)} day(s) with reports"
                 + (f", {len(daily.skipped)} left out for too few reports" if daily.skipped
                    else ""), fontsize=9)
    if column == "proportion" and first.chart == "shares":
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  title="most common")
    return ax


def plot_days_file(daily: ChartedDays, path: str | Path, top: int = TOP_SERIES) -> None:
    """Save :func:`plot_days`'s chart of ``daily`` as a PNG at ``path``."""
    figure = _figure(9.0, 4.2)
    plot_days(daily, figure.subplots(), top)
    figure.savefig(path)


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "\u2026"


def draw_prefix_search(ax: Axes, levels: Sequence[SearchLevel]) -> None:
    """The prefixes each level of a search kept, and the strings that ended there."""
    x = [level.level for level in levels]
    ax.plot(x, [len(level.kept) for level in levels], "o-", ms=3, label="prefixes kept")
    ax.plot(x, [len(level.ended) for level in levels], "s-", ms=3, label="strings ended")
    ax.set(xlabel="level", ylabel="count", title="the prefix search")
    _whole_numbers(ax.xaxis)
    _whole_numbers(ax.yaxis)
    ax.legend(fontsize=8)


def plot_prefix_search(levels: Sequence[SearchLevel], path: str | Path) -> None:
    """Save the search's ``levels`` as a PNG at ``path``: the prefixes kept level by level
    (:func:`draw_prefix_search`), and the share a prefix had to pass where other prefixes'
    values add no spread (the reports' noise alone; common segments, and prefixes the next
    level confirms, have their own cut)."""
    figure = _figure(8.0, 3.4)
    counts, threshold = figure.subplots(1, 2)
    draw_prefix_search(counts, levels)
    threshold.plot([level.level for level in levels], [level.threshold for level in levels],
                   "o-", ms=3, color=ESTIMATE_COLOUR)
    threshold.set(xlabel="level", title="share a prefix had to pass (the reports' noise)")
    _whole_numbers(threshold.xaxis)
    _percent_axis(threshold.yaxis)
    for axis in (counts, threshold):
        axis.title.set_fontsize(9)
    figure.savefig(path)
