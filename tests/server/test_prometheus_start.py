"""``GET /metrics`` of a collector that has just started: every counter an alert may watch is
there at 0 (the refusal and rejection counters too, with their common codes), with the
serving process's ``process_*`` metrics and the version in ``veil_build_info``; with one
worker and with several (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from veil.shared.version import __version__


def scrape(collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = requests.get(collector.url + "/metrics", headers=collector.headers(), timeout=30)
    assert answer.status_code == 200, answer.text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text)
            for sample in family.samples}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_fresh_collector_exports_every_counter_at_zero(collector_factory, workers) -> None:
    samples = scrape(collector_factory(workers=workers))
    assert samples[("veil_build_info", (("version", __version__),))] == 1
    for code in ("rate_limited", "unauthorized", "body_too_large", "bad_json"):
        assert samples[("veil_batches_refused_total", (("code", code),))] == 0
    for code in ("stale_params", "wrong_type", "out_of_range", "unknown_metric"):
        assert samples[("veil_reports_rejected_total", (("code", code),))] == 0
    assert samples[("veil_reports_accepted_total", ())] == 0
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in samples
