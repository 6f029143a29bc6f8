"""Property-based fuzzing of POST /v1/reports: no input gives a 5xx or changes counts unless valid.

Requests go through Flask's test client; with ``TESTING`` an unhandled exception in
the app fails the example with its traceback instead of becoming a 500.
"""

from __future__ import annotations

import json
import sqlite3
from urllib.parse import quote, urlencode

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                       children, max_size=4),
    max_leaves=20,
)
hex_ids = st.binary(min_size=16, max_size=16).map(bytes.hex)
metrics = st.sampled_from(["homepage", "browser", "dark_mode", "load_time", "battery", "latency",
                           "rare", "unknown", ""])
payloads = (st.binary(min_size=0, max_size=6).map(bytes.hex) | st.sampled_from([0, 1, 2, -1])
            | st.floats(allow_nan=False, allow_infinity=False) | json_values)
reports = st.fixed_dictionaries(
    {"id": hex_ids | st.text(max_size=34), "metric": metrics, "payload": payloads},
    optional={"cohort": st.integers(min_value=-2, max_value=6) | json_values,
              "extra": json_values},
)
#: reports that can never be valid: an unknown metric, or a field no report has
invalid_reports = (reports.map(lambda r: {**r, "metric": "no-such-metric"})
                   | reports.map(lambda r: {**r, "origin": "device"}))
batches = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 1, 2, "1", True]),
     "batch_id": hex_ids | st.text(max_size=4),
     "reports": st.lists(reports, min_size=0, max_size=8)},
)


def totals(db_path) -> tuple[int, int]:
    """Raw stored reports, and the reports the aggregates account for with those past the
    fold mark, which readers count on the spot."""
    with sqlite3.connect(db_path) as conn:
        raw = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
        aggregated = conn.execute("SELECT coalesce(sum(reports), 0) FROM folded_aggregates").fetchone()[0]
        aggregated += conn.execute(
            "SELECT count(*) FROM reports WHERE rowid > (SELECT CAST(value AS INTEGER) FROM meta "
            "WHERE key = 'folded_rowid')").fetchone()[0]
    conn.close()
    return raw, aggregated


def check(client, body: bytes) -> None:
    before = totals(client.db_path)
    assert before[0] == before[1]
    response = client.post("/v1/reports", data=body, content_type="application/json")
    assert response.status_code < 500, response.text
    after = totals(client.db_path)
    assert after[0] == after[1]
    if response.status_code == 200:
        receipt = response.json
        assert after[0] - before[0] == receipt["accepted"]
    else:
        assert set(response.json["error"]) == {"code", "field", "message"}
        assert after == before


@SETTINGS
@given(body=st.binary(max_size=300))
def test_arbitrary_bytes(client, body):
    check(client, body)


@SETTINGS
@given(value=json_values)
def test_arbitrary_json(client, value):
    check(client, json.dumps(value).encode())


@SETTINGS
@given(batch=batches, ensure_ascii=st.booleans())
def test_batch_shaped_json(client, batch, ensure_ascii):
    check(client, json.dumps(batch, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass"))


@SETTINGS
@given(data=st.data())
def test_valid_reports_mixed_with_junk_are_counted_exactly_once(client, wire, data):
    """Genuine reports (some resent) among junk: accepted = the genuine ones not seen before."""
    pool = getattr(client, "fuzz_pool", None)
    if pool is None:
        pool = [*wire.reports("homepage", ["a", "b", "c"] * 4),
                *wire.reports("dark_mode", [True, False] * 3),
                *wire.reports("load_time", [1.0, 9.0])]
        client.fuzz_pool = pool
        client.fuzz_seen = set()
    genuine = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6))
    junk = data.draw(st.lists(invalid_reports, max_size=4))
    mixed = data.draw(st.permutations([*genuine, *junk]))
    batch = wire.batch(mixed)
    response = client.post("/v1/reports", json=batch)
    assert response.status_code == 200, response.text
    receipt = response.json
    fresh = {r["id"] for r in genuine} - client.fuzz_seen
    client.fuzz_seen |= fresh
    assert receipt["accepted"] == len(fresh)
    assert receipt["rejected"] == len(junk)
    assert receipt["accepted"] + receipt["duplicates"] == len(genuine)
    stored = [r for r in pool if r["id"] in client.fuzz_seen]
    for metric in ("homepage", "dark_mode"):
        if any(r["metric"] == metric for r in stored):
            assert client.counts(metric)["cohorts"] == wire.expected(metric, stored)["cohorts"]


@SETTINGS
@given(name=st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s and s not in ".."),
       query=st.dictionaries(st.sampled_from(["start", "end", "format", "x"]), st.text(max_size=12),
                             max_size=3),
       token=st.one_of(st.none(), st.text(max_size=20).filter(
           lambda t: "\r" not in t and "\n" not in t)))
def test_counts_endpoint_never_fails_on_odd_names_queries_or_tokens(client, name, query, token):
    # the token's UTF-8 bytes as a WSGI server hands them to the app: read as latin-1 (PEP 3333)
    headers = client.headers() if token is None else {
        "Authorization": ("Bearer " + token).encode("utf-8", "surrogatepass").decode("latin-1")}
    response = client.get(f"/v1/metrics/{quote(name, safe='')}/counts",
                          query_string=urlencode(query), headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert set(response.json["error"]) == {"code", "field", "message"}
