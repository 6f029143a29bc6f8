"""A decoded result as files in a directory: its table, its summary and its charts.

``results.csv``, ``summary.json`` and ``estimates.png``; with a day-by-day decode also
``by_day.csv`` and ``by_day.png``; with a discovery also ``prefixes.csv`` and
``prefixes.png``. The charts are :mod:`veil.server.analysis.charts`', drawn in a helper
process when the caller gives one (:class:`~veil.server.analysis.charts.ChartWorker`).
"""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.server.analysis.charts import (
    TOP,
    TOP_SERIES,
    plot_days_file,
    plot_estimates,
    plot_prefix_search,
)
from veil.server.analysis.tables import write_rows
from veil.shared.errors import ParameterError

if TYPE_CHECKING:
    from veil.server.analysis.daily import DailyResult
    from veil.server.analysis.discovery import DiscoveryResult
    from veil.server.analysis.results import DecodeResult


def write_outputs(
    result: DecodeResult, out_dir: str | Path, top: int = TOP, charts: Executor | None = None,
    daily: DailyResult | None = None,
) -> dict[str, Path]:
    """Write the files into ``out_dir`` (created if needed); return their paths.

    ``charts`` (a :class:`ChartWorker`'s executor) draws the charts in another process.
    With ``daily`` (a day-by-day decode of the same metric) also ``by_day.csv`` and
    ``by_day.png``."""
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
    paths.update(result.extra_files(out))
    drawings: list[tuple[Any, ...]] = [(plot_estimates, result, paths["chart"], top)]
    if daily is not None:
        paths["by_day"], paths["by_day_chart"] = out / "by_day.csv", out / "by_day.png"
        daily.write_csv(paths["by_day"])
        drawings.append((plot_days_file, daily, paths["by_day_chart"], TOP_SERIES))
    if charts is None:
        for function, *args in drawings:
            function(*args)
    else:
        for future in [charts.submit(*drawing) for drawing in drawings]:
            future.result()
    return paths


def write_discovery(found: DiscoveryResult, out_dir: str | Path, top: int = TOP,
                    ) -> dict[str, Path]:
    """Write what :func:`~veil.server.analysis.api.discover` found into ``out_dir``:
    ``results.csv``, ``summary.json`` and ``estimates.png`` as ``veil decode`` writes them,
    ``prefixes.csv`` (the prefixes kept at each level) and ``prefixes.png``."""
    paths = write_outputs(found.result, out_dir, top)
    out = Path(out_dir)
    paths["prefixes"] = out / "prefixes.csv"
    write_rows(paths["prefixes"], ("level", "prefix", "share", "ended"), found.prefix_rows())
    paths["prefixes_chart"] = out / "prefixes.png"
    plot_prefix_search(found.search.levels_, paths["prefixes_chart"])
    return paths
