"""The dashboard from outside: no data without a read token (``veil dashboard`` and
``veil serve --dashboard`` over real HTTP), the twins, the URL's state refused by name when
it is wrong, decodes computed once per counts, and the planner's figures.

API semantics (cache, twins, planner) use Flask's test client on a real SQLite store."""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.dashboard.conftest import DASHBOARD_REGISTRY_TOML, DashboardProcess, fill_past_days
from veil.shared.registry import Registry

TOKEN = "dashboard-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store with four past days of every metric."""
    path = tmp_path_factory.mktemp("store") / "veil.db"
    fill_past_days(path, Registry.from_toml(DASHBOARD_REGISTRY_TOML), installations=800)
    return path


@pytest.fixture
def client(store: Path, tmp_path: Path) -> Iterator[Any]:
    from veil.server.dashboard import create_dashboard

    candidates = tmp_path / "candidates"
    candidates.mkdir()
    from veil.simulations.demo import DECOYS, SITES

    (candidates / "homepage.txt").write_text("\n".join((*SITES, *DECOYS)) + "\n")
    app = create_dashboard({"DATABASE": str(store), "READ_TOKENS": [TOKEN],
                            "CANDIDATES": str(candidates), "TESTING": True})
    yield app.test_client()
    app.extensions["veil_dashboard"].decodes.source.close()


def cache(client: Any) -> Any:
    return client.application.extensions["veil_dashboard"].decodes.cache


def test_no_data_without_the_token(dashboard: DashboardProcess, filled: dict[str, Any]) -> None:
    for path in ("/", "/metric/homepage", "/joint/browser_dark", "/discovery/homepage",
                 "/privacy", "/planner", "/operations"):
        page = requests.get(dashboard.url + path, allow_redirects=False, timeout=30)
        assert page.status_code == 302 and "/signin" in page.headers["Location"]
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            twin = requests.get(dashboard.url + path, params={"format": "json"},
                                headers=headers, timeout=30)
            assert twin.status_code == 401
            assert twin.json()["error"]["field"] == "Authorization"
            assert "homepage" not in twin.text.replace(path, "")
    wrong = requests.post(dashboard.url + "/signin", data={"token": "nope"}, timeout=30,
                          allow_redirects=False)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers


def test_signing_in_sets_a_strict_http_only_cookie(dashboard: DashboardProcess,
                                                   filled: dict[str, Any]) -> None:
    with requests.Session() as session:
        answer = session.post(dashboard.url + "/signin", timeout=30, allow_redirects=False,
                              data={"token": filled["token"], "next": "/privacy?k=3"})
        assert answer.status_code == 302 and answer.headers["Location"] == "/privacy?k=3"
        cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert session.get(dashboard.url + "/privacy", timeout=30).status_code == 200
        # a next pointing to another host is not followed
        away = session.post(dashboard.url + "/signin", timeout=30, allow_redirects=False,
                            data={"token": filled["token"], "next": "https://example.org/"})
        assert away.headers["Location"] == "/"
        headers = session.get(dashboard.url + "/", timeout=30).headers
        assert headers["Content-Security-Policy"].startswith("default-src 'self'")


def test_the_dashboard_listens_on_this_machine_and_needs_a_token(store: Path) -> None:
    from veil.server.dashboard.cli import DEFAULT_HOST

    assert DEFAULT_HOST == "127.0.0.1"
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    refused = subprocess.run([sys.executable, "-m", "veil.server.cli", "dashboard", "--db",
                              str(store), "--port", "0"], capture_output=True, text=True,
                             env=env, timeout=60)
    assert refused.returncode != 0
    assert "--read-token" in refused.stderr


def test_serve_mounts_the_dashboard_only_when_asked(
        collector_factory: Callable[..., Any]) -> None:
    registry = Registry.from_toml(DASHBOARD_REGISTRY_TOML)
    plain = collector_factory(registry)
    assert requests.get(plain.url + "/dashboard/", timeout=30,
                        headers=plain.headers()).status_code == 404
    mounted = collector_factory(registry, serve_args=["--dashboard"])
    assert requests.get(mounted.url + "/dashboard/", params={"format": "json"},
                        timeout=30).status_code == 401
    overview = requests.get(mounted.url + "/dashboard/", params={"format": "json"},
                            headers=mounted.headers(), timeout=60)
    assert overview.status_code == 200
    assert {row["metric"] for row in overview.json()["tables"][0]["rows"]} == set(registry)
    operations = requests.get(mounted.url + "/dashboard/operations", timeout=60,
                              params={"format": "json"}, headers=mounted.headers()).json()
    assert operations["facts"]["Ready"] == "yes"
    assert "refusals" in [table["name"] for table in operations["tables"]]


@pytest.mark.parametrize(("arguments", "message"), [
    (["--dashboard", "--workers", "2", "--dashboard-candidates", "missing", "--read-token",
      "a-token"], "--dashboard-candidates missing: not a directory"),
    (["--dashboard-candidates", "."], "--dashboard-candidates is read by the dashboard only"),
    (["--dashboard"], "--dashboard shows data to read tokens only"),
])
def test_serve_refuses_a_dashboard_it_could_not_serve_before_it_listens(
        tmp_path: Path, arguments: list[str], message: str) -> None:
    """Checked once, before the port is taken: a bad candidates directory used to surface
    in each worker after 'listening', restarted until the server gave up."""
    (tmp_path / "metrics.toml").write_text(DASHBOARD_REGISTRY_TOML)
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    refused = subprocess.run(
        [sys.executable, "-m", "veil.server.cli", "serve", "--config",
         str(tmp_path / "metrics.toml"), "--db", str(tmp_path / "veil.db"), "--port", "0",
         *arguments],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert "listening" not in refused.stdout


def test_a_page_view_never_decodes_twice(client: Any) -> None:
    first = client.get("/metric/homepage?from=now-6d&format=json", headers=AUTH)
    assert first.status_code == 200
    misses = cache(client).misses
    assert misses >= 2  # the range, then each day with reports
    again = client.get("/metric/homepage?from=now-6d&format=json", headers=AUTH)
    assert again.json == first.json
    assert cache(client).misses == misses
    assert client.get("/metric/homepage?from=now-6d", headers=AUTH).status_code == 200
    assert cache(client).misses == misses  # the page and its twin share the decodes


def test_new_reports_make_a_new_decode(client: Any, store: Path) -> None:
    client.get("/metric/browser?format=json", headers=AUTH)
    misses = cache(client).misses
    fill_past_days(store, Registry.from_toml(DASHBOARD_REGISTRY_TOML), days=1,
                   installations=50, seed=99)
    client.get("/metric/browser?format=json", headers=AUTH)
    assert cache(client).misses > misses


def test_csv_twin_holds_the_json_twin_rows(client: Any) -> None:
    document = client.get("/metric/browser?format=json&k=2", headers=AUTH).json
    for table in document["tables"]:
        answer = client.get(f"/metric/browser?format=csv&k=2&table={table['name']}", headers=AUTH)
        assert answer.mimetype == "text/csv"
        rows = list(csv.DictReader(io.StringIO(answer.get_data(as_text=True))))
        assert len(rows) == len(table["rows"])
        for row, expected in zip(rows, table["rows"], strict=True):
            for key, value in expected.items():
                if isinstance(value, float):
                    assert math.isclose(float(row[key]), value, rel_tol=1e-12)
                else:
                    assert row[key] == ("" if value is None else str(value))


@pytest.mark.parametrize(("query", "field"), [
    ("k=0", "k"), ("k=abc", "k"), ("from=yesterday", "from"), ("from=now&to=now-3d", "from"),
    ("refresh=1s", "refresh"), ("format=xml", "format"), ("format=csv&table=nope", "table"),
    ("from=0001-01-01", "from"),  # longer than a day-by-day decode reads (MAX_DAYS)
    # digits int() cannot read (a superscript two, a circled one) and 5,000 digits were 500s
    ("k=%C2%B2", "k"), ("k=%E2%91%A0", "k"), ("k=" + "9" * 5000, "k"),
])
def test_a_bad_state_is_refused_by_name(client: Any, query: str, field: str) -> None:
    twin = "" if "format=" in query else "&format=json"
    answer = client.get(f"/metric/browser?{query}{twin}", headers=AUTH)
    assert answer.status_code == 400
    assert answer.json["error"]["field"] == field


@pytest.mark.parametrize(("query", "field"), [
    ("kind=category&categories=20000000", "categories"),  # built 2.2 GB before refusing
    ("kind=category&categories=%C2%B2", "categories"), ("kind=string&values=" + "9" * 5000,
                                                        "values"),
])
def test_the_planner_refuses_a_count_before_building_it(client: Any, query: str,
                                                        field: str) -> None:
    page = client.get(f"/planner?{query}&format=json", headers=AUTH)
    assert page.status_code == 200 and page.json["facts"]["error_field"] == field


def test_a_next_holding_a_line_end_signs_in_to_the_overview(client: Any) -> None:
    """Werkzeug refused the Location header it made (a 500); now the target is dropped."""
    answer = client.post("/signin?next=/%0D%0ALocation:%20https://evil.test/",
                         data={"token": TOKEN})
    assert answer.status_code == 302 and answer.headers["Location"] == "/"
    answer = client.post("/signin", data={"token": TOKEN, "next": "/\r\nX: y"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/"


def test_unknown_metric_is_404(client: Any) -> None:
    answer = client.get("/metric/nope?format=json", headers=AUTH)
    assert answer.status_code == 404 and answer.json["error"]["field"] == "metric"


def test_the_planner_uses_the_decoders_variances(client: Any) -> None:
    from veil.shared.kinds import parse_params

    document = client.get("/planner?kind=category&oracle=oue&epsilon=2&categories=20"
                          "&reports=250000&format=json", headers=AUTH).json
    figures = {row["quantity"]: row["value"] for row in document["tables"][0]["rows"]}
    params, _ = parse_params({"kind": "category", "oracle": "oue", "epsilon": 2.0,
                              "categories": [str(i) for i in range(20)]})
    expected = math.sqrt(params.share_variance(0.0, 250_000))
    assert math.isclose(figures["Standard error of a share near 0"], expected, rel_tol=1e-12)
    # OUE's 4e^eps/(e^eps - 1)^2 / N at the report's epsilon (half the value's, 1)
    eps = params.report_epsilon
    assert math.isclose(expected, math.sqrt(4 * math.exp(eps) / math.expm1(eps) ** 2 / 250_000),
                        rel_tol=1e-3)
    assert figures["ε one value (all its reports)"] == params.epsilon_inf
    refused = client.get("/planner?kind=category&epsilon=-1&format=json", headers=AUTH).json
    assert refused["tables"] == [] and "epsilon" in refused["notes"][0]


def test_the_planner_plans_bloom_rappor_from_its_own_parameters(client: Any) -> None:
    """A string metric given k, h, m, p, q and f is Bloom RAPPOR: the form's default epsilon
    and oracle (the string oracles' settings) used to be passed along, and every such plan
    was refused ("StringParams does not take 'epsilon'")."""
    from veil.shared.kinds import StringParams

    document = client.get("/planner?kind=string&k=128&h=2&m=64&p=0.5&q=0.75&f=0.5"
                          "&values=1000&reports=1000000&format=json", headers=AUTH).json
    assert document["tables"], document["notes"]
    figures = {row["quantity"]: row["value"] for row in document["tables"][0]["rows"]}
    params = StringParams(k=128, h=2, m=64, p=0.5, q=0.75, f=0.5)
    assert figures["Mechanism"] == "string"
    assert figures["ε one value (all its reports)"] == params.epsilon_inf


MARGINALS_TOML = """\
version = 1

[metrics.setup]
kind = "joint"
min_reports = 200
of = ["os", "dark", "plan"]
domains = [["linux", "mac", "windows"], "boolean", ["free", "paid"]]
marginals = 2
epsilon = 4.0
"""


def test_a_marginals_metric_shows_every_pair_and_the_strongest_heatmap(tmp_path: Path) -> None:
    from veil.server.analysis import decode_metric
    from veil.server.dashboard import create_dashboard

    store = tmp_path / "veil.db"
    registry = Registry.from_toml(MARGINALS_TOML)
    days = fill_past_days(store, registry, days=1, installations=3000)
    app = create_dashboard({"DATABASE": str(store), "READ_TOKENS": [TOKEN], "TESTING": True})
    try:
        page = app.test_client().get("/joint/setup", query_string={"format": "json",
                                                                    "from": days[0]},
                                     headers=AUTH).get_json()
        html = app.test_client().get("/joint/setup", query_string={"from": days[0]},
                                     headers=AUTH).get_data(as_text=True)
    finally:
        app.extensions["veil_dashboard"].decodes.source.close()
    tables = {table["name"]: table for table in page["tables"]}
    assert page["facts"]["Pairs"] == 3 and page["facts"]["Reports (N)"] == 3000
    # the tables are the decoder's, as veil decode writes them
    decoded = decode_metric(metric="setup", db=str(store), start=days[0], end=days[0])
    tests = tables["independence"]["rows"]
    assert sorted(test["pair"] for test in tests) == sorted(
        row["pair"] for row in decoded.independence_rows)
    assert [test["p_value"] for test in tests] == sorted(test["p_value"] for test in tests)
    strongest = tests[0]["pair"]
    assert len(tables["pairs"]["rows"]) == len(decoded.rows) == 6 + 4 + 6
    heat = tables["cells"]["rows"]
    assert {row["proportion"] for row in heat} == {
        row["proportion"] for row in decoded.rows if row["pair"] == strongest}
    assert f"Heatmap: {strongest} with 95% intervals" in html and 'data-heatmap="cells"' in html


def test_a_ten_year_range_shows_the_days_that_hold_reports(client: Any) -> None:
    """Ten years of range (the most a page covers): the series holds the four days with
    reports, and a second view decodes nothing again."""
    page = client.get("/metric/browser?from=now-3599d&format=json", headers=AUTH).json
    series = next(table for table in page["tables"] if table["name"] == "series")
    days = sorted({row["day"] for row in series["rows"]})
    assert len(days) == 4
    reads = cache(client).misses
    again = client.get("/metric/browser?from=now-3599d&format=json", headers=AUTH).json
    assert again == page and cache(client).misses == reads


def test_concurrent_views_of_a_page_decode_it_once(store: Path, client: Any) -> None:
    """Four requests for the same uncached page at once: the cache computes each decode
    once (the others wait for it), as many as one view alone."""
    import threading

    from veil.server.dashboard import create_dashboard

    path = "/metric/homepage?from=now-6d&format=json"  # a string metric: decodes take long
    assert client.get(path, headers=AUTH).status_code == 200
    alone = cache(client).misses
    config = client.application.config
    app = create_dashboard({"DATABASE": str(store), "READ_TOKENS": [TOKEN], "TESTING": True,
                            "CANDIDATES": config["CANDIDATES"]})
    try:
        start = threading.Barrier(4)
        answers: list[int] = []

        def view() -> None:
            start.wait()
            answers.append(app.test_client().get(path, headers=AUTH).status_code)

        threads = [threading.Thread(target=view) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert answers == [200] * 4
        assert app.extensions["veil_dashboard"].decodes.cache.misses == alone
    finally:
        app.extensions["veil_dashboard"].decodes.source.close()


def test_the_dashboard_reads_the_authorization_header_as_the_collector_does(
        dashboard: DashboardProcess, filled: dict[str, Any]) -> None:
    """The scheme is case-insensitive (RFC 7235), for the collector and the dashboard alike:
    one check serves both."""
    for scheme in ("Bearer", "bearer", "BEARER"):
        headers = {"Authorization": f"{scheme} {filled['token']}"}
        assert requests.get(dashboard.url + "/privacy", params={"format": "json"},
                            headers=headers, timeout=60).status_code == 200, scheme
        assert requests.get(filled["collector"].url + "/v1/stats", headers=headers,
                            timeout=60).status_code == 200, scheme
    assert requests.get(dashboard.url + "/privacy", params={"format": "json"},
                        headers={"Authorization": f"Basic {filled['token']}"},
                        timeout=60).status_code == 401


def test_the_privacy_page_states_the_cost_whatever_was_reported(client: Any) -> None:
    """A range without reports: every metric with a finite set of values still states its
    worst case (from its parameters, as veil decode's summary does), strings none."""
    from veil.server.analysis.cost import privacy_cost

    page = client.get("/privacy?from=2001-01-01&to=2001-01-02&format=json", headers=AUTH).json
    rows = {row["metric"]: row for row in page["tables"][0]["rows"]}
    registry = Registry.from_toml(DASHBOARD_REGISTRY_TOML)
    for name in ("browser", "dark_mode", "browser_dark", "load_seconds"):
        params = registry[name].params
        expected = privacy_cost(params, *params.possible_values)["epsilon_per_installation"]
        assert expected is not None and rows[name]["epsilon_installation"] == expected, name
    assert rows["homepage"]["epsilon_installation"] is None
    assert "no upper limit" in rows["homepage"]["statement"]


def test_the_privacy_page_shows_each_epsilon_rounded_up(client: Any) -> None:
    """The page's epsilons are rounded up like its statements (2.1972 reads 2.198, never
    2.197): a table must not show less than the cost the statement beside it names."""
    from veil.shared.privacy import format_epsilon

    page = client.get("/privacy?format=json", headers=AUTH).json
    html = client.get("/privacy", headers=AUTH).get_data(as_text=True)
    cells = [(key, value) for row in page["tables"][0]["rows"] for key, value in row.items()
             if key.startswith("epsilon") and isinstance(value, float)]
    assert cells
    for key, value in cells:
        shown = format_epsilon(value, 4)
        assert float(shown) >= value and f">{shown}<" in html, (key, value)
    for fact in ("\u03b5 for one value of every metric",):
        total = page["facts"][fact]
        assert f">{format_epsilon(total, 4)}<" in html


def test_an_unreachable_collector_is_named_in_one_voice(offline_url: str) -> None:
    """The operations page's readiness says why in the operating system's words, as every
    other command does, not in urllib3's nested connection-pool text."""
    from veil.server.dashboard.sources import DashboardSource

    ready, why = DashboardSource(server=offline_url, token="a-token").readiness()
    assert not ready and why.startswith("cannot reach the collector: ")
    assert "HTTPConnectionPool" not in why and "Max retries" not in why


@pytest.mark.parametrize(("kind", "message"), [
    ("missing", "no Veil database at"),
    ("empty", "the file is empty; start the collector with this --db first"),
])
def test_a_store_that_is_not_there_is_refused_before_the_dashboard_listens(
        tmp_path: Path, kind: str, message: str) -> None:
    """It used to listen, then answer every page with a bare 500."""
    db = tmp_path / "veil.db"
    if kind == "empty":
        db.touch()
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    refused = subprocess.run([sys.executable, "-m", "veil.server.cli", "dashboard", "--db",
                              str(db), "--port", "0", "--read-token", TOKEN],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert "listening" not in refused.stdout
    assert "Traceback" not in refused.stderr


def test_a_short_read_token_is_warned_about(tmp_path: Path) -> None:
    """Neither the sign-in page nor the API slows down wrong guesses (one connection made
    1,200 a second): a short token is a guessable one."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    run = subprocess.run([sys.executable, "-m", "veil.server.cli", "dashboard", "--db",
                          str(tmp_path / "missing.db"), "--port", "0", "--read-token", "abc"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert "veil dashboard: warning: --read-token holds a 3-character token, which can be " \
        "guessed" in run.stderr
    assert run.returncode == 2  # and the missing store is still refused


def test_an_unreachable_collector_is_said_on_every_page_not_as_a_500(offline_url: str) -> None:
    """The dashboard may start before its collector: it warns, and each page answers 503
    with the reason (HTML and the JSON twin) until the collector answers."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    process = DashboardProcess(["--server", offline_url, "--token", "a-collector-read-token",
                                "--read-token", TOKEN], env)
    try:
        assert process.process.stderr is not None
        warning = process.process.stderr.readline()  # printed before 'listening on'
        assert warning.startswith("veil dashboard: warning: ") and offline_url in warning
        for path in ("/", "/metric/homepage", "/privacy"):
            page = requests.get(process.url + path, cookies={"veil_dashboard_token": TOKEN},
                                timeout=60)
            assert page.status_code == 503, path
            assert "cannot reach the collector at" in page.text and 'role="alert"' in page.text
            twin = requests.get(process.url + path, params={"format": "json"}, headers=AUTH,
                                timeout=60)
            assert twin.status_code == 503, path
            assert twin.json()["error"]["code"] == "source_unavailable"
    finally:
        assert process.stop() == 0
