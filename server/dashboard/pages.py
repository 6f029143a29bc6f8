"""The pages' contents: each function reads the source and the cached decodes and returns a
:class:`~veil.server.dashboard.model.Page` (facts, tables, the charts drawn from them).

Overview, metric and discovery pages are here; privacy, planner and operations pages in
:mod:`veil.server.dashboard.admin_pages`. None of them renders anything: the views turn a
page into HTML, JSON or CSV.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from veil.server.dashboard.decodes import Decodes, digest
from veil.server.dashboard.model import Chart, Page, Table, share_columns
from veil.server.dashboard.sources import TooFewReports
from veil.server.dashboard.state import PageState
from veil.shared.errors import VeilError
from veil.shared.registry import Metric

if TYPE_CHECKING:
    from veil.server.analysis.results import DecodeResult

#: what the decoders' ``chart`` says a result is about: a mean on its range, or shares
MEAN_CHART = "range"
OTHER = "other (ranks past K)"
UNLISTED = "not listed (no candidate)"
TOO_FEW = "too few reports"


def decodable(metric: Metric, decodes: Decodes) -> str:
    """Why ``metric`` cannot be decoded from its counts, or "" when it can."""
    if metric.params.reads_raw_reports:
        return (f"a discovery channel: its strings are on the discovery page of "
                f"{metric.of or metric.name}")
    if metric.params.as_rappor() is metric.params and not decodes.candidates.of(metric.name):
        return ("no candidate strings: put them in <candidates dir>/"
                f"{metric.name}.txt, or give the metric a discovery channel")
    return ""


def try_decode(decodes: Decodes, metric: Metric, start: str, end: str,
               ) -> tuple[DecodeResult | None, str]:
    """The metric's decode over ``start``..``end`` and "", or None and why not."""
    why = decodable(metric, decodes)
    if why:
        return None, why
    try:
        return decodes.decode(metric.name, start, end), ""
    except TooFewReports as exc:
        return None, f"{TOO_FEW}: {exc.message}"
    except VeilError as exc:
        return None, str(exc)


def _short(why: str) -> str:
    """The overview's one-word decode status for a reason ``why`` (empty: decoded)."""
    if not why:
        return "decoded"
    for start, status in (("a discovery channel", "discovery channel"),
                          ("no candidate", "no candidates"), (TOO_FEW, TOO_FEW)):
        if why.startswith(start):
            return status
    return why


def overview(decodes: Decodes, state: PageState) -> Page:
    """One row per metric: mechanism, privacy, reports (today, 7 days, all, in the range)
    with a sparkline of daily reports, min_reports reached or not, the decode's
    detections and the share it leaves unexplained."""
    source = decodes.source
    registry = source.registry()
    everything = source.daily_reports(None, None)
    today = dt.date.fromisoformat(state.end)
    week = [(today - dt.timedelta(days=offset)).isoformat() for offset in range(7)]
    rows, daily = [], []
    for name, metric in registry.items():
        by_day = everything.get(name, {})
        in_range = sum(n for day, n in by_day.items() if state.start <= day <= state.end)
        result, why = try_decode(decodes, metric, state.start, state.end)
        summary = result.summary if result is not None else {}
        rows.append({
            "metric": name, "kind": metric.kind, "mechanism": metric.params.mechanism_name,
            "epsilon_1": metric.params.epsilon_1, "epsilon_inf": metric.params.epsilon_inf,
            "reports_today": by_day.get(state.end, 0),
            "reports_7d": sum(by_day.get(day, 0) for day in week),
            "reports_all": sum(by_day.values()), "reports_range": in_range,
            "min_reports": metric.min_reports,
            "needs": max(metric.min_reports - in_range, 0),
            "detected": None if result is None else summary.get("detected", len(result.rows)),
            "unexplained": summary.get("missing_proportion"),
            "decode": _short(why),
            "note": metric.note,
        })
        daily += [{"metric": name, "day": day, "reports": by_day.get(day, 0)}
                  for day in state.days]
    table = Table("metrics", "Metrics", {
        "metric": "Metric", "mechanism": "Mechanism",
        "epsilon_1": "ε report", "epsilon_inf": "ε value",
        "reports_today": "Today", "reports_7d": "7 days", "reports_all": "All",
        "reports_range": "In range", "min_reports": "Minimum", "needs": "Needs",
        "detected": "Detected", "unexplained": "Unexplained", "decode": "Decode",
    }, rows, caption="Reports per metric (today, the last 7 days, all, the range shown); a "
                     "decode needs the metric's minimum (min_reports) in the range. ε report: "
                     "privacy cost of one report; ε value: of every report of one value.")
    sparks = [Chart(f"spark-{row['metric']}", f"Daily reports of {row['metric']}", "daily",
                    "spark", "day", "reports", "reports", where={"metric": row["metric"]})
              for row in rows]
    page = Page("overview", "Overview", [table, Table("daily", "Daily reports", {
        "metric": "Metric", "day": "Day", "reports": "Reports"}, daily)], sparks)
    page.facts = {"Source": source.name, "Metrics": len(rows), "Range": f"{state.start} to {state.end}",
                  "Reports in range": sum(row["reports_range"] for row in rows)}
    return page


def metric_page(decodes: Decodes, name: str, state: PageState) -> Page:
    """A metric's top estimates with 95% intervals over the range, and the top ``k`` day
    by day with their bands, "other" and the share nobody listed."""
    registry = decodes.source.registry()
    metric = registry[name]
    page = Page("metric", f"Metric {name}", subject=name)
    page.facts = {"Kind": metric.kind, "Mechanism": metric.params.mechanism_name,
                  "ε one report": metric.params.epsilon_1, "ε one value": metric.params.epsilon_inf,
                  "min_reports": metric.min_reports}
    if metric.description:
        page.facts["Description"] = metric.description
    if registry.channel(name) is not None:
        page.related["Strings found by discovery"] = ("discovery", name)
    if metric.of:
        page.related[f"Discovery for {metric.of}"] = ("discovery", metric.of)
    result, why = try_decode(decodes, metric, state.start, state.end)
    if result is None:
        page.notes.append(f"No estimates for {state.start} to {state.end}: {why}.")
        return page
    if hasattr(result, "conditional_rows"):
        page.related["Heatmap, conditional view and independence test"] = ("joint", name)
    summary = result.summary
    mean = result.chart == MEAN_CHART
    page.facts.update({
        "Reports (N)": summary.get("reports"),
        "Days with reports": summary.get("days_with_reports"),
        "Candidates": summary.get("candidates"),
        "Detected": summary.get("detected"),
        "Detection limit (share)": summary.get("min_detectable_proportion"),
        "Not listed (share)": summary.get("missing_proportion"),
    })
    page.facts = {key: value for key, value in page.facts.items() if value is not None}
    page.notes += list(summary.get("notes", []))
    columns = ({"value": "Statistic", "estimate": "Estimate", "std_error": "Std. error",
                "low_95": "95% low", "high_95": "95% high"} if mean
               else {**share_columns([("value", "Value")]), "p_value": "p-value"})
    estimates = Table("estimates", "Estimates with 95% intervals", columns, result.rows,
                      caption=result.headline)
    y, low, high = ("estimate", "low_95", "high_95") if mean else (
        "proportion", "prop_low_95", "prop_high_95")
    series = _series(decodes, metric, result, state, mean)
    page.tables += [estimates, series]
    if not mean:  # one mean is a number, not a chart: its course over the days is
        page.charts.append(Chart("estimates", f"{name}: estimates, {state.start} to {state.end}",
                                 "estimates", "bars", "value", y, "share", low, high))
    page.charts.append(Chart(
        "series", f"{name}: day by day" + ("" if mean else f" (top {state.k})"), "series",
        "lines", "day", "estimate", "mean" if mean else "share", "low_95", "high_95", "series",
        muted=[OTHER, UNLISTED]))
    return page


def _series(decodes: Decodes, metric: Metric, result: DecodeResult, state: PageState,
            mean: bool) -> Table:
    """Each day's decode: the range's top ``k`` values, the rest as "other", and (strings)
    the share nobody listed, each with its 95% interval. A day decodes with the values the
    range detected as candidates, so a day never searches the whole list again."""
    key = "estimate" if mean else "proportion"
    ranked = sorted(result.rows, key=lambda row: -(row[key] or 0.0))
    top = [str(row["value"]) for row in ranked[:state.k]]
    listed = [str(row["value"]) for row in result.rows]
    listed_digest = digest(listed)
    rows: list[dict[str, Any]] = []
    # only the days that hold reports are read (one listing of the range, not a read a day)
    reported = decodes.source.daily_reports(state.start, state.end).get(metric.name, {})
    skipped = [day for day in state.days if not reported.get(day)]
    for day in sorted(day for day, count in reported.items() if count):

        def day_rows(daily: DecodeResult, day: str = day) -> list[dict[str, Any]]:
            return _day_rows(day, daily, top, mean)

        try:
            document = decodes.counts(metric.name, day, day)
            rows += decodes.derived(metric.name, day, document, listed, listed_digest,
                                    ("series", tuple(top), mean), day_rows)
        except (TooFewReports, VeilError):
            skipped.append(day)
    caption = "Each day decoded on its own." if mean else (
        "Each day decoded on its own, over the values the whole range detected; a value "
        "missing on a day was not detected that day.")
    if skipped:
        caption += (f" Left out: {len(skipped)} day(s) with no reports or fewer than "
                    f"min_reports ({metric.min_reports}).")
    return Table("series", "Day by day", {"day": "Day", "series": "Series",
                                          "estimate": "Estimate", "low_95": "95% low",
                                          "high_95": "95% high"}, rows, caption=caption)


def _day_rows(day: str, daily: DecodeResult, top: list[str], mean: bool) -> list[dict[str, Any]]:
    """One day's series rows: the top values, "other" and the unlisted share."""
    if mean:
        return [{"day": day, "series": str(row["value"]), "estimate": row["estimate"],
                 "low_95": row["low_95"], "high_95": row["high_95"]} for row in daily.rows]
    by_value = {str(row["value"]): row for row in daily.rows}
    rows = [{"day": day, "series": value, "estimate": by_value[value]["proportion"],
             "low_95": by_value[value]["prop_low_95"], "high_95": by_value[value]["prop_high_95"]}
            for value in top if value in by_value]
    rest = [row for value, row in by_value.items() if value not in top]
    if rest:
        share = sum(row["proportion"] for row in rest)
        # the rest's shares summed; their standard errors combined as if independent
        half = 1.959964 * math.sqrt(sum(row["prop_std_error"] ** 2 for row in rest))
        rows.append({"day": day, "series": OTHER, "estimate": share,
                     "low_95": max(share - half, 0.0), "high_95": min(share + half, 1.0)})
    summary = daily.summary
    if summary.get("missing_proportion") is not None:
        rows.append({"day": day, "series": UNLISTED, "estimate": summary["missing_proportion"],
                     "low_95": summary["missing_proportion_low"],
                     "high_95": summary["missing_proportion_high"]})
    return rows


def discovery_page(decodes: Decodes, name: str, state: PageState) -> Page:
    """The strings a string metric's discovery channel found, with estimates and 95%
    intervals, and the prefixes the search kept."""
    registry = decodes.source.registry()
    metric = registry[name]
    channel = registry.channel(name)
    page = Page("discovery", f"Discovery for {name}", subject=name,
                related={f"Metric {name}": ("metric", name)})
    if channel is None:
        page.notes.append(f"{name} has no discovery channel: add a [metrics.{name}.discovery] "
                          "table to the registry to find strings nobody listed.")
        return page
    page.facts = {"Channel": channel.name, "ε per prefix": channel.params.epsilon_inf,
                  "String metric ε one value": metric.params.epsilon_inf}
    try:
        found = decodes.discover(name, state.start, state.end)
    except TooFewReports as exc:
        page.notes.append(f"Nothing to search for {state.start} to {state.end}: {exc.message}.")
        return page
    except VeilError as exc:
        page.notes.append(f"The search could not run: {exc}.")
        return page
    about = found.result.summary.get("discovery", {})
    page.facts.update({"Channel reports": about.get("reports"),
                       "Levels searched": about.get("levels_searched"),
                       "Strings found": about.get("candidates"),
                       "Search seconds": about.get("seconds")})
    page.tables += [
        Table("strings", "Strings found, with 95% intervals",
              {**share_columns([("value", "String")]), "p_value": "p-value"},
              found.result.rows, caption=found.result.headline),
        Table("prefixes", "Prefixes kept by the search",
              {"level": "Level", "prefix": "Prefix", "share": "Share", "ended": "Ended"},
              found.prefix_rows()),
    ]
    page.charts.append(Chart("strings", f"{name}: discovered strings", "strings", "bars",
                             "value", "proportion", "share", "prop_low_95", "prop_high_95"))
    return page

