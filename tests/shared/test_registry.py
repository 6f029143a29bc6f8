"""The TOML metric registry."""

import pytest

from veil.shared import Metric, ParameterError, Registry, StringParams
from veil.shared.kinds import parse_params
from veil.shared.registry import METRIC_KEYS

TOML = """
version = 3

[metrics.homepage]
kind = "string"
description = "Home page \\"host\\""
min_reports = 1000
k = 64

[metrics.browser]
kind = "category"
categories = ["chrome", "firefox"]
f = 0.25

[metrics.height]
kind = "number"
low = 100
high = 250
mechanism = "gaussian"
epsilon = 0.5
delta = 1e-6
"""


def test_parse_and_round_trip():
    registry = Registry.from_toml(TOML)
    assert registry.version == 3
    assert list(registry) == ["homepage", "browser", "height"]
    assert registry["homepage"].params == StringParams(k=64)
    assert registry["homepage"].min_reports == 1000
    assert registry["homepage"].description == 'Home page "host"'
    assert Registry.from_toml(registry.to_toml()) == registry
    assert Registry.from_dict(registry.to_dict()) == registry


def test_a_metrics_own_keys_stand_beside_its_parameters():
    """``METRIC_KEYS`` are the metric's, written before the parameters; the rest of a
    written metric reads back as its parameters."""
    metric = Metric("homepage", StringParams(k=64), description="host", min_reports=500,
                    note="chosen by hand")
    written = metric.to_dict()
    assert list(written)[:4] == ["kind", *(key for key in METRIC_KEYS if key != "of")]
    assert "of" not in written  # only a string metric's channel belongs to another metric
    params, note = parse_params({key: value for key, value in written.items()
                                 if key not in METRIC_KEYS})
    assert (params, note) == (metric.params, "")
    assert "note" not in Metric("homepage", StringParams()).to_dict()


def test_load_names_the_file(tmp_path):
    path = tmp_path / "metrics.toml"
    path.write_text(TOML.replace("k = 64", "k = -1"), encoding="utf-8")
    with pytest.raises(ParameterError) as info:
        Registry.load(path)
    assert info.value.field == "metrics.homepage.k"
    assert str(path) in str(info.value)
    with pytest.raises(ParameterError, match="cannot read registry file"):
        Registry.load(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("[metrics.x]\nkind = 'sketch'", "metrics.x.kind", "must be one of 'string'"),
        ("[metrics.x]\nkind = ['string']", "metrics.x.kind", "must be one of 'string'"),
        ("[metrics.x]\nkind = 'string'\nbits = 8", "metrics.x.bits", "does not take 'bits'"),
        ("[metrics.X]\nkind = 'boolean'", "name", "must start with a lowercase letter"),
        ("[metrics.x]\nkind = 'boolean'\nmin_reports = 0", "metrics.x.min_reports", "min_reports"),
        ("version = 1", "metrics", "at least one"),
        ("[metrics.x\nkind = 'boolean'", "registry", "not valid TOML"),
        ("owner = 'me'\n[metrics.x]\nkind = 'boolean'", "owner", "unknown top-level key"),
    ],
)
def test_errors_name_the_key(text, field, message):
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(text)
    assert info.value.field == field
    assert message in str(info.value)


def test_unknown_metric_lookup_lists_known_ones():
    registry = Registry.from_toml(TOML)
    with pytest.raises(KeyError, match="unknown metric 'nope'; this registry has: browser, height, homepage"):
        registry["nope"]


def test_duplicate_names_are_refused():
    metric = Metric("a", StringParams())
    with pytest.raises(ParameterError, match="defined twice"):
        Registry([metric, metric])


def test_total_epsilon_is_sequential_composition():
    registry = Registry.from_toml(TOML)
    total = sum(m.params.epsilon_inf for m in registry.values())
    assert registry.epsilon_total() == pytest.approx(total)
