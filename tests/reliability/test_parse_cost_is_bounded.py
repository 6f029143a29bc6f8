"""What a body costs to parse is bounded by the batch limit, not by how many tiny values fit in it.

JSON of tiny values (``[{},{},...]``) costs tens of bytes of Python objects per byte
sent: 8 concurrent 8 MiB bodies took a collector from 46 MB to over 600 MB. The
collector counts the objects, arrays and commas of a body first, and refuses more
than a batch of ``MAX_REPORTS_PER_BATCH`` reports can hold before building any object.
"""

from __future__ import annotations

import os
import tracemalloc

from veil.shared.wire import make_batch, make_report

MAX_REPORTS = 100


def test_a_flood_of_tiny_values_is_refused_before_parsing_and_a_full_batch_is_not(
        app_factory, test_registry):
    client = app_factory(MAX_REPORTS_PER_BATCH=MAX_REPORTS).test_client()
    params = test_registry["homepage"].params
    full = make_batch(os.urandom(16).hex(), [
        make_report(os.urandom(16).hex(), "homepage", index % params.m, os.urandom(4).hex(),
                    params.fingerprint)
        for index in range(MAX_REPORTS)
    ])
    response = client.post("/v1/reports", json=full)
    assert response.status_code == 200, response.json
    assert response.json["accepted"] == MAX_REPORTS

    flood = b"[" + b",".join([b"{}"] * 350_000) + b"]"
    tracemalloc.start()
    try:
        response = client.post("/v1/reports", data=flood, content_type="application/json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert response.status_code == 400
    assert (response.json["error"]["code"], response.json["error"]["field"]) == ("too_many", "body")
    assert peak < 4 * len(flood)
