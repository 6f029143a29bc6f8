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
        ("[metrics.X]\nkind = 'boolean'", "metrics.X", "must start with a lowercase letter"),
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


def test_a_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    path = tmp_path / "metrics.toml"
    latin = '[metrics.x]\nkind = "boolean"\ndescription = "café"\n'
    path.write_bytes(latin.encode("latin-1"))
    offset = latin.index("é")
    with pytest.raises(ParameterError) as info:
        Registry.load(path)
    assert str(info.value) == (f"{path}: not UTF-8 (byte 0xe9 at offset {offset}, line 3); "
                               "save the registry as UTF-8")
    path.write_bytes(latin.encode("utf-16"))
    with pytest.raises(ParameterError, match=r"not UTF-8 \(byte 0xff at offset 0, line 1; it "
                                             "starts with a UTF-16 byte-order mark\\); save"):
        Registry.load(path)


def test_a_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "metrics.toml"
    path.write_bytes(b"\xef\xbb\xbf" + TOML.encode("utf-8"))
    assert Registry.load(path) == Registry.from_toml(TOML)
    assert Registry.from_toml("\ufeff" + TOML) == Registry.from_toml(TOML)


def test_nesting_too_deep_to_read_is_invalid_toml(tmp_path):
    path = tmp_path / "metrics.toml"
    path.write_text("[metrics.x]\nkind = 'category'\ncategories = " + "[" * 5000 + "]" * 5000,
                    encoding="utf-8")
    with pytest.raises(ParameterError) as info:
        Registry.load(path)
    assert info.value.field == "registry"
    assert str(info.value).startswith(f"{path}: the registry is not valid TOML: ")
    assert "nested too deeply" in str(info.value)


def test_a_file_larger_than_a_registry_can_be_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr("veil.shared.registry.MAX_REGISTRY_BYTES", len(TOML.encode()))
    path = tmp_path / "metrics.toml"
    path.write_text(TOML, encoding="utf-8")
    assert Registry.load(path).version == 3  # exactly the limit is read
    path.write_text(TOML + "\n", encoding="utf-8")
    with pytest.raises(ParameterError, match=f"^{path}: larger than 0 MiB, the most a registry"):
        Registry.load(path)


@pytest.mark.parametrize("name", ["abc\n", "abc\r", "a" * 65, "", "9a"])
def test_a_metric_name_must_match_whole(name):
    with pytest.raises(ParameterError, match=r"the metric name must start with a lowercase letter"):
        Registry.from_dict({"metrics": {name: {"kind": "boolean"}}})
    with pytest.raises(ParameterError) as info:
        Metric(name, StringParams())
    assert info.value.field.startswith("metrics.")
    assert str(info.value).startswith(f"{info.value.field}: ")


def test_a_bad_name_is_shown_as_written_in_toml():
    with pytest.raises(ParameterError) as info:
        Registry.from_toml('[metrics."abc\\n"]\nkind = "boolean"')
    assert info.value.field == 'metrics."abc\\u000a"'


STRING_WITH_CHANNEL = "[metrics.s]\nkind = 'string'\n[metrics.s.discovery]\n"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[metrics.x]\nkind = 'boolean'\nmin_reports = 0", "metrics.x.min_reports"),
        ("[metrics.x]\nkind = 'boolean'\ndescription = 3", "metrics.x.description"),
        ("[metrics.x]\nkind = 'boolean'\nnote = 3", "metrics.x.note"),
        ("[metrics.x]\nkind = 'boolean'\nof = 3", "metrics.x.of"),  # "metrics.x: ... remove of"
        ("[metrics.s]\nkind = 'string'\n[metrics.'s.discovery']\nkind = 'discovery'\nof = 3",
         "metrics.s.discovery.of"),
        (STRING_WITH_CHANNEL + "min_reports = 0", "metrics.s.discovery.min_reports"),
        (STRING_WITH_CHANNEL + "description = 3", "metrics.s.discovery.description"),
        (STRING_WITH_CHANNEL + "note = 3", "metrics.s.discovery.note"),
        (STRING_WITH_CHANNEL + "of = 3", "metrics.s.discovery.of"),
        ("[metrics]\na = 3", "metrics.a"),
        ("[metrics.s]\nkind = 'string'\ndiscovery = 3", "metrics.s.discovery"),
    ],
)
def test_every_error_starts_with_the_metric_and_field(text, field):
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(text)
    assert info.value.field == field
    metric, _, key = field.partition(".")[2].rpartition(".")
    message = str(info.value)
    assert message.startswith(field) or (
        message.startswith(f"metrics.{metric}: ") and f" {key} " in message), message


JOINT_BASE = """
[metrics.br]
kind = "category"
categories = ["chrome", "firefox"]

[metrics.cr]
kind = "boolean"

[metrics.s]
kind = "string"

[metrics.s.discovery]
"""


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        # k's own declaration is fine: j is at fault for naming it
        ('of = ["br", "k"]\n[metrics.k]\nkind = "joint"\nof = ["br", "cr"]', "metrics.j.of[1]",
         "metrics.j: of[1] = 'k' names a joint metric, which cannot be a variable"),
        ('of = "br"', "metrics.j.of",
         "metrics.j.of must be a list of metric names, the joint metric's variables"),
        ('of = ["br", "j"]', "metrics.j.of[1]",
         "metrics.j: of[1] = 'j' names this joint metric itself"),
        ('of = ["br", "s.discovery"]', "metrics.j.of[1]",
         "metrics.j: of[1] = 's.discovery' names a discovery channel, which cannot be a variable"),
        ('of = ["br", 3]', "metrics.j.of[1]", "metrics.j: of[1] = 3 is not a metric name"),
    ],
)
def test_a_joint_metric_s_references_are_judged_as_its_own(table, field, message):
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(f'{JOINT_BASE}\n[metrics.j]\nkind = "joint"\n{table}\n')
    assert info.value.field == field
    assert str(info.value).startswith(message), str(info.value)


def test_a_flat_channel_is_no_variable_and_lists_no_variables():
    flat = JOINT_BASE.replace("[metrics.s.discovery]", '[metrics."s.discovery"]\n'
                                                       'kind = "discovery"\nof = "s"')
    with pytest.raises(ParameterError, match="names a discovery channel, which cannot be"):
        Registry.from_toml(f'{flat}\n[metrics.j]\nkind = "joint"\nof = ["br", "s.discovery"]')
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(flat.replace('of = "s"', 'of = ["s"]'))
    assert info.value.field == "metrics.s.discovery.of"
    assert str(info.value).startswith(
        "metrics.s.discovery.of must be the name of the string metric this channel belongs to")


def test_a_channel_name_too_long_says_how_short_the_string_metric_s_must_be():
    longest = "s" * 54
    assert f"{longest}.discovery" in Registry.from_toml(
        f"[metrics.{longest}]\nkind = 'string'\n[metrics.{longest}.discovery]\n")
    name = "s" * 60
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(f"[metrics.{name}]\nkind = 'string'\n[metrics.{name}.discovery]\n")
    assert info.value.field == f"metrics.{name}.discovery"
    assert str(info.value).startswith(f"metrics.{name}: its discovery channel is the metric")
    assert "shorten the string metric's name to 54 characters or fewer" in str(info.value)
