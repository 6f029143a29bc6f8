"""The TOML metric registry."""

import pytest

from veil.shared import Metric, ParameterError, Registry, StringParams
from veil.shared.kinds import (
    DiscoveryParams,
    FlhParams,
    HcmsParams,
    parse_params,
)
from veil.shared.kinds.base import MAX_COUNTERS
from veil.shared.registry import METRIC_KEYS
from veil.shared.statistics import statistic_for

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


def refusal(text: str) -> ParameterError:
    """The error a registry document is refused with (it must be refused)."""
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(text)
    return info.value


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
    error = refusal(text)
    assert error.field == field
    assert message in str(error)


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
    error = refusal('[metrics."abc\\n"]\nkind = "boolean"')
    assert error.field == 'metrics."abc\\u000a"'


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
    error = refusal(text)
    assert error.field == field
    metric, _, key = field.partition(".")[2].rpartition(".")
    message = str(error)
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
    error = refusal(f'{JOINT_BASE}\n[metrics.j]\nkind = "joint"\n{table}\n')
    assert error.field == field
    assert str(error).startswith(message), str(error)


def test_a_flat_channel_is_no_variable_and_lists_no_variables():
    flat = JOINT_BASE.replace("[metrics.s.discovery]", '[metrics."s.discovery"]\n'
                                                       'kind = "discovery"\nof = "s"')
    with pytest.raises(ParameterError, match="names a discovery channel, which cannot be"):
        Registry.from_toml(f'{flat}\n[metrics.j]\nkind = "joint"\nof = ["br", "s.discovery"]')
    error = refusal(flat.replace('of = "s"', 'of = ["s"]'))
    assert error.field == "metrics.s.discovery.of"
    assert str(error).startswith(
        "metrics.s.discovery.of must be the name of the string metric this channel belongs to")


def test_a_channel_name_too_long_says_how_short_the_string_metric_s_must_be():
    longest = "s" * 54
    assert f"{longest}.discovery" in Registry.from_toml(
        f"[metrics.{longest}]\nkind = 'string'\n[metrics.{longest}.discovery]\n")
    name = "s" * 60
    error = refusal(f"[metrics.{name}]\nkind = 'string'\n[metrics.{name}.discovery]\n")
    assert error.field == f"metrics.{name}.discovery"
    assert str(error).startswith(f"metrics.{name}: its discovery channel is the metric")
    assert "shorten the string metric's name to 54 characters or fewer" in str(error)


@pytest.mark.parametrize(
    ("table", "field", "product"),
    [
        ("kind = 'string'\nk = 65536\nm = 65536\nmin_reports = 1", "metrics.a.m",
         "65,536 cohorts x 65,536 counters each = 4,294,967,296 counters"),
        ("kind = 'string'\nk = 4096\nm = 16384", "metrics.a.m", "= 67,108,864 counters"),
        ("kind = 'string'\noracle = 'hcms'\nrows = 65536\ncolumns = 4096", "metrics.a.rows",
         "65,536 cohorts x 8,192 counters each = 536,870,912 counters"),
        ("kind = 'string'\noracle = 'flh'\ng = 4096\nfunctions = 65536", "metrics.a.functions",
         "= 268,435,456 counters"),
        ("kind = 'joint'\nof = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']\nmarginals = 4\n"
         f"domains = [{', '.join([str([str(i) for i in range(16)])] * 8)}]",
         "metrics.a.marginals", "70 cohorts x 531,441 counters each"),
    ],
)
def test_a_statistic_of_too_many_counters_is_refused_naming_what_to_lower(table, field, product):
    """The collector builds a day's counters whole (a cohorts x length uint64 array) for
    every counts request: 65,536 x 65,536 of them would need 32 GiB."""
    error = refusal(f"[metrics.a]\n{table}\n")
    assert error.field == field
    message = str(error)
    assert product in message and f"more than the {MAX_COUNTERS:,} a metric may keep" in message
    assert message.endswith(f"lower {' or '.join(field_names(field))}"), message


def field_names(field):
    """The parameters the size message asks to lower, the field at fault first."""
    return {"m": ("m", "k"), "rows": ("rows", "columns"), "functions": ("functions", "g"),
            "marginals": ("marginals", "domains")}[field.rpartition(".")[2]]


def test_every_documented_size_stays_well_inside_the_counter_limit():
    """The largest configuration the docs and experiments use, the marginals experiment's
    (``simulations/marginals_experiment.py``: 8 variables of 8 values, marginals of three at
    epsilon 4), holds 5.8 million counters; the defaults at most 131,072 (HCMS's 4,096 rows
    of 32 responses)."""
    from veil.simulations.marginals_experiment import EPSILONS, params_for

    sizes = {(epsilon, k): params_for(epsilon, k).counters for epsilon in EPSILONS
             for k in (2, 3)}  # every configuration the experiment runs
    assert max(sizes.values()) == sizes[4.0, 3] == 56 * 47**3 < MAX_COUNTERS / 2
    defaults = [HcmsParams(), FlhParams(), StringParams(), DiscoveryParams()]
    assert max(params.counters for params in defaults) == 4096 * 32

def test_every_statistic_with_a_counts_vector_has_its_length_in_the_table():
    """COUNTS_LENGTHS is the one place a statistic's vector length (and so its counters,
    which MAX_COUNTERS bounds) is read from: a statistic with a counts field missing from
    it would keep a vector of length 0 and escape the limit."""
    from tests.test_common_checks import EXAMPLES

    for params, _, _ in EXAMPLES:
        statistic = statistic_for(params)
        has_vector = any(field.type == "counts" for field in statistic.fields)
        assert (params.counts_length > 0) == has_vector, params


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ("epsilon_inf = 1e308", "metrics.a.epsilon_inf",
         "metrics.a: epsilon_inf must be a number above 0, at most 1e+300. Got 1e+308 instead."),
        (f"epsilon_inf = {10**400}", "metrics.a.epsilon_inf",
         "Got an integer of about 401 digits instead."),
        ("epsilon_inf = 2\nepsilon_1 = 2", "metrics.a.epsilon_1",
         "metrics.a: epsilon_1 = 2 cannot be reached with epsilon_inf = 2 (which sets f = "
         "0.755081), h = 2 and p = 0.5: even q = 1 gives 1.327; lower epsilon_1 to that or "
         "less, raise epsilon_inf, or lower p"),
        ("epsilon_inf = 2\nepsilon_1 = 1e-300", "metrics.a.epsilon_1",
         "metrics.a: epsilon_1 = 1e-300 is below the least one-report bound that "
         "probabilities of 32 bits realize with epsilon_inf = 2 (which sets f = 0.755081), "
         "h = 2 and p = 0.5: q = p + 2**-32 gives 4.562e-10; raise epsilon_1 to that or more"),
        ("epsilon_inf = 4\np = 0.8", "metrics.a.p", "with epsilon_inf alone q is 0.75"),
    ],
)
def test_a_string_metric_s_privacy_targets_are_judged_by_name(table, field, message):
    error = refusal(f"[metrics.a]\nkind = 'string'\n{table}\n")
    assert error.field == field
    assert str(error).startswith("metrics.a: ") and message in str(error)


def test_targets_beyond_what_32_bits_realize_are_met_with_the_nearest_grid_point():
    registry = Registry.from_toml("[metrics.a]\nkind = 'string'\nepsilon_inf = 1e5\n"
                                  "[metrics.b]\nkind = 'string'\nepsilon_inf = 2\n"
                                  "epsilon_1 = 4.562e-10\n")
    assert registry["a"].params.f == 2**-32 and registry["a"].params.epsilon_inf <= 1e5
    b = registry["b"].params
    assert b.q == 0.5 + 2**-32 and b.epsilon_1 <= 4.562e-10


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ("encoding = []", "metrics.a.encoding",
         "The 'encoding' parameter of JointParams must be one of 'auto', 'grr'"),
        ("max_report_bytes = '1'", "metrics.a.max_report_bytes",
         "max_report_bytes must be an integer >= 1, the most bytes one report may take. Got "
         "'1' instead."),
        ("max_report_bytes = 1.5", "metrics.a.max_report_bytes", "Got 1.5 instead."),
        ("encoding = 'grr'\nmax_report_bytes = 1.5", "metrics.a.max_report_bytes",
         "Got 1.5 instead."),
    ],
)
def test_a_joint_metric_s_settings_are_judged_in_its_own_words(table, field, message):
    error = refusal("[metrics.a]\nkind = 'joint'\nof = ['x', 'y']\n"
                    f"domains = ['boolean', 'boolean']\n{table}\n")
    assert error.field == field
    assert str(error).startswith("metrics.a: ") and message in str(error)


def test_a_bucket_edge_beyond_the_float_range_is_no_finite_edge():
    error = refusal("[metrics.a]\nkind = 'joint'\nof = ['x', 'y']\n"
                    f"domains = ['boolean', [0, {10**400}]]\n")
    assert error.field == "metrics.a.domains[1]"
    assert "the bucket edges of 'y' must be at least two finite, increasing numbers" in str(
        error)


def test_an_integer_too_long_to_read_is_refused_by_name() -> None:
    """TOML integers have no bound, and Python refuses to read one past 4,300 digits with
    a ValueError that escaped as a traceback."""
    with pytest.raises(ParameterError, match="cannot be read"):
        Registry.from_toml('version = 1\n[metrics.a]\nkind = "number"\nhigh = 1' + "0" * 5000)
