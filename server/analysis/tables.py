"""The result's tables: the columns every decoder fills, its rows, and the table as CSV
and HTML.

Every decoder builds its rows here (:func:`frequency_rows`, :func:`number_row`), so a
table's keys are always its declared columns: :data:`RESULT_COLUMNS` for every kind,
and for string metrics also google/rappor's ``string`` column (:data:`STRING_COLUMNS`),
so google/rappor's tools still read a string metric's ``results.csv``.
:func:`write_rows` writes a table as CSV, :func:`html_table` as HTML for a notebook.
"""

from __future__ import annotations

import csv
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from veil.server.analysis.stats import (
    one_sided_log10_p_values,
    one_sided_p_values,
    z_quantile,
)
from veil.shared.privacy import format_epsilon

#: results.csv columns, the same for every kind (docs/analysis.md describes each)
RESULT_COLUMNS = (
    "metric",
    "kind",
    "value",
    "estimate",
    "std_error",
    "low_95",
    "high_95",
    "proportion",
    "prop_std_error",
    "prop_low_95",
    "prop_high_95",
    "p_value",
    "log10_p_value",
)
#: google/rappor's results.csv columns: a string metric's table carries them all
RAPPOR_COLUMNS = (
    "string",
    "estimate",
    "std_error",
    "proportion",
    "prop_std_error",
    "prop_low_95",
    "prop_high_95",
)
#: results.csv columns of string metrics: :data:`RESULT_COLUMNS` plus ``string`` (= ``value``)
STRING_COLUMNS = (*RESULT_COLUMNS[:3], "string", *RESULT_COLUMNS[3:])
#: the columns of a table of every string candidate (``all_candidates``): its rank by
#: evidence and whether it was detected, beside :data:`STRING_COLUMNS`
RANKED_COLUMNS = (*STRING_COLUMNS, "rank", "detected")
#: the interval columns as the decoders write them, at the default confidence 0.95; a
#: result decoded at another confidence names them for it (:func:`interval_column`)
INTERVAL_COLUMNS = ("low_95", "high_95", "prop_low_95", "prop_high_95")
#: columns holding text; every other column holds a number
TEXT_COLUMNS = frozenset({"day", "metric", "kind", "value", "string"})
#: rows shown by :meth:`DecodeResult._repr_html_`
HTML_ROWS = 12


def frequency_rows(
    metric: str,
    kind: str,
    labels: Sequence[str],
    shares: np.ndarray,
    std_errors: np.ndarray,
    total: int,
    z: float,
    columns: tuple[str, ...] = RESULT_COLUMNS,
    p_values: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Rows of ``columns``: each share of ``total`` reports as a count and a proportion,
    with its ``z`` interval intersected with [0, 1] (where the true share lies; both ends
    are clipped, so an interval wholly below 0 becomes [0, 0], never empty), and the
    one-sided p-value of "this share is 0" with its base-10 logarithm. ``p_values`` are
    the shares' :func:`~veil.server.analysis.stats.one_sided_p_values` when the caller
    has them already."""
    shares = np.asarray(shares, dtype=float)
    std_errors = np.asarray(std_errors, dtype=float)
    if p_values is None:
        p_values = one_sided_p_values(shares, std_errors)
    log10_p_values = one_sided_log10_p_values(shares, std_errors)
    rows = []
    for label, share, se, p_value, log10_p in zip(
        labels, shares, std_errors, p_values, log10_p_values, strict=True
    ):
        low = min(max(share - z * se, 0.0), 1.0)
        high = max(min(share + z * se, 1.0), 0.0)
        row = {
            "metric": metric,
            "kind": kind,
            "value": str(label),
            "string": str(label),
            "estimate": float(share * total),
            "std_error": float(se * total),
            "low_95": float(low * total),
            "high_95": float(high * total),
            "proportion": float(share),
            "prop_std_error": float(se),
            "prop_low_95": float(low),
            "prop_high_95": float(high),
            "p_value": float(p_value),
            "log10_p_value": float(log10_p),
        }
        rows.append({name: row[name] for name in columns})
    return rows


def confidence_label(confidence: float) -> str:
    """The confidence as interval columns and charts write it: ``95`` for 0.95, ``90`` for
    0.9, ``99.9`` for 0.999."""
    return f"{100 * confidence:.6g}"


def interval_column(name: str, confidence: float) -> str:
    """Column ``name`` of a result decoded at ``confidence``: an interval column of
    :data:`INTERVAL_COLUMNS` named for it (``low_90`` at 0.9, ``low_99_9`` at 0.999), any
    other column as it is."""
    if name not in INTERVAL_COLUMNS:
        return name
    return f"{name[:-len('95')]}{confidence_label(confidence).replace('.', '_')}"


def interval_keys(summary: Mapping[str, Any], share: bool = False) -> tuple[str, str]:
    """The low and high interval columns of a result with ``summary`` (its ``confidence``,
    0.95 when it states none): of the estimate, or of the ``share``."""
    confidence = float(summary.get("confidence") or 0.95)
    prefix = "prop_" if share else ""
    return (interval_column(f"{prefix}low_95", confidence),
            interval_column(f"{prefix}high_95", confidence))


def number_row(
    metric: str, statistic: str, estimate: float, std_error: float, z: float, low: float,
    high: float,
) -> dict[str, Any]:
    """A row of :data:`RESULT_COLUMNS` for ``statistic`` (``mean``) of a number in
    ``[low, high]``: ``estimate`` in the metric's unit with its ``z`` interval clipped to
    ``[low, high]`` (where the true value lies; the estimate itself stays unclipped). The
    share and p-value columns stay empty: a mean is no share of reports, and "the mean
    is ``low``" is no hypothesis anyone asked about (a frequency row's p-value tests "this
    share is 0")."""
    interval_low = min(max(estimate - z * std_error, low), high)
    interval_high = max(min(estimate + z * std_error, high), low)
    return {
        "metric": metric,
        "kind": "number",
        "value": statistic,
        "estimate": float(estimate),
        "std_error": float(std_error),
        "low_95": float(interval_low),
        "high_95": float(interval_high),
        **dict.fromkeys(("proportion", "prop_std_error", "prop_low_95", "prop_high_95",
                         "p_value", "log10_p_value")),
    }


def ranked_table(metric: str, names: Sequence[str], shares: np.ndarray, std_errors: np.ndarray,
                 detected: np.ndarray, total: int, confidence: float) -> list[dict[str, Any]]:
    """Rows of :data:`RANKED_COLUMNS`: every string candidate, ranked by its evidence ``z``
    (its share over its standard error, ``-inf`` without one; highest first, ties in list
    order), with its one-sided p-value, its ``rank`` and whether it was ``detected``."""
    usable = std_errors > 0
    z = np.where(usable, shares / np.where(usable, std_errors, 1.0), -np.inf)
    order = np.argsort(-z, kind="stable")
    rows = frequency_rows(metric, "string", [names[i] for i in order], shares[order],
                          std_errors[order], total, z_quantile(confidence), STRING_COLUMNS)
    for rank, (row, index) in enumerate(zip(rows, order, strict=True), start=1):
        row["rank"], row["detected"] = rank, int(detected[index])
    return rows


def detected_table(metric: str, names: Sequence[str], shares: np.ndarray,
                   std_errors: np.ndarray, detected: np.ndarray, total: int,
                   confidence: float) -> list[dict[str, Any]]:
    """Rows of :data:`STRING_COLUMNS`: the detected string candidates, the largest share
    first (ties in list order), each with its one-sided p-value."""
    found = np.flatnonzero(detected)
    order = found[np.argsort(-shares[found], kind="stable")]
    return frequency_rows(metric, "string", [names[i] for i in order], shares[order],
                          std_errors[order], total, z_quantile(confidence), STRING_COLUMNS)


#: first characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: text that is a plain number: a spreadsheet reads it as that number, never as a formula
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows but never runs: text that begins with ``=``,
    ``+``, ``-``, ``@``, a tab or a carriage return gets a leading apostrophe (OWASP's
    advice against CSV injection), unless it is a plain number; other values as they are.

    Strings come from clients (candidates that were reported, strings that discovery
    rebuilt from reports), so a CSV written for analysts must not carry a formula such as
    ``=HYPERLINK(...)``. The JSON twins and the Python API keep every string unchanged."""
    if isinstance(value, str) and value[:1] in FORMULA_STARTS \
            and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


class AnalystCsv:
    """A CSV writer for tables people open in spreadsheets: every cell through
    :func:`spreadsheet_safe`, and RFC 4180 line ends (CR LF), so that a value holding a
    carriage return or a line feed is quoted and cannot end its row."""

    def __init__(self, handle: Any) -> None:
        self._writer = csv.writer(handle, lineterminator="\r\n")

    def writerow(self, row: Iterable[Any]) -> None:
        """Write one row."""
        self._writer.writerow([spreadsheet_safe(cell) for cell in row])


def write_rows(path: str | Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Rows as CSV with a header row of ``columns`` (floats at full precision, None empty;
    an :class:`AnalystCsv`)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = AnalystCsv(handle)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_value(row[name]) for name in columns])


def format_p_value(p_value: float, log10_p_value: float) -> str:
    """A p-value for people: three digits, or its power of ten where it underflows."""
    if p_value > 0:
        return f"{p_value:.3g}"
    return f"1e{math.floor(log10_p_value):d}" if math.isfinite(log10_p_value) else "0"


def period(start: str | None, end: str | None) -> str:
    """The days counts cover, to follow a number of reports: " on DAY", " from START to
    END", or "" when either is not known."""
    if not (start and end):
        return ""
    return f" on {start}" if start == end else f" from {start} to {end}"


def html_table(title: str, headline: str, summary: dict[str, Any],
               rows: Sequence[dict[str, Any]], extra: Sequence[str] = ()) -> str:
    """A headline paragraph and the first :data:`HTML_ROWS` rows (``extra`` text columns
    first, then value, estimate, standard error, interval, share, p-value; a number's
    empty share and p-value as blanks)."""
    def cell(value: Any) -> str:
        return f"<td>{html.escape(value if isinstance(value, str) else f'{value:.4g}')}</td>"

    reports = summary.get("reports")
    cost = summary.get("privacy", {}).get("epsilon_per_value")
    low_key, high_key = interval_keys(summary)
    level = confidence_label(float(summary.get("confidence") or 0.95))
    head = [*extra, "value", "estimate", "std error", f"{level}% interval", "share", "p-value"]
    body = []
    for row in rows[:HTML_ROWS]:
        interval = f"{row[low_key]:.4g} \u2013 {row[high_key]:.4g}"
        share = "" if row["proportion"] is None else f"{row['proportion']:.2%}"
        p_value = ("" if row["p_value"] is None
                   else format_p_value(row["p_value"], row["log10_p_value"]))
        body.append(
            "<tr>" + "".join(cell(str(row[name])) for name in extra)
            + cell(str(row["value"])) + cell(row["estimate"]) + cell(row["std_error"])
            + cell(interval) + cell(share) + cell(p_value) + "</tr>"
        )
    more = (f"<p>{len(rows) - HTML_ROWS:,} more rows: .to_pandas() has them all.</p>"
            if len(rows) > HTML_ROWS else "")
    facts = ", ".join(part for part in (
        (f"{reports:,} reports{period(summary.get('start'), summary.get('end'))}"
         if isinstance(reports, int) else ""),
        f"\u03b5\u221e = {format_epsilon(cost)} per value" if isinstance(cost, float) else "",
    ) if part)
    return (
        f"<div><p><b>{html.escape(title)}</b>: {html.escape(headline)}"
        f"{' (' + html.escape(facts) + ')' if facts else ''}</p>"
        "<table><thead><tr>" + "".join(f"<th>{html.escape(name)}</th>" for name in head)
        + "</tr></thead><tbody>" + "".join(body) + f"</tbody></table>{more}</div>"
    )


def _csv_value(value: Any) -> Any:
    # a float stays a number (the csv module writes its repr: full precision), so that
    # AnalystCsv never takes "-inf" for text
    return "" if value is None else value
