"""The batch wire format: one validation function for client and collector."""

import json

import pytest

from veil.shared import Registry, WireFormatError, validate_batch
from veil.shared.wire import join_batch, make_batch, make_report

REGISTRY = Registry.from_toml(
    """
[metrics.homepage]
kind = "string"
k = 16
h = 2
m = 4

[metrics.flag]
kind = "boolean"

[metrics.load]
kind = "number"
low = 0
high = 10

[metrics.browser]
kind = "category"
categories = ["a", "b", "c"]
"""
)
ID = "0123456789abcdef0123456789abcdef"


def batch(*reports):
    return make_batch("f" * 32, reports)


def test_valid_reports_of_every_kind():
    result = validate_batch(
        batch(
            make_report(ID, "homepage", 3, "ff00"),
            make_report("1" * 32, "flag", None, 1),
            make_report("2" * 32, "load", None, -3.125),  # grid step 10/64: n = -20
            make_report("3" * 32, "browser", None, "05"),
        ),
        REGISTRY,
    )
    assert result.errors == []
    assert [r.value for r in result.reports] == [0xFF, 1, -3.125, 5]
    assert result.reports[0].cohort == 3
    assert result.reports[1].cohort == 0
    assert result.reports[0].to_wire() == make_report(ID, "homepage", 3, "ff00")


@pytest.mark.parametrize(
    ("report", "field", "code"),
    [
        ({"id": ID, "metric": "homepage", "cohort": 4, "payload": "0000"}, "reports[0].cohort", "bad_cohort"),
        ({"id": ID, "metric": "homepage", "payload": "0000"}, "reports[0].cohort", "bad_cohort"),
        ({"id": ID, "metric": "homepage", "cohort": True, "payload": "0000"}, "reports[0].cohort", "bad_cohort"),
        ({"id": ID, "metric": "homepage", "cohort": 0, "payload": "000000"}, "reports[0].payload", "wrong_length"),
        ({"id": ID, "metric": "nope", "payload": 1}, "reports[0].metric", "unknown_metric"),
        ({"id": ID.upper(), "metric": "flag", "payload": 1}, "reports[0].id", "bad_id"),
        ({"id": ID[:-1] + " ", "metric": "flag", "payload": 1}, "reports[0].id", "bad_id"),
        ({"id": ID[:16] + "g" + ID[17:], "metric": "flag", "payload": 1}, "reports[0].id", "bad_id"),
        ({"id": ["x"], "metric": "flag", "payload": 1}, "reports[0].id", "bad_id"),
        ({"id": ID, "metric": ["flag"], "payload": 1}, "reports[0].metric", "unknown_metric"),
        ({"id": ID, "metric": "homepage", "cohort": 1.0, "payload": "0000"}, "reports[0].cohort", "bad_cohort"),
        ({"id": ID, "metric": "homepage", "cohort": 0, "payload": "00 0"}, "reports[0].payload", "bad_hex"),
        ({"id": ID, "metric": "flag", "payload": True}, "reports[0].payload", "wrong_type"),
        ({"id": ID, "metric": "flag", "payload": 2}, "reports[0].payload", "wrong_type"),
        ({"id": ID, "metric": "flag", "cohort": 0, "payload": 1}, "reports[0].cohort", "unknown_field"),
        ({"id": ID, "metric": "flag", "payload": 1, "value": "yes"}, "reports[0].value", "unknown_field"),
        ({"id": ID, "metric": "load", "payload": "3"}, "reports[0].payload", "wrong_type"),
        ({"id": ID, "metric": "load", "payload": 10**400}, "reports[0].payload", "out_of_range"),
        ({"id": ID, "metric": "load", "payload": float("inf")}, "reports[0].payload", "out_of_range"),
        ({"id": ID, "metric": "load", "payload": float("nan")}, "reports[0].payload", "out_of_range"),
        ({"id": ID, "metric": "load", "payload": 1e6}, "reports[0].payload", "out_of_range"),
        ({"id": ID, "metric": "load", "payload": 3.3}, "reports[0].payload", "off_grid"),
        ({"id": ID, "metric": "load"}, "reports[0].payload", "missing"),
        (["not", "an", "object"], "reports[0]", "wrong_type"),
    ],
)
def test_bad_report_is_refused_alone(report, field, code):
    good = make_report("9" * 32, "flag", None, 0)
    result = validate_batch(batch(report, good), REGISTRY)
    assert [r.id for r in result.reports] == ["9" * 32]
    [error] = result.errors
    assert (error.index, error.field, error.code) == (0, field, code)
    assert error.message
    assert error.to_dict()["field"] == field


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ([], "body", "wrong_type"),
        ({"version": 2, "batch_id": ID, "reports": []}, "version", "unsupported_version"),
        ({"version": True, "batch_id": ID, "reports": []}, "version", "unsupported_version"),
        ({"version": 1.0, "batch_id": ID, "reports": []}, "version", "unsupported_version"),
        ({"version": 1, "batch_id": "x", "reports": []}, "batch_id", "bad_id"),
        ({"version": 1, "batch_id": ID, "reports": {}}, "reports", "wrong_type"),
        ({"version": 1, "batch_id": ID, "reports": []}, "reports", "empty"),
        ({"version": 1, "batch_id": ID, "reports": [], "device": "x"}, "device", "unknown_field"),
    ],
)
def test_batch_level_errors_raise(body, field, code):
    with pytest.raises(WireFormatError) as info:
        validate_batch(body, REGISTRY)
    assert (info.value.field, info.value.code) == (field, code)


def test_join_batch_is_make_batch_from_serialized_reports():
    """Joining reports stored as JSON text gives the same compact document as make_batch."""
    reports = [
        make_report(ID, "homepage", 3, "ff00"),
        make_report("1" * 32, "flag", None, 1),
        make_report("2" * 32, "load", None, -3.125),
    ]
    texts = [json.dumps(report, separators=(",", ":")) for report in reports]
    text = join_batch("f" * 32, texts)
    assert text == json.dumps(batch(*reports), separators=(",", ":"))
    assert json.loads(text) == batch(*reports)
    assert len(validate_batch(json.loads(text), REGISTRY).reports) == 3
    assert json.loads(join_batch("f" * 32, [])) == batch()


def test_batch_size_limit():
    reports = [make_report(f"{i:032x}", "flag", None, 1) for i in range(3)]
    assert len(validate_batch(batch(*reports), REGISTRY, max_reports=3).reports) == 3
    with pytest.raises(WireFormatError, match="limit is 2 per batch"):
        validate_batch(batch(*reports), REGISTRY, max_reports=2)


def test_number_payloads_are_bounded_and_on_the_grid():
    """Laplace payloads are low + step * n with n in [-bound, resolution + bound]."""
    params = REGISTRY["load"].params
    low, high = params.payload_range
    step = params.step
    assert low == -params.noise_bound * step and high == 10 + params.noise_bound * step
    accepted = [low, high, low + step, 100 * step, 5]  # an int on the grid counts too
    for payload in accepted:
        assert params.parse_payload(payload) == payload
    for payload in [low - step, high + step, 10**400, -1e300]:
        with pytest.raises(WireFormatError) as info:
            params.parse_payload(payload)
        assert info.value.code == "out_of_range"
    # a payload within float rounding of the grid is taken as its grid point
    assert params.parse_payload(5 * step + 1e-12) == 5 * step
