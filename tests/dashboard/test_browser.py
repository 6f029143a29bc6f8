"""The dashboard in a real browser (Debian's headless chromium through Playwright), against
``veil dashboard --server`` on a collector filled by ``veil populate``.

Every page: no console error, no request to any host but the dashboard's, every chart
drawn with as many marks as its JSON twin's table has rows and the same values, every
estimate with its interval, no data without the token, and the URL's state reproducing
the page. A screenshot of each page goes to ``$VEIL_DASHBOARD_SCREENSHOTS`` when it is set
(docs/figures/dashboard holds the committed ones), else to the test's directory.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from tests.dashboard.conftest import DashboardProcess

CHROMIUM = os.environ.get("VEIL_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: each page of the filled collector, by the name of its screenshot
PAGES = {
    "overview": "/",
    "metric-string": "/metric/homepage",
    "metric-category": "/metric/browser",
    "metric-boolean": "/metric/dark_mode",
    "metric-number": "/metric/load_seconds",
    "joint": "/joint/browser_dark",
    "discovery": "/discovery/homepage",
    "privacy": "/privacy",
    "planner": "/planner?kind=string&k=128&h=2&m=64&p=0.5&q=0.75&f=0.5&values=1000&reports=1000000",
    "operations": "/operations",
}
#: columns of an estimate and of its 95% interval, in the twins
INTERVALS = {"proportion": ("prop_low_95", "prop_high_95"), "estimate": ("low_95", "high_95")}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium; skipped without it (failed under ``$CI``: CI installs it)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the browser tests must run, but there is no chromium "
                        f"at {CHROMIUM} (.ci/chromium installs it)", pytrace=False)
        pytest.skip("no chromium: apt-get install chromium (or bash .ci/chromium as root)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


class Visit:
    """A browser page that records console errors and every URL it requests."""

    def __init__(self, context: Any) -> None:
        self.page = context.new_page()
        self.errors: list[str] = []
        self.requested: list[str] = []
        self.page.on("console", lambda message: self.errors.append(message.text)
                     if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requested.append(request.url))

    def open(self, url: str) -> Any:
        self.page.goto(url)
        self.page.wait_for_load_state("networkidle")
        return self.page


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("VEIL_DASHBOARD_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def twin(dashboard: DashboardProcess, token: str, path: str) -> dict[str, Any]:
    joined = "&" if "?" in path else "?"
    answer = requests.get(f"{dashboard.url}{path}{joined}format=json", timeout=60,
                          headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def same(shown: Any, stated: Any) -> bool:
    if shown is None or stated is None:
        return shown is stated
    return math.isclose(float(shown), float(stated), rel_tol=1e-12, abs_tol=1e-15)


def check_charts(page: Any, document: dict[str, Any]) -> int:
    """Every chart of the page drew one mark per row of its twin's table, with the same
    estimate and interval; returns the marks checked."""
    drawn = page.eval_on_selector_all(
        "figure.chart", "figures => figures.map(f => ({id: f.id, error: f.getAttribute('data-error'),"
        " marks: Number(f.getAttribute('data-drawn')), data: f.veilData}))")
    charts = {chart["id"]: chart for chart in document["charts"]}
    tables = {table["name"]: table for table in document["tables"]}
    assert len(drawn) == len(charts), (list(charts), [figure["id"] for figure in drawn])
    marks = 0
    for figure in drawn:
        chart = charts[figure["id"].removeprefix("chart-")]
        assert figure["error"] is None, figure["error"]
        rows = [row for row in tables[chart["table"]]["rows"]
                if all(row[key] == value for key, value in chart.get("where", {}).items())]
        assert figure["marks"] == len(rows) > 0, (chart["id"], figure["marks"], len(rows))
        series = {entry["name"]: entry for entry in figure["data"]["series"]}
        xs = figure["data"]["x"]
        for row in rows:
            entry = series[str(row[chart["series"]]) if "series" in chart else chart["y_label"]]
            if chart["type"] == "bars":
                index = xs.index(str(row[chart["x"]]))
            else:
                index = [str(x) for x in xs].index(str(_seconds(row[chart["x"]])))
            assert same(entry["y"][index], row[chart["y"]]), (chart["id"], row)
            for end in ("low", "high"):
                if end in chart:
                    assert same(entry[end][index], row[chart[end]]), (chart["id"], end, row)
            marks += 1
    for heatmap in page.eval_on_selector_all(
            "table[data-heatmap]", "maps => maps.map(m => ({table: m.dataset.heatmap, values:"
            " [...m.querySelectorAll('td.heat')].map(td => Number(td.dataset.value))}))"):
        rows = tables[heatmap["table"]]["rows"]
        assert len(heatmap["values"]) == len(rows) > 0
        assert all(same(value, row["proportion"])
                   for value, row in zip(sorted(heatmap["values"]),
                                         sorted(rows, key=lambda row: row["proportion"]),
                                         strict=True))
        marks += len(rows)
    return marks


def _seconds(day: str) -> int:
    import datetime as dt

    return int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp())


def check_intervals(page: Any, document: dict[str, Any]) -> None:
    """Every table holding estimates also holds their 95% interval, in the twin and in the
    page, and the page's table has the twin's rows."""
    for table in document["tables"]:
        for estimate, ends in INTERVALS.items():
            if estimate in table["columns"]:
                assert set(ends) <= set(table["columns"]), (table["name"], table["columns"])
        shown = page.locator(f"table[data-table='{table['name']}'] tbody tr").count()
        assert shown == len(table["rows"]), (table["name"], shown, len(table["rows"]))
        headers = page.locator(f"table[data-table='{table['name']}'] th").all_text_contents()
        if set(INTERVALS) & set(table["columns"]):
            assert any("95% low" in header for header in headers), (table["name"], headers)
            assert any("95% high" in header for header in headers), (table["name"], headers)


def test_every_page_in_a_browser(browser: Any, dashboard: DashboardProcess,
                                 filled: dict[str, Any], screenshots: Path) -> None:
    token = filled["token"]
    host = urlsplit(dashboard.url).netloc
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    visit = Visit(context)

    # no data without the token: every page is the sign-in page, every twin a 401
    for path in PAGES.values():
        page = visit.open(dashboard.url + path)
        assert urlsplit(page.url).path == "/signin"
        assert "news.example.com" not in page.content()
        assert requests.get(f"{dashboard.url}{path}", params={"format": "json"},
                            timeout=30).status_code == 401
    page.fill("#token", token)
    page.click("form.signin button")
    page.wait_for_load_state("networkidle")
    cookie = next(c for c in context.cookies() if c["name"] == "veil_dashboard_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    marks = 0
    for name, path in PAGES.items():
        page = visit.open(dashboard.url + path)
        assert urlsplit(page.url).path == urlsplit(path).path, page.url
        document = twin(dashboard, token, path)
        marks += check_charts(page, document)
        check_intervals(page, document)
        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
    assert marks > 50
    assert visit.errors == []
    foreign = [url for url in visit.requested if urlsplit(url).netloc != host]
    assert foreign == []
    context.close()


def test_the_url_holds_the_state(browser: Any, dashboard: DashboardProcess,
                                 filled: dict[str, Any]) -> None:
    token = filled["token"]
    first, last = filled["days"][1], filled["days"][-1]
    path = f"/metric/browser?from={first}&to={last}&k=2&refresh=5m"
    context = browser.new_context()
    context.add_cookies([{"name": "veil_dashboard_token", "value": token,
                          "url": dashboard.url + "/"}])
    page = Visit(context).open(dashboard.url + path)
    assert page.input_value("input[name=from]") == first
    assert page.input_value("input[name=k]") == "2"
    assert page.locator("meta[http-equiv=refresh]").get_attribute("content") == "300"
    document = twin(dashboard, token, path)
    assert document["state"] == {"from": first, "to": last, "start": first, "end": last,
                                 "k": 2, "refresh": "5m"}
    series = {row["series"] for row in document["tables"][1]["rows"]}
    assert len(series) == 3 and "other (ranks past K)" in series  # top 2 and the rest
    assert {row["day"] for row in document["tables"][1]["rows"]} == set(filled["days"][1:])
    shown = page.locator("table[data-table=series]").inner_text()
    again = Visit(context).open(dashboard.url + path)  # the same URL, the same page
    assert again.locator("table[data-table=series]").inner_text() == shown

    # the form writes the state back into the URL
    again.fill("input[name=k]", "3")
    again.click("form.range button")
    again.wait_for_load_state("networkidle")
    assert "k=3" in again.url and f"from={first}" in again.url
    context.close()


def test_tables_read_without_javascript_and_by_keyboard(
        browser: Any, dashboard: DashboardProcess, filled: dict[str, Any]) -> None:
    context = browser.new_context(java_script_enabled=False)
    context.add_cookies([{"name": "veil_dashboard_token", "value": filled["token"],
                          "url": dashboard.url + "/"}])
    page = Visit(context).open(dashboard.url + "/metric/homepage")
    rows = page.locator("table[data-table=estimates] tbody tr")
    assert rows.count() >= 3
    assert "news.example.com" in rows.first.inner_text()
    # every visible form field has a label, and the keyboard reaches the skip link first
    unlabelled = page.eval_on_selector_all(
        "input:not([type=hidden]), select", "fields => fields.filter(f => !f.labels.length).length")
    assert unlabelled == 0
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Veil"
    context.close()
