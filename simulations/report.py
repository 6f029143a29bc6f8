"""Results directories: a CSV of metrics, PNG plots and a self-contained HTML report.

An experiment hands :func:`write_results` its rows (dicts with the same
keys), its Matplotlib figures and a few paragraphs; the directory then holds
``metrics.csv``, one PNG per figure and ``report.html`` with the images
embedded as base64, so the report can be mailed or archived as one file.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import html
import io
import math
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a tqdm progress bar on a terminal; silently otherwise (pipes, CI)."""
    from tqdm import tqdm

    disable = not sys.stderr.isatty() or bool(os.environ.get("CI"))
    yield from tqdm(items, desc=description, total=total, disable=disable, leave=False)


def new_figure(width: float = 6.4, height: float = 4.0) -> Any:
    """A Matplotlib figure drawn with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


@dataclasses.dataclass
class Results:
    """What one experiment produced."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    figures: dict[str, Any]
    notes: list[str]
    elapsed: float = 0.0


def _cell(value: Any) -> str:
    """A table cell for people: floats to four digits, whole numbers with thousands
    separators, an undefined figure (NaN) as "n/a"."""
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _heading(key: str) -> str:
    """A column name that may break after its underscores (``false_pos``), so a wide table
    keeps its columns narrow."""
    return html.escape(key).replace("_", "_<wbr>")


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows (dicts sharing keys) as a CSV file with a header."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def write_results(results: Results, out: str | Path) -> Path:
    """Write ``metrics.csv``, ``<figure>.png`` and ``report.html`` into ``out``; return it."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    write_csv(directory / "metrics.csv", results.rows)
    images = []
    for name, figure in results.figures.items():
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        (directory / f"{name}.png").write_bytes(buffer.getvalue())
        images.append((name, base64.b64encode(buffer.getvalue()).decode("ascii")))
    header = list(results.rows[0]) if results.rows else []
    table = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row[key]))}</td>" for key in header) + "</tr>"
        for row in results.rows
    )
    title = html.escape(results.title)
    body = [
        f"<h1>{title}</h1>",
        *(f"<p>{html.escape(note)}</p>" for note in results.notes),
        *(
            f'<figure><img alt="{title}: figure {name}" src="data:image/png;base64,{data}">'
            f"<figcaption>Figure {number}: {title} (also written as "
            f"{html.escape(name)}.png)</figcaption></figure>"
            for number, (name, data) in enumerate(images, start=1)
        ),
        f"<h2>Metrics</h2><p>One row per case, as in metrics.csv ({len(results.rows):,} "
        "rows; n/a: undefined for the case).</p><div class='wide'><table><thead><tr>"
        + "".join(f"<th>{_heading(key)}</th>" for key in header)
        + f"</tr></thead><tbody>{table}</tbody></table></div>",
        f"<p>Elapsed: {results.elapsed:.1f} s.</p>",
    ]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>"
        "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        ".wide{overflow-x:auto;max-width:100%}"
        "table{border-collapse:collapse;font-size:85%}td,th{border:1px solid #ccc;"
        "padding:2px 5px;text-align:right}th{vertical-align:bottom;max-width:7em}"
        "figure{margin:1em 0}figcaption{font-size:90%;color:#444;margin-top:.3em}"
        "img{max-width:100%}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
    (directory / "report.html").write_text(page, encoding="utf-8")
    return directory
