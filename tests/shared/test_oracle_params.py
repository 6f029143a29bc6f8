"""Parameters of the category oracles: declaration, ``auto``, registry and wire rules."""

from __future__ import annotations

import math

import pytest

from veil.shared.errors import ParameterError
from veil.shared.kinds import (
    CategoryParams,
    FlhParams,
    GrrParams,
    HadamardParams,
    HcmsParams,
    OlhParams,
    OueParams,
    parse_params,
)
from veil.shared.kinds.oracles.olh import MAX_OLH_RESPONSES
from veil.shared.registry import Metric, Registry
from veil.shared.wire import make_batch, make_report, validate_batch

ORACLE_CLASSES = (GrrParams, OueParams, OlhParams, HadamardParams)
CATS = [f"c{i}" for i in range(1024)]


@pytest.mark.parametrize("cls", ORACLE_CLASSES)
@pytest.mark.parametrize("epsilon", [0.01, 0.5, 1.0, 4.0, 8.0, 20.0])
def test_realized_epsilons_never_exceed_the_declared_ones(cls, epsilon) -> None:
    for d in (2, 3, 16, 1000):
        for report in (epsilon, epsilon / 2, epsilon / 10):
            params = cls(categories=CATS[:d], epsilon=epsilon, report_epsilon=report)
            assert params.epsilon_inf <= epsilon * (1 + 1e-9)
            assert params.epsilon_1 <= report * (1 + 1e-9)
            assert params.epsilon_1 <= params.epsilon_inf * (1 + 1e-9)
            # and rounding towards less information costs little: within 1e-6 of the target
            # unless the 32-bit probabilities saturate (epsilon 20 over few categories)
            if epsilon < 20:
                assert params.epsilon_inf >= epsilon - 1e-6
            p, q = params.support_probs
            assert p > q


def test_report_epsilon_defaults_to_half_and_cannot_exceed_epsilon() -> None:
    assert GrrParams(categories=("a", "b"), epsilon=3.0).report_epsilon == 1.5
    with pytest.raises(ParameterError, match="report_epsilon") as info:
        OueParams(categories=("a", "b"), epsilon=1.0, report_epsilon=2.0)
    assert info.value.field == "report_epsilon"
    with pytest.raises(ParameterError, match="epsilon"):
        GrrParams(categories=("a", "b"), epsilon=0.0)
    with pytest.raises(ParameterError, match="listed twice"):
        GrrParams(categories=("a", "b", "a"))
    with pytest.raises(ParameterError, match="2 to 65536"):
        HadamardParams(categories=("only",))


def test_olh_picks_a_prime_that_fits_and_refuses_others() -> None:
    params = OlhParams(categories=CATS, epsilon=4.0, report_epsilon=4.0)
    g = params.buckets
    assert all(g % f for f in range(2, math.isqrt(g) + 1))
    assert params.responses <= MAX_OLH_RESPONSES
    assert params.functions >= params.d
    # Wang et al.'s optimum is e^epsilon + 1 = 55.6; the best prime within the table cap
    assert abs(g - (math.exp(4.0) + 1)) < 10
    with pytest.raises(ParameterError, match="prime") as info:
        OlhParams(categories=CATS, epsilon=1.0, g=4)
    assert info.value.field == "g"
    with pytest.raises(ParameterError, match="counters"):
        OlhParams(categories=CATS, epsilon=1.0, g=1021)


def test_olh_hash_family_collides_for_exactly_one_function_in_g() -> None:
    params = OlhParams(categories=CATS[:30], epsilon=1.0, g=3)
    for x, y in [(0, 1), (5, 29), (13, 14)]:
        collisions = sum(params.hash(a, x) == params.hash(a, y) for a in range(params.functions))
        assert collisions * params.buckets == params.functions


def test_existing_category_registries_keep_their_meaning() -> None:
    rappor = CategoryParams(categories=("a", "b"))
    assert "oracle" not in rappor.to_dict()
    params, note = parse_params({"kind": "category", "oracle": "rappor", "categories": ["a", "b"]})
    assert params == rappor and note == ""
    assert parse_params({"kind": "category", "categories": ["a", "b"]})[0].fingerprint \
        == rappor.fingerprint


def test_auto_chooses_by_variance_and_says_why() -> None:
    small, note = parse_params({"kind": "category", "oracle": "auto", "epsilon": 4.0,
                                "categories": CATS[:4]})
    assert isinstance(small, GrrParams) and note.startswith("auto chose grr")
    large, note = parse_params({"kind": "category", "oracle": "auto", "epsilon": 2.0,
                                "categories": CATS})
    # OUE's variance is the lowest, OLH's within 5% with 2-byte reports instead of 128
    assert isinstance(large, OlhParams), note
    assert large.share_variance() <= 1.05 * OueParams(categories=tuple(CATS),
                                                      epsilon=2.0).share_variance()
    for other in ("grr", "oue", "hadamard"):
        assert other in note
    tiny, note = parse_params({"kind": "category", "oracle": "auto", "epsilon": 2.0,
                               "categories": CATS[:200], "max_report_bytes": 1})
    assert isinstance(tiny, GrrParams | HadamardParams) and tiny.report_bytes <= 1
    with pytest.raises(ParameterError, match="no oracle fits"):
        parse_params({"kind": "category", "oracle": "auto", "epsilon": 2.0,
                      "categories": CATS, "max_report_bytes": 1})
    with pytest.raises(ParameterError, match="needs the epsilon"):
        parse_params({"kind": "category", "oracle": "auto", "categories": CATS})
    with pytest.raises(ParameterError, match="'p'"):
        parse_params({"kind": "category", "oracle": "auto", "epsilon": 1.0, "p": 0.5,
                      "categories": CATS})


def test_unknown_or_misplaced_oracles_are_refused_with_the_choices() -> None:
    with pytest.raises(ParameterError, match=r"'grr'.*'auto'") as info:
        parse_params({"kind": "category", "oracle": "rr", "categories": ["a", "b"]})
    assert info.value.field == "oracle"
    with pytest.raises(ParameterError, match=r"'rappor', 'flh', 'hcms', 'auto'"):
        parse_params({"kind": "string", "oracle": "grr"})
    with pytest.raises(ParameterError, match="more than max_report_bytes"):
        parse_params({"kind": "category", "oracle": "oue", "categories": CATS,
                      "max_report_bytes": 16})


def test_the_served_registry_carries_the_choice_and_the_same_fingerprint() -> None:
    toml = """
version = 1
[metrics.browser]
kind = "category"
oracle = "auto"
epsilon = 2.0
categories = ["chrome", "firefox", "safari", "other"]
"""
    registry = Registry.from_toml(toml)
    metric = registry["browser"]
    assert metric.note.startswith("auto chose")
    served = Registry.from_dict(registry.to_dict())
    assert served["browser"].params == metric.params
    assert served["browser"].params.fingerprint == metric.params.fingerprint
    assert served["browser"].note == metric.note
    assert served["browser"].to_dict()["oracle"] == metric.params.oracle
    # the TOML written back names the concrete oracle and parses to the same parameters
    again = Registry.from_toml(registry.to_toml())
    assert again["browser"].params.fingerprint == metric.params.fingerprint


@pytest.mark.parametrize("cls", [GrrParams, OlhParams, HadamardParams])
def test_wire_refuses_payloads_these_oracles_cannot_produce(cls) -> None:
    params = cls(categories=("a", "b", "c"), epsilon=2.0)
    registry = Registry([Metric("m", params)])

    def check(payload, version=2):
        report = make_report("a" * 32, "m", None, payload, params.fingerprint)
        if version == 1:
            report.pop("params")
        result = validate_batch(make_batch("b" * 32, [report], version=version), registry)
        return [(error.field, error.code) for error in result.errors]

    assert check(params.responses - 1) == []
    assert check(params.responses) == [("reports[0].payload", "out_of_range")]
    assert check(-1) == [("reports[0].payload", "out_of_range")]
    assert check(True) == [("reports[0].payload", "wrong_type")]
    assert check(1.0) == [("reports[0].payload", "wrong_type")]
    assert check("01") == [("reports[0].payload", "wrong_type")]
    assert check(0, version=1) == [("reports[0].version", "unsupported_version")]


def test_wire_refuses_an_oue_payload_of_another_shape() -> None:
    params = OueParams(categories=tuple(CATS[:10]), epsilon=2.0)
    registry = Registry([Metric("m", params)])
    for payload, code in [(3, "wrong_type"), ("ff", "wrong_length"), ("ff07", "pad_bits")]:
        report = make_report("a" * 32, "m", None, payload, params.fingerprint)
        result = validate_batch(make_batch("b" * 32, [report]), registry)
        assert [e.code for e in result.errors] == [code]


def test_a_lenient_parse_leaves_out_metrics_of_a_newer_version() -> None:
    served = {"version": 1, "metrics": {
        "flag": {"kind": "boolean", "alpha": 0.5},
        "later": {"kind": "category", "oracle": "cms", "categories": ["a", "b"]},
    }}
    with pytest.raises(ParameterError, match="oracle"):
        Registry.from_dict(served)
    registry = Registry.from_dict(served, lenient=True)
    assert list(registry) == ["flag"]
    assert "oracle" in registry.skipped["later"]


@pytest.mark.parametrize("cls", (*ORACLE_CLASSES, FlhParams, HcmsParams))
def test_a_report_epsilon_whose_reports_say_nothing_is_refused(cls) -> None:
    """Below ln((p + 2**-32) / p), the instantaneous response's numerator realizes as 0:
    every report would be uniform noise, stated as epsilon_1 = 5e-324."""
    extra = {"categories": ("a", "b")} if cls in ORACLE_CLASSES else {}
    with pytest.raises(ParameterError, match="below what probabilities of 32 bits can realize"
                       ) as info:
        cls(epsilon=2.0, report_epsilon=1e-300, **extra)
    assert info.value.field == "report_epsilon"
    least = float(str(info.value).split("(at least ")[1].split(")")[0])
    assert cls(epsilon=2.0, report_epsilon=least, **extra).epsilon_1 > 0


def test_an_hcms_epsilon_whose_bit_says_nothing_is_refused() -> None:
    with pytest.raises(ParameterError, match=r"at least 0\.000000000932") as info:
        HcmsParams(epsilon=1e-300)
    assert info.value.field == "epsilon"


def test_an_epsilon_beyond_the_float_range_is_refused_before_it_is_halved() -> None:
    with pytest.raises(ParameterError, match=r"must be a number in \(0, 20\]") as info:
        parse_params({"kind": "category", "oracle": "grr", "categories": ["a", "b"],
                      "epsilon": 10**400})
    assert info.value.field == "epsilon"


@pytest.mark.parametrize("oracle", ["grr", "auto", "flh"])
@pytest.mark.parametrize("cap", ["1", 1.5, 0, True])
def test_max_report_bytes_is_a_whole_number_of_bytes_named_as_such(oracle, cap) -> None:
    kind = "string" if oracle == "flh" else "category"
    settings = {"kind": kind, "oracle": oracle, "epsilon": 2.0, "max_report_bytes": cap}
    with pytest.raises(ParameterError) as info:
        parse_params({**settings, **({"categories": ["a", "b"]} if kind == "category" else {})})
    assert info.value.field == "max_report_bytes"
    assert str(info.value) == (f"max_report_bytes must be an integer >= 1, the most bytes one "
                               f"report may take. Got {cap!r} instead.")


def test_a_named_string_oracle_keeps_to_max_report_bytes() -> None:
    assert parse_params({"kind": "string", "oracle": "flh", "max_report_bytes": 2})[0]
    with pytest.raises(ParameterError, match="flh reports take 2 bytes, more than "
                                             "max_report_bytes=1") as info:
        parse_params({"kind": "string", "oracle": "flh", "max_report_bytes": 1})
    assert info.value.field == "max_report_bytes"


@pytest.mark.parametrize("cls", (*ORACLE_CLASSES, FlhParams, HcmsParams))
def test_an_epsilon_whose_permanent_response_says_nothing_is_refused(cls) -> None:
    """Below the least positive epsilon the permanent response's numerator realizes, it is
    uniform noise: GRR, OUE, OLH, Hadamard and FLH accepted epsilon = 1e-12 so, stating
    epsilon_inf = 5e-324 with an infinite variance (HCMS refused it already)."""
    extra = {"categories": ("a", "b", "c", "d")} if cls in ORACLE_CLASSES else {}
    with pytest.raises(ParameterError, match="below what probabilities of 32 bits can realize"
                       ) as info:
        cls(epsilon=1e-12, **extra)
    assert info.value.field == "epsilon"
    least = float(str(info.value).split("(at least ")[1].split(")")[0])
    params = cls(epsilon=least, report_epsilon=least, **extra)
    assert 0 < params.epsilon_inf <= least and params.share_variance(0.1, 1000) < math.inf
