"""The HTTP API's contract: every error is 4xx JSON naming the field, reads need the token."""

from __future__ import annotations

import json

import pytest
import requests

JSON = {"Content-Type": "application/json"}


def post(collector, body: bytes | str, headers: dict[str, str] | None = None) -> requests.Response:
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return requests.post(collector.url + "/v1/reports", data=data, headers=headers or JSON,
                         timeout=30)


def error_of(response: requests.Response) -> dict:
    """The ``error`` object of a JSON error response (asserting its shape)."""
    assert response.headers["Content-Type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"code", "field", "message"} and error["message"]
    return error


def test_health_readiness_and_registry(live_collector):
    assert requests.get(live_collector.url + "/healthz", timeout=10).json() == {"status": "ok"}
    assert requests.get(live_collector.url + "/readyz", timeout=10).json() == {"status": "ready"}
    served = requests.get(live_collector.url + "/v1/metrics", timeout=10)
    assert served.status_code == 200
    assert served.json() == live_collector.registry.to_dict()


def test_openapi_document_lists_every_route(live_collector):
    document = requests.get(live_collector.url + "/v1/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]) == {"/healthz", "/readyz", "/v1/openapi.json", "/v1/metrics",
                                      "/v1/reports", "/v1/metrics/{name}/counts"}
    batch = document["components"]["schemas"]["Batch"]
    assert batch["properties"]["reports"]["maxItems"] == 5000


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ("{not json", "body", "bad_json"),
        ('{"version": 1, "version": 1}', "body", "bad_json"),
        ("[NaN]", "body", "bad_json"),
        ('{"x": Infinity}', "body", "bad_json"),
        ("[" * 100_000, "body", "bad_json"),
        ("9" * 5000, "body", "bad_json"),
        ("\ud800", "body", "bad_json"),
        ("[]", "body", "wrong_type"),
        ('{"version": 2, "batch_id": "' + "a" * 32 + '", "reports": []}', "version",
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
def test_batch_level_errors_are_400_json_naming_the_field(live_collector, body, field, code):
    response = post(live_collector, body)
    assert response.status_code == 400
    error = error_of(response)
    assert (error["field"], error["code"]) == (field, code)


def test_invalid_utf8_is_refused(live_collector):
    response = post(live_collector, b'{"version": 1, "batch_id": "\xff\xfe"}')
    assert response.status_code == 400
    assert error_of(response)["code"] == "bad_json"
    assert "UTF-8" in error_of(response)["message"]


def test_too_many_reports_in_one_batch(collector_factory, wire):
    collector = collector_factory(max_reports=3)
    batch = wire.batch(wire.reports("dark_mode", [True] * 4))
    response = requests.post(collector.url + "/v1/reports", json=batch, timeout=30)
    assert response.status_code == 400
    error = error_of(response)
    assert (error["field"], error["code"]) == ("reports", "too_many")
    assert "3" in error["message"]


def test_oversized_body_is_413_json(collector_factory):
    collector = collector_factory(max_body_bytes=4096)
    response = post(collector, b"[" + b"0," * 4000 + b"0]")
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"
    assert "4096" in error_of(response)["message"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=latin-1"])
def test_wrong_content_type_is_415(live_collector, wire, content_type):
    body = json.dumps(wire.batch(wire.reports("dark_mode", [True])))
    headers = {"Content-Type": content_type} if content_type else {}
    response = requests.post(live_collector.url + "/v1/reports", data=body.encode(),
                             headers=headers, timeout=30)
    assert response.status_code == 415
    assert error_of(response)["field"] == "Content-Type"


def test_bad_reports_are_refused_one_by_one_and_good_ones_kept(live_collector, wire):
    good = wire.reports("homepage", ["a.example", "b.example"])
    k_hex = 2 * (live_collector.registry["homepage"].params.k // 8)
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
    batch = wire.batch([good[0], *bad, good[1]])
    response = requests.post(live_collector.url + "/v1/reports", json=batch, timeout=30)
    assert response.status_code == 200
    receipt = response.json()
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
    assert live_collector.counts("homepage")["reports"] == 2
    with pytest.raises(requests.HTTPError):
        live_collector.counts("dark_mode")  # nothing stored: 0 < min_reports = 1


def test_number_payloads_the_mechanism_cannot_produce_are_refused(live_collector, wire):
    """Forged Laplace payloads (far out, off the grid) never reach the sums: counts stay
    finite JSON and the mean stays that of the honest reports."""
    params = live_collector.registry["load_time"].params
    honest = wire.reports("load_time", [5.0] * 50)
    low, high = params.payload_range
    forged = [1e6, 1e300, -1e300, high + params.step, low - params.step, 5.0 + params.step / 3]
    bad = [{"id": f"{i:032x}", "metric": "load_time", "payload": v} for i, v in enumerate(forged)]
    response = requests.post(live_collector.url + "/v1/reports", json=wire.batch(honest + bad),
                             timeout=30)
    receipt = response.json()
    assert (receipt["accepted"], receipt["rejected"]) == (50, len(forged))
    assert [e["code"] for e in receipt["errors"]] == ["out_of_range"] * 5 + ["off_grid"]
    raw = requests.get(live_collector.url + "/v1/metrics/load_time/counts",
                       headers=live_collector.headers(), timeout=10).text
    document = json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in counts"))
    assert document == {**document, **wire.expected("load_time", honest)}


def test_counts_need_the_read_token(live_collector):
    url = live_collector.url + "/v1/metrics/homepage/counts"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"},
                    {"Authorization": f"Bearer {live_collector.token}x"},
                    {"Authorization": "Bearer \u00e9"}):
        response = requests.get(url, headers={k: v.encode() for k, v in headers.items()},
                                timeout=10)
        assert response.status_code == 401
        assert error_of(response)["field"] == "Authorization"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_counts_refused_below_min_reports_with_the_numbers(live_collector, wire):
    sent = wire.reports("rare", ["x"] * 49)
    requests.post(live_collector.url + "/v1/reports", json=wire.batch(sent), timeout=30)
    url = live_collector.url + "/v1/metrics/rare/counts"
    response = requests.get(url, headers=live_collector.headers(), timeout=10)
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "too_few_reports"
    assert "49" in error["message"] and "50" in error["message"]
    more = wire.reports("rare", ["x"])
    requests.post(live_collector.url + "/v1/reports", json=wire.batch(more), timeout=30)
    assert live_collector.counts("rare")["reports"] == 50


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
def test_counts_query_errors(live_collector, path, status, code, field):
    response = requests.get(live_collector.url + path, headers=live_collector.headers(),
                            timeout=10)
    assert response.status_code == status
    error = error_of(response)
    assert (error["code"], error["field"]) == (code, field)


def test_unknown_routes_and_methods_are_json(live_collector):
    response = requests.get(live_collector.url + "/v1/nothing", timeout=10)
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    response = requests.get(live_collector.url + "/v1/reports", timeout=10)
    assert response.status_code == 405 and error_of(response)["code"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]


def test_upload_token_when_configured(collector_factory, wire):
    collector = collector_factory(upload_token="up-secret")
    batch = wire.batch(wire.reports("dark_mode", [True]))
    url = collector.url + "/v1/reports"
    refused = requests.post(url, json=batch, timeout=30)
    assert refused.status_code == 401 and error_of(refused)["field"] == "Authorization"
    wrong = requests.post(url, json=batch, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    accepted = requests.post(url, json=batch, headers={"Authorization": "Bearer up-secret"},
                             timeout=30)
    assert accepted.status_code == 200 and accepted.json()["accepted"] == 1
    # the read token is not an upload token
    other = requests.post(url, json=wire.batch(wire.reports("dark_mode", [True])),
                          headers=collector.headers(), timeout=30)
    assert other.status_code == 401


def test_nothing_about_the_client_is_stored(collector, wire):
    """No address or user agent in the database or the server's log."""
    agent = "VeilProbeAgent/9.9"
    batch = wire.batch(wire.reports("dark_mode", [True, False]))
    requests.post(collector.url + "/v1/reports", json=batch, headers={"User-Agent": agent},
                  timeout=30)
    collector.stop()
    files = [p for p in collector.workdir.iterdir() if p.is_file()]
    assert any(p.name == "veil.db" for p in files)
    for path in files:
        data = path.read_bytes()
        assert agent.encode() not in data, path.name
        assert b"127.0.0.1" not in data, path.name


def test_unavailable_storage_is_503_with_retry_after(tmp_path, wire):
    """A collector whose database is gone answers 503 (clients retry), never a traceback."""
    import threading

    from werkzeug.serving import make_server

    from veil.server.collector import EXTENSION, create_app

    app = create_app({"REGISTRY": wire.registry, "DATABASE": tmp_path / "v.db",
                      "READ_TOKENS": ["t"]})
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        app.extensions[EXTENSION].storage.close()
        batch = wire.batch(wire.reports("dark_mode", [True]))
        response = requests.post(url + "/v1/reports", json=batch, timeout=10)
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert error_of(response)["code"] == "unavailable"
        ready = requests.get(url + "/readyz", timeout=10)
        assert ready.status_code == 503 and error_of(ready)["code"] == "unavailable"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
