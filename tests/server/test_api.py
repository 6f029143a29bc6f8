"""The HTTP API's contract: every error is 4xx JSON naming the field, reads need the token.

The contract is checked in-process with Flask's test client (``client``); the
tests at the end run ``veil serve`` for what only the real server shows: each
route family answering through waitress, its body limit, and its log.
"""

from __future__ import annotations

import gzip
import json
import sys

import pytest
import requests

from veil.server.collector import EXTENSION
from veil.shared.errors import ParameterError, VeilError
from veil.shared.wire import make_batch, make_report

JSON = {"Content-Type": "application/json"}


def post(client, body: bytes | str, content_type: str | None = "application/json"):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return client.post("/v1/reports", data=data, content_type=content_type)


def with_params(registry, report):
    """A hand-made version 2 report: with its metric's parameter fingerprint (if any)."""
    if not isinstance(report, dict):
        return report
    metric = registry.get(report.get("metric"))
    return {"params": metric.params.fingerprint if metric else "0" * 16, **report}


def error_of(response) -> dict:
    """The ``error`` object of a JSON error response (asserting its shape); takes a test
    client response or a ``requests`` one."""
    assert response.headers["Content-Type"].startswith("application/json"), response.text
    error = json.loads(response.text)["error"]
    assert set(error) == {"code", "field", "message"} and error["message"]
    return error


def as_received(value: str) -> str:
    """A header value as a WSGI server hands it to the app: its UTF-8 bytes read as
    latin-1 (PEP 3333), which is what the app saw when tests sent these bytes over HTTP."""
    return value.encode("utf-8", "surrogatepass").decode("latin-1")


def test_health_readiness_and_registry(client):
    assert client.get("/healthz").json == {"status": "ok"}
    assert client.get("/readyz").json == {"status": "ready"}
    served = client.get("/v1/metrics")
    assert served.status_code == 200
    assert served.json == client.registry.to_dict()


def test_openapi_document_lists_every_route(client):
    document = client.get("/v1/openapi.json").json
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]) == {"/healthz", "/readyz", "/metrics", "/v1/openapi.json",
                                      "/v1/metrics", "/v1/reports", "/v1/stats",
                                      "/v1/metrics/{name}/counts", "/v1/metrics/{name}/reports"}
    batch = document["components"]["schemas"]["Batch"]
    assert batch["properties"]["reports"]["maxItems"] == 5000


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ("{not json", "body", "bad_json"),
        ('{"version": 1, "version": 1}', "body", "bad_json"),
        ("[NaN]", "body", "bad_json"),
        ('{"x": Infinity}', "body", "bad_json"),
        ("[" * 10_000, "body", "bad_json"),  # too deep, yet under too_many
        ("9" * 5000, "body", "bad_json"),
        ("\ud800", "body", "bad_json"),
        ("[]", "body", "wrong_type"),
        ('{"version": 3, "batch_id": "' + "a" * 32 + '", "reports": []}', "version",
         "unsupported_version"),
        ('{"version": true, "batch_id": "' + "a" * 32 + '", "reports": []}', "version",
         "unsupported_version"),
        ('{"version": 1, "batch_id": "nope", "reports": []}', "batch_id", "bad_id"),
        ('{"version": 1, "batch_id": "' + "a" * 32 + '", "reports": {}}', "reports", "wrong_type"),
        ('{"version": 1, "batch_id": "' + "a" * 32 + '", "reports": []}', "reports", "empty"),
        ('{"version": 1, "batch_id": "' + "a" * 32 + '", "reports": [1], "x\u00e9": 1}', "x\u00e9",
         "unknown_field"),
    ],
)
def test_batch_level_errors_are_400_json_naming_the_field(client, body, field, code):
    response = post(client, body)
    assert response.status_code == 400
    error = error_of(response)
    assert (error["field"], error["code"]) == (field, code)


def test_a_huge_unknown_key_is_named_cut_short_not_sent_back(client, wire):
    """An unknown key of 100,000 characters, in the batch (400) or in a report (refused with
    the batch's answer): the answer names its first 61 characters, and stays small."""
    batch = wire.batch(wire.reports("dark_mode", [True]))
    huge = "k" * 100_000
    for body, field, status in (
            ({**batch, huge: 1}, "k" * 61 + "...", 400),
            ({**batch, "reports": [{**batch["reports"][0], huge: 1}]},
             "reports[0]." + "k" * 61 + "...", 200)):
        response = client.post("/v1/reports", json=body)
        assert response.status_code == status and len(response.data) < 2000, len(response.data)
        assert f'"{field}"' in response.get_data(as_text=True)


def test_invalid_utf8_is_refused(client):
    response = post(client, b'{"version": 1, "batch_id": "\xff\xfe"}')
    assert response.status_code == 400
    assert error_of(response)["code"] == "bad_json"
    assert "UTF-8" in error_of(response)["message"]


def test_too_many_reports_in_one_batch(app_factory, wire):
    client = app_factory(MAX_REPORTS_PER_BATCH=3).test_client()
    batch = wire.batch(wire.reports("dark_mode", [True] * 4))
    response = client.post("/v1/reports", json=batch)
    assert response.status_code == 400
    error = error_of(response)
    assert (error["field"], error["code"]) == ("reports", "too_many")
    assert "3" in error["message"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=latin-1"])
def test_wrong_content_type_is_415(client, wire, content_type):
    body = json.dumps(wire.batch(wire.reports("dark_mode", [True])))
    response = post(client, body.encode(), content_type)
    assert response.status_code == 415
    assert error_of(response)["field"] == "Content-Type"


def test_bad_reports_are_refused_one_by_one_and_good_ones_kept(client, wire):
    good = wire.reports("homepage", ["a.example", "b.example"])
    k_hex = 2 * (client.registry["homepage"].params.k // 8)
    bad = [
        {"id": "0" * 32, "metric": "homepage", "cohort": 0, "payload": "zz" * (k_hex // 2)},
        {"id": "1" * 32, "metric": "homepage", "cohort": 99, "payload": "00" * (k_hex // 2)},
        {"id": "2" * 32, "metric": "homepage", "cohort": 0, "payload": "00"},
        {"id": "3" * 32, "metric": "nope\u2603", "payload": 1},
        {"id": "4" * 32, "metric": "dark_mode", "payload": 2},
        {"id": "5" * 32, "metric": "load_time", "payload": 10**400},
        {"id": "6" * 32, "metric": "load_time", "payload": "1.5"},
        {"id": "ABC", "metric": "dark_mode", "payload": 1},
        "not an object",
        {"id": "7" * 32, "metric": "dark_mode", "payload": 1, "ip": "10.0.0.1"},
        {"id": "8" * 32, "metric": "dark_mode", "cohort": 0, "payload": 1},
    ]
    bad = [with_params(client.registry, report) for report in bad]
    batch = wire.batch([good[0], *bad, good[1]])
    response = client.post("/v1/reports", json=batch)
    assert response.status_code == 200
    receipt = response.json
    assert (receipt["accepted"], receipt["duplicates"], receipt["rejected"]) == (2, 0, len(bad))
    fields = [(e["index"], e["field"], e["code"]) for e in receipt["errors"]]
    assert fields == [
        (1, "reports[1].payload", "bad_hex"),
        (2, "reports[2].cohort", "bad_cohort"),
        (3, "reports[3].payload", "wrong_length"),
        (4, "reports[4].metric", "unknown_metric"),
        (5, "reports[5].payload", "wrong_type"),
        (6, "reports[6].payload", "out_of_range"),
        (7, "reports[7].payload", "wrong_type"),
        (8, "reports[8].id", "bad_id"),
        (9, "reports[9]", "wrong_type"),
        (10, "reports[10].ip", "unknown_field"),
        (11, "reports[11].cohort", "unknown_field"),
    ]
    assert receipt["errors"][0]["id"] == "0" * 32 and receipt["errors"][7]["id"] is None
    assert client.counts("homepage")["reports"] == 2
    nothing = client.get("/v1/metrics/dark_mode/counts", headers=client.headers())
    assert nothing.status_code == 409  # nothing stored: 0 < min_reports = 1
    assert error_of(nothing)["code"] == "too_few_reports"


def test_number_payloads_the_mechanism_cannot_produce_are_refused(client, wire):
    """Forged Laplace payloads (far out, off the grid) never reach the sums: counts stay
    finite JSON and the mean stays that of the honest reports."""
    params = client.registry["load_time"].params
    honest = wire.reports("load_time", [5.0] * 50)
    low, high = params.payload_range
    forged = [1e6, 1e300, -1e300, high + params.step, low - params.step, 5.0 + params.step / 3]
    bad = [with_params(client.registry, {"id": f"{i:032x}", "metric": "load_time", "payload": v})
           for i, v in enumerate(forged)]
    response = client.post("/v1/reports", json=wire.batch(honest + bad))
    receipt = response.json
    assert (receipt["accepted"], receipt["rejected"]) == (50, len(forged))
    assert [e["code"] for e in receipt["errors"]] == ["out_of_range"] * 5 + ["off_grid"]
    raw = client.get("/v1/metrics/load_time/counts", headers=client.headers()).text
    document = json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in counts"))
    assert document == {**document, **wire.expected("load_time", honest)}


def test_a_number_grid_of_no_width_never_reaches_the_collector(app_factory, tmp_path):
    """A grid step of (5e-324 - 0) / 64 = 0 made every report a ZeroDivisionError, a 500:
    the collector refuses such a registry when it starts, naming the bound to move, and the
    narrowest grid it takes (a step of the least normal float) reads its reports back."""
    path = tmp_path / "metrics.toml"
    table = "version = 1\n[metrics.a]\nkind = 'number'\nmin_reports = 1\nlow = 0\n"
    path.write_text(f"{table}high = 5e-324\n", encoding="utf-8")
    with pytest.raises(ParameterError) as info:
        app_factory(REGISTRY=path)
    assert info.value.field == "metrics.a.high"
    assert "is not a positive normal float" in str(info.value)
    path.write_text(f"{table}high = {64 * sys.float_info.min!r}\n", encoding="utf-8")
    client = app_factory(REGISTRY=path).test_client()
    params = client.application.extensions[EXTENSION].registry["a"].params
    reports = [make_report(f"{i:032x}", "a", None, payload, params.fingerprint)
               for i, payload in enumerate([0, 0.0, params.step * 3, params.high])]
    response = client.post("/v1/reports", json=make_batch("f" * 32, reports))
    assert response.status_code == 200 and response.json["accepted"] == 4, response.text
    document = client.counts("a")
    assert document["reports"] == 4 and document["cohorts"][0]["sum"] == 67 * params.step


def test_counts_need_the_read_token(client):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"},
                    {"Authorization": f"Bearer {client.token}x"},
                    {"Authorization": "Bearer \u00e9"}):
        response = client.get("/v1/metrics/homepage/counts",
                              headers={k: as_received(v) for k, v in headers.items()})
        assert response.status_code == 401
        assert error_of(response)["field"] == "Authorization"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_counts_refused_below_min_reports_with_the_numbers(client, wire):
    sent = wire.reports("rare", ["x"] * 49)
    client.post("/v1/reports", json=wire.batch(sent))
    response = client.get("/v1/metrics/rare/counts", headers=client.headers())
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "too_few_reports"
    assert "49" in error["message"] and "50" in error["message"]
    more = wire.reports("rare", ["x"])
    client.post("/v1/reports", json=wire.batch(more))
    assert client.counts("rare")["reports"] == 50


@pytest.mark.parametrize(
    ("path", "status", "code", "field"),
    [
        ("/v1/metrics/nope/counts", 404, "unknown_metric", "name"),
        ("/v1/metrics/homepage/counts?start=2026-13-01", 400, "bad_date", "start"),
        ("/v1/metrics/homepage/counts?end=yesterday", 400, "bad_date", "end"),
        ("/v1/metrics/homepage/counts?start=2026-11-02&end=2026-11-01", 400, "bad_date", "start"),
        ("/v1/metrics/homepage/counts?format=xml", 400, "bad_format", "format"),
        ("/v1/metrics/dark_mode/counts?format=csv", 400, "bad_format", "format"),
        ("/v1/metrics/homepage/counts?limit=3", 400, "unknown_parameter", "limit"),
    ],
)
def test_counts_query_errors(client, path, status, code, field):
    response = client.get(path, headers=client.headers())
    assert response.status_code == status
    error = error_of(response)
    assert (error["code"], error["field"]) == (code, field)


def test_csv_counts_are_google_rappor_rows(client, wire):
    sent = wire.reports("homepage", ["x.example"] * 12)
    client.post("/v1/reports", json=wire.batch(sent))
    response = client.get("/v1/metrics/homepage/counts?format=csv", headers=client.headers())
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/csv")
    rows = [list(map(int, line.split(","))) for line in response.text.splitlines()]
    expected = wire.expected("homepage", sent)["cohorts"]
    assert rows == [[entry["reports"], *entry["ones"]] for entry in expected]


def test_unknown_routes_and_methods_are_json(client):
    response = client.get("/v1/nothing")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    response = client.get("/v1/reports")
    assert response.status_code == 405 and error_of(response)["code"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]


def test_upload_token_when_configured(app_factory, wire):
    client = app_factory(UPLOAD_TOKEN="up-secret").test_client()
    batch = wire.batch(wire.reports("dark_mode", [True]))
    refused = client.post("/v1/reports", json=batch)
    assert refused.status_code == 401 and error_of(refused)["field"] == "Authorization"
    wrong = client.post("/v1/reports", json=batch, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    accepted = client.post("/v1/reports", json=batch,
                           headers={"Authorization": "Bearer up-secret"})
    assert accepted.status_code == 200 and accepted.json["accepted"] == 1
    # the read token is not an upload token
    other = client.post("/v1/reports", json=wire.batch(wire.reports("dark_mode", [True])),
                        headers=client.headers())
    assert other.status_code == 401


@pytest.mark.parametrize("setting", ["READ_TOKENS", "UPLOAD_TOKEN"])
@pytest.mark.parametrize("token", ["t\u00f6k\u00e9n", "with space", "a:b", "=abc"])
def test_tokens_that_headers_cannot_carry_are_refused_at_start(app_factory, setting, token):
    """A token outside RFC 6750's b64token could never match what a client sends."""
    with pytest.raises(VeilError, match=f"{setting}: a bearer token may hold only"):
        app_factory(**{setting: token})


@pytest.mark.parametrize("setting", ["READ_TOKENS", "UPLOAD_TOKEN", "METRICS_TOKENS"])
@pytest.mark.parametrize("token", ["", "  ", ["good-token", ""]])
def test_empty_tokens_are_refused_at_start_as_such(app_factory, setting, token):
    """An empty or blank token (an unset environment variable, most likely) is named as one."""
    with pytest.raises(VeilError, match=f"{setting} holds an empty token"):
        app_factory(**{setting: token})


def test_unavailable_storage_is_503_with_retry_after(app, client, wire):
    """A collector whose database is gone answers 503 (clients retry), never a traceback."""
    app.extensions[EXTENSION].storage.close()
    batch = wire.batch(wire.reports("dark_mode", [True]))
    response = client.post("/v1/reports", json=batch)
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert error_of(response)["code"] == "unavailable"
    ready = client.get("/readyz")
    assert ready.status_code == 503 and error_of(ready)["code"] == "unavailable"


# ---------------------------------------------------------------------------------------------
# over the wire: veil serve (waitress) on 127.0.0.1


def test_every_route_answers_over_http_and_nothing_about_the_client_is_kept(collector, wire):
    """Through ``veil serve``, each route family answers, errors included (JSON bodies,
    ``WWW-Authenticate``, ``Allow``); afterwards no address or user agent is in the
    database or the server's log."""
    agent = "VeilProbeAgent/9.9"
    url = collector.url
    with requests.Session() as session:
        session.headers["User-Agent"] = agent
        assert session.get(url + "/healthz", timeout=10).json() == {"status": "ok"}
        assert session.get(url + "/readyz", timeout=10).json() == {"status": "ready"}
        assert session.get(url + "/v1/metrics", timeout=10).json() == collector.registry.to_dict()
        document = session.get(url + "/v1/openapi.json", timeout=10).json()
        assert "/v1/metrics/{name}/counts" in document["paths"]
        batch = wire.batch(wire.reports("dark_mode", [True, False]))
        receipt = session.post(url + "/v1/reports", json=batch, timeout=30)
        assert receipt.status_code == 200 and receipt.json()["accepted"] == 2
        counts = session.get(url + "/v1/metrics/dark_mode/counts", headers=collector.headers(),
                             timeout=10)
        assert counts.status_code == 200 and counts.json()["reports"] == 2
        bad = session.post(url + "/v1/reports", data=b"{not json", headers=JSON, timeout=30)
        assert bad.status_code == 400 and error_of(bad)["code"] == "bad_json"
        unauthorized = session.get(url + "/v1/metrics/dark_mode/counts", timeout=10)
        assert unauthorized.status_code == 401
        assert error_of(unauthorized)["field"] == "Authorization"
        assert unauthorized.headers["WWW-Authenticate"].startswith("Bearer")
        missing = session.get(url + "/v1/nothing", timeout=10)
        assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
        wrong_method = session.get(url + "/v1/reports", timeout=10)
        assert wrong_method.status_code == 405 and "POST" in wrong_method.headers["Allow"]
    collector.stop()
    files = [p for p in collector.workdir.iterdir() if p.is_file()]
    assert any(p.name == "veil.db" for p in files)
    # the start-up summary names the collector's own address, never a client's (whose port differs)
    listening = f"127.0.0.1:{collector.port}".encode()
    for path in files:
        data = path.read_bytes().replace(listening, b"")
        assert agent.encode() not in data, path.name
        assert b"127.0.0.1" not in data, path.name


def test_oversized_body_is_413_json(collector_factory):
    """``--max-body-bytes`` reaches the app, and waitress lets Flask answer 413 as JSON."""
    collector = collector_factory(max_body_bytes=4096)
    response = requests.post(collector.url + "/v1/reports", data=b"[" + b"0," * 4000 + b"0]",
                             headers=JSON, timeout=30)
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"
    assert "4096" in error_of(response)["message"]


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate", "x-unknown"])
def test_a_compressed_body_is_415_naming_content_encoding(client, wire, coding):
    """The collector takes uncompressed JSON only: a body labelled with a content coding is
    refused by that header's name (RFC 9110 section 8.4), whether or not it is compressed,
    never read as JSON that happens to parse or as text that is "not UTF-8"."""
    body = json.dumps(wire.batch(wire.reports("dark_mode", [True])))
    for data in (body.encode(), gzip.compress(body.encode())):
        response = client.post("/v1/reports", data=data, content_type="application/json",
                               headers={"Content-Encoding": coding})
        assert response.status_code == 415
        assert error_of(response)["field"] == "Content-Encoding"
    identity = client.post("/v1/reports", data=body, content_type="application/json",
                           headers={"Content-Encoding": "identity"})
    assert identity.json["accepted"] == 1
    assert client.counts("dark_mode")["reports"] == 1  # the refused copies stored nothing


def _chunked_post(port: int, body: bytes) -> tuple[int, dict]:
    """POST ``body`` to /v1/reports in 64 KiB chunks (no Content-Length); status and JSON."""
    response = requests.post(f"http://127.0.0.1:{port}/v1/reports", headers=JSON, timeout=60,
                             data=(body[i:i + 65536] for i in range(0, len(body), 65536)))
    return response.status_code, response.json()


def test_a_chunked_body_past_the_limit_is_413_under_any_wsgi_server(live_collector, collector,
                                                                     wire):
    """A chunked body (no Content-Length) over MAX_CONTENT_LENGTH: waitress (veil serve)
    and werkzeug's server (what the app meets under a server that streams bodies) both
    answer 413, never a 200 for the body's first 2 MiB or a 400 bad_json for its cut end;
    a chunked body within the limit is stored."""
    valid = json.dumps(wire.batch(wire.reports("dark_mode", [True]))).encode()
    padded = valid + b" " * (2 * 1024 * 1024 - len(valid)) + b" trailing" * 100_000
    cut_json = b'{"version": 2, "pad": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    for port in (live_collector.port, collector.port):
        for body in (padded, cut_json):
            status, answer = _chunked_post(port, body)
            assert (status, answer["error"]["code"]) == (413, "body_too_large"), port
        status, answer = _chunked_post(port, valid)
        assert (status, answer["accepted"]) == (200, 1), port
