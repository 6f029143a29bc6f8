"""Write a decoded result to a directory: ``results.csv``, ``summary.json``, ``estimates.png``."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from types import TracebackType

from veil.server.analysis.results import DecodeResult
from veil.shared.errors import ParameterError

#: how many rows the chart shows at most
TOP = 30


class ChartWorker:
    """A helper process that loads matplotlib while the caller decodes, then draws.

    Loading matplotlib takes longer than decoding a small metric (about 0.4 s against
    0.3 s), so ``veil decode`` starts this first and the two overlap on a second core::

        with ChartWorker() as charts:
            result = decode_counts(...)
            write_outputs(result, out, charts=charts)

    Leaving the block early (an error while decoding) does not wait for the helper.
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
            self._pool.shutdown(wait=kind is None, cancel_futures=True)


def _load_matplotlib() -> None:
    from matplotlib import figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401


def write_outputs(
    result: DecodeResult, out_dir: str | Path, top: int = TOP, charts: Executor | None = None
) -> dict[str, Path]:
    """Write the three files into ``out_dir`` (created if needed); return their paths.

    ``charts`` (a :class:`ChartWorker`'s executor) draws the chart in another process."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParameterError("out", f"cannot create output directory {out}: {exc.strerror}") from None
    paths = {
        "results": out / "results.csv",
        "summary": out / "summary.json",
        "chart": out / "estimates.png",
    }
    result.write_csv(paths["results"])
    result.write_summary(paths["summary"])
    if charts is None:
        plot_estimates(result, paths["chart"], top)
    else:
        charts.submit(plot_estimates, result, paths["chart"], top).result()
    return paths


def _title(result: DecodeResult) -> str:
    summary = result.summary
    name = summary.get("metric") or "decoded"
    title = (
        f"{name}: {summary['reports']:,} reports, "
        f"\u03b5\u2081 = {summary['epsilon_1']:.3g}, \u03b5\u221e = {summary['epsilon_inf']:.3g}"
    )
    if "detected" in summary:  # a decoder that selects among candidates
        title += (
            f"\n{summary['detected']} of {summary['candidates']:,} candidates detected "
            f"({summary['correction']}, \u03b1 = {summary['alpha']:g}), "
            f"detectable from \u2248 {summary['min_detectable_proportion']:.2%}"
        )
    return title


def plot_estimates(result: DecodeResult, path: str | Path, top: int = TOP) -> None:
    """A chart of the estimates with their 95% intervals (top ``top`` rows)."""
    # the Agg canvas directly: pyplot (and its backend machinery) would add a fifth of a second
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result.rows[:top]
    if "proportion" not in result.columns:  # one statistic with its interval
        fig = Figure(figsize=(7, 2.2))
        ax = fig.subplots()
        row = rows[0]
        low, high = result.summary["low"], result.summary["high"]
        ax.axvspan(low, high, color="tab:gray", alpha=0.12, label="[low, high]")
        ax.hlines(0, row["low_95"], row["high_95"], color="tab:blue", linewidth=3)
        ax.plot([row["estimate"]], [0], "o", color="tab:blue")
        ax.set_yticks([0], ["mean"])
        margin = 0.05 * (high - low)
        ax.set_xlim(min(low, row["estimate"]) - margin, max(high, row["estimate"]) + margin)
        ax.set_xlabel("value (95% interval)")
    else:
        height = max(2.0, 0.32 * len(rows) + 1.3)
        fig = Figure(figsize=(9, height))
        ax = fig.subplots()
        if rows:
            labels = [_short(str(row["string"])) for row in rows]
            positions = list(range(len(rows)))[::-1]
            values = [row["proportion"] for row in rows]
            ax.barh(positions, values, color="tab:blue", alpha=0.35)
            ax.hlines(positions, [row["prop_low_95"] for row in rows],
                      [row["prop_high_95"] for row in rows], color="tab:blue")
            ax.plot(values, positions, "o", color="tab:blue")
            ax.set_yticks(positions, labels)
            # unbiased estimates may fall below 0 at small N: keep their dots in view
            ax.set_xlim(left=min(0.0, 1.1 * min(values)))
            if min(values) < 0:
                ax.axvline(0, color="k", linewidth=0.8)
        else:
            ax.text(0.5, 0.5, "no string detected", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
        ax.set_xlabel("share of reports (95% interval)")
        ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(result), fontsize=10)
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "\u2026"
