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
#: each metric's parameter fingerprint, which version 2 reports carry
FP = {name: metric.params.fingerprint for name, metric in REGISTRY.items()}


def batch(*reports):
    return make_batch("f" * 32, reports)


def test_valid_reports_of_every_kind():
    result = validate_batch(
        batch(
            make_report(ID, "homepage", 3, "ff00", FP["homepage"]),
            make_report("1" * 32, "flag", None, 1, FP["flag"]),
            make_report("2" * 32, "load", None, -3.125, FP["load"]),  # grid step 10/64: n = -20
            make_report("3" * 32, "browser", None, "05", FP["browser"]),
        ),
        REGISTRY,
    )
    assert result.errors == []
    assert [r.value for r in result.reports] == [0xFF, 1, -3.125, 5]
    assert result.reports[0].cohort == 3
    assert result.reports[1].cohort == 0
    assert result.reports[0].to_wire(FP["homepage"]) == make_report(ID, "homepage", 3, "ff00",
                                                                    FP["homepage"])


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
    if isinstance(report, dict):  # a version 2 report: with its metric's fingerprint, if any
        metric = report.get("metric")
        report = {"params": FP.get(metric, "0" * 16) if isinstance(metric, str) else "0" * 16,
                  **report}
    good = make_report("9" * 32, "flag", None, 0, FP["flag"])
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
        ({"version": 3, "batch_id": ID, "reports": []}, "version", "unsupported_version"),
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
        make_report(ID, "homepage", 3, "ff00", FP["homepage"]),
        make_report("1" * 32, "flag", None, 1, FP["flag"]),
        make_report("2" * 32, "load", None, -3.125, FP["load"]),
    ]
    texts = [json.dumps(report, separators=(",", ":")) for report in reports]
    text = join_batch("f" * 32, texts)
    assert text == json.dumps(batch(*reports), separators=(",", ":"))
    assert json.loads(text) == batch(*reports)
    assert len(validate_batch(json.loads(text), REGISTRY).reports) == 3
    assert json.loads(join_batch("f" * 32, [])) == batch()


def test_batch_size_limit():
    reports = [make_report(f"{i:032x}", "flag", None, 1, FP["flag"]) for i in range(3)]
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


def test_reports_must_carry_the_fingerprint_of_the_metric_parameters():
    """A report encoded with other parameters is refused, never decoded with these."""
    other = Registry.from_toml("""
[metrics.homepage]
kind = "string"
k = 16
h = 2
m = 4
f = 0.25
""")["homepage"].params
    reports = [
        make_report(ID, "homepage", 3, "ff00", other.fingerprint),
        {"id": "1" * 32, "metric": "flag", "payload": 1},
        make_report("2" * 32, "flag", None, 1, FP["flag"]),
    ]
    result = validate_batch(batch(*reports), REGISTRY)
    assert [(e.index, e.field, e.code) for e in result.errors] == [
        (0, "reports[0].params", "stale_params"), (1, "reports[1].params", "missing")]
    assert "fetch the registry" in result.errors[0].message
    assert [r.id for r in result.reports] == ["2" * 32]


def test_version_1_batches_are_accepted_without_fingerprints():
    """Clients older than wire version 2 keep working; version 1 reports carry no params."""
    legacy = make_batch("f" * 32, [make_report(ID, "flag", None, 1, None)], version=1)
    assert [r.id for r in validate_batch(legacy, REGISTRY).reports] == [ID]
    mixed = make_batch("f" * 32, [make_report(ID, "flag", None, 1, FP["flag"])], version=1)
    [error] = validate_batch(mixed, REGISTRY).errors
    assert (error.field, error.code) == ("reports[0].params", "unknown_field")


def test_fingerprints_name_the_parameters():
    """Equal parameters share a fingerprint; any change of a parameter changes it."""
    params = REGISTRY["homepage"].params
    again = Registry.from_dict(REGISTRY.to_dict())["homepage"].params
    assert params.fingerprint == again.fingerprint and len(params.fingerprint) == 16
    changed = {type(params).from_dict({**params.to_dict(), key: value}).fingerprint
               for key, value in [("k", 32), ("h", 3), ("m", 8), ("p", 0.25), ("q", 0.8),
                                  ("f", 0.25)]}
    assert params.fingerprint not in changed and len(changed) == 6
    number = REGISTRY["load"].params  # low = 0 and high = 10 are written as integers
    assert number.fingerprint == type(number)(low=0.0, high=10.0).fingerprint


DETERMINISTIC = Registry.from_toml("""
[metrics.plain_category]
kind = "category"
categories = ["a", "b", "c"]
p = 0.0
q = 1.0
f = 0.0

[metrics.plain_string]
kind = "string"
k = 16
h = 2
m = 2
p = 0.0
q = 1.0
f = 0.0
""")


@pytest.mark.parametrize(("metric", "values"), [("plain_category", ["a", "b", "c"]),
                                                ("plain_string", ["x", "y", "z", "w"])])
def test_at_infinite_epsilon_only_payloads_the_encoder_can_produce_are_accepted(metric, values):
    """With p = 0, q = 1, f = 0 (epsilon infinite) a report is its value's bits exactly:
    one bit for a category, 1 to h for a string. A payload with more bits, or none, is
    one no client can send, and is refused by name; every payload the SDK's encoder makes
    at these parameters is accepted (the boundary the rule is drawn at)."""
    import os

    from veil.client.encoders import make_encoder

    spec = DETERMINISTIC[metric]
    params = spec.params
    for value in values:
        encoder = make_encoder(spec, os.urandom(32), 1)
        report = make_report("ab" * 16, metric, encoder.cohort, encoder.encode(value),
                             params.fingerprint)
        assert validate_batch(batch(report), DETERMINISTIC).reports
    width = (params.k + 7) // 8
    most = 1 if metric == "plain_category" else params.h
    too_many = ((1 << (most + 1)) - 1).to_bytes(width, "little").hex()
    cohort = None if metric == "plain_category" else 0
    for payload in (too_many, "00" * width):
        report = make_report("cd" * 16, metric, cohort, payload, params.fingerprint)
        outcome = validate_batch(batch(report), DETERMINISTIC)
        assert not outcome.reports
        (error,) = outcome.errors
        assert (error.field, error.code) == ("reports[0].payload", "out_of_range")
