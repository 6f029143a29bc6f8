"""DiscoveryParams (the discovery channel of a string metric) and its place in the registry.

* **Validation** names the field at fault.
* **Layout**: levels, domain, buckets, payload size, padding and the reported vector,
  recomputed by hand from the module's definitions.
* **Payload parsing** refuses every malformed payload and returns the bytes of a good one.
* **Privacy, exactly**: from the realized numerators alone, with :class:`fractions.Fraction`,
  the permanent response (hash matrix uniform and independent of the value; the bucket
  ``A x`` with probability ``a``, any other of the ``g`` with ``(1 - a) / (g - 1)``) has the
  worst-case log-ratio ``ln(a (g - 1) / (1 - a))`` and one report (then kept with
  probability ``lambda``, else uniform) ``ln(p / q')``; the stated epsilons equal them
  (never below, not more than 1e-9 relative above) and never exceed the declared ones.
* **Bucket bits**: when left out, ``t`` is the one of ``1..8`` of lowest variance per report
  (recomputed from each ``t``'s ``support_probs``); at epsilon 4 it is 6, variance 0.0764, as
  ``docs/discovery.md`` states.
* **Registry**: the nested TOML form and the flat JSON form, their round trips, the errors,
  lenient parsing and the composition of a metric with its channel (the maximum).
* **Statistic**: ``buckets`` counts per level match the buckets drawn, counted per level.
"""

from __future__ import annotations

import hashlib
import math
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from veil.shared import ParameterError, Registry, StringParams
from veil.shared.errors import WireFormatError
from veil.shared.kinds import KINDS, DiscoveryParams
from veil.shared.kinds.discovery import prefix_fingerprint
from veil.shared.registry import METRIC_KEYS, Metric
from veil.shared.statistics import COLUMNS, STATISTICS, statistic_for

ONE = 1 << 32
#: how far above the exact epsilon a stated epsilon may be (relative; they are rounded up
#: by 1e-12 relative, veil.shared.privacy.round_up)
SLACK = 1e-9


def test_the_kind_is_registered() -> None:
    assert KINDS["discovery"] is DiscoveryParams
    assert DiscoveryParams().statistic == "buckets"


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"share": 0.0}, "share"),
        ({"share": 1.0}, "share"),
        ({"share": "half"}, "share"),
        ({"segment": 3}, "segment"),
        ({"segment": 0}, "segment"),
        ({"max_length": 0}, "max_length"),
        ({"max_length": 1025}, "max_length"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": 20.5}, "epsilon"),
        ({"epsilon": math.inf}, "epsilon"),
        ({"epsilon": 2.0, "report_epsilon": 3.0}, "report_epsilon"),
        ({"report_epsilon": 0.0}, "report_epsilon"),
        ({"fingerprint_bits": -1}, "fingerprint_bits"),
        ({"fingerprint_bits": 17}, "fingerprint_bits"),
        ({"fingerprint_bits": 11, "segment": 2}, "fingerprint_bits"),  # 27 > 26 domain bits
        ({"bucket_bits": 0}, "bucket_bits"),
        ({"bucket_bits": 9}, "bucket_bits"),
        ({"bucket_bits": 2.0}, "bucket_bits"),
    ],
)
def test_validation_errors_name_the_field(settings: dict[str, object], field: str) -> None:
    with pytest.raises(ParameterError) as info:
        DiscoveryParams(**settings)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        # in (0, 1) as declared, but 0 or 1 as realized: nobody, or everybody, on the channel
        ({"share": 1e-11}, "share", "is realized as 0"),
        ({"share": 0.9999999999}, "share", "it must be at most 1 - 2**-32"),
        # the instantaneous response keeps nothing: report_epsilon is at fault, not epsilon
        ({"epsilon": 2.0, "report_epsilon": 1e-300}, "report_epsilon",
         "The 'report_epsilon' parameter of DiscoveryParams is below what probabilities of 32 "
         "bits can realize over 2 buckets with epsilon=2.0 (at least 0.000000000355)"),
        ({"epsilon": 1e-300}, "epsilon", "The 'epsilon' parameter of DiscoveryParams is below"),
    ],
)
def test_values_that_realize_as_no_information_name_their_field(
        settings: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(ParameterError) as info:
        DiscoveryParams(**settings)  # type: ignore[arg-type]
    assert info.value.field == field
    assert message in str(info.value)
    assert DiscoveryParams(share=2**-32).share == 2**-32  # the margin the message names


def test_unknown_settings_are_refused_by_name() -> None:
    with pytest.raises(ParameterError, match="k"):
        DiscoveryParams.from_dict({"k": 8})


def test_report_epsilon_defaults_to_epsilon_and_bucket_bits_are_chosen() -> None:
    params = DiscoveryParams(epsilon=3.0)
    assert params.report_epsilon == 3.0
    assert params.bucket_bits is not None and 1 <= params.bucket_bits <= 8
    assert DiscoveryParams.from_dict(params.to_dict()) == params


# --- layout -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "max_length", "fingerprint_bits", "bucket_bits", "levels", "domain_bits",
     "row_bytes"),
    [
        (2, 64, 8, 6, 32, 24, 3),  # 64 bytes in 2-byte segments: 32 levels, dividing m = 64
        (1, 64, 8, 6, 64, 16, 2),
        (2, 1, 0, 1, 1, 16, 2),  # a 1-byte value and its end marker: one segment
        (2, 2, 4, 3, 1, 20, 3),  # a 2-byte value fills the one segment: complete unended
        (1, 10, 16, 8, 10, 24, 3),
        (2, 1024, 10, 2, 512, 26, 4),  # the largest domain
    ],
)
def test_layout(segment: int, max_length: int, fingerprint_bits: int, bucket_bits: int,
                levels: int, domain_bits: int, row_bytes: int) -> None:
    params = DiscoveryParams(segment=segment, max_length=max_length,
                             fingerprint_bits=fingerprint_bits, bucket_bits=bucket_bits)
    assert params.levels == params.cohorts == levels
    assert params.levels * segment >= max_length > (params.levels - 1) * segment
    assert params.segment_bits == 8 * segment
    assert params.domain_bits == domain_bits
    assert params.buckets == 2 ** bucket_bits
    assert params.row_bytes == row_bytes
    assert params.payload_size == bucket_bits * row_bytes + 1


def test_padding_and_the_vector_of_each_level() -> None:
    params = DiscoveryParams(segment=2, max_length=5, fingerprint_bits=8)
    assert params.levels == 3
    assert params.padded(b"abc") == b"abc\0\1\1"  # the end marker, then padding
    assert params.padded(b"abcdefgh") == b"abcde\1"  # cut at max_length: complete, no marker
    assert params.padded(b"") == b"\0" + b"\1" * 5
    assert params.padding_segment == 0x0101
    full = DiscoveryParams(segment=2, max_length=4)
    assert full.levels == 2 and full.padded(b"abcdefgh") == b"abcd"  # no room, no need

    def fingerprint(prefix: bytes) -> int:
        digest = hashlib.blake2b(prefix, digest_size=8, person=b"veil-discovery").digest()
        return digest[0]  # the top 8 bits

    padded = params.padded(b"abc")
    assert params.vector(padded, 0) == fingerprint(b"") << 16 | int.from_bytes(b"ab", "big")
    assert params.vector(padded, 1) == fingerprint(b"ab") << 16 | int.from_bytes(b"c\0", "big")
    assert params.vector(padded, 2) == fingerprint(b"abc\0") << 16 | 0x0101
    assert prefix_fingerprint(b"ab", 0) == 0
    assert prefix_fingerprint(b"ab", 16) == int.from_bytes(
        hashlib.blake2b(b"ab", digest_size=8, person=b"veil-discovery").digest()[:2], "big")
    without = DiscoveryParams(segment=1, max_length=4, fingerprint_bits=0)
    assert without.vector(without.padded(b"xyz"), 2) == ord("z")
    assert all(params.vector(padded, level) < 1 << params.domain_bits for level in range(3))


# --- payloads ---------------------------------------------------------------------------

#: 12-bit domain (4 fingerprint bits, one byte segments), 3 rows of 2 bytes, 8 buckets
SMALL = DiscoveryParams(segment=1, max_length=8, fingerprint_bits=4, bucket_bits=3)


def test_a_valid_payload_parses_to_its_bytes() -> None:
    data = bytes([0x0F, 0xFF, 0x00, 0x00, 0x01, 0x23, 7])
    assert SMALL.payload_size == len(data)
    assert SMALL.parse_payload(data.hex()) == data


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (None, "wrong_type"),
        (123, "wrong_type"),
        (bytes(7), "wrong_type"),
        ("00" * 6, "wrong_length"),
        ("00" * 8, "wrong_length"),
        ("0" * 13, "wrong_length"),
        ("zz" + "00" * 6, "bad_hex"),
        (" 0" + "00" * 6, "bad_hex"),
        ("0F" + "00" * 6, "bad_hex"),  # uppercase
        ("1000" + "00" * 5, "out_of_range"),  # row 0 sets bit 12 of a 12-bit domain
        ("0000" "0000" "8000" "00", "out_of_range"),  # the last row
        ("00" * 6 + "08", "out_of_range"),  # bucket 8 of 8
        ("00" * 6 + "ff", "out_of_range"),
    ],
)
def test_malformed_payloads_are_refused(payload: object, code: str) -> None:
    with pytest.raises(WireFormatError) as info:
        SMALL.parse_payload(payload, "reports[3].payload")
    assert info.value.code == code
    assert info.value.field == "reports[3].payload"


# --- privacy ----------------------------------------------------------------------------


def ln(ratio: Fraction) -> Decimal:
    """The natural logarithm of an exact ratio, to 40 significant digits."""
    with localcontext() as context:
        context.prec = 40
        return (Decimal(ratio.numerator) / Decimal(ratio.denominator)).ln()


def exact_epsilons(params: DiscoveryParams) -> tuple[Decimal, Decimal]:
    """``(epsilon_inf, epsilon_1)`` from the realized numerators (see the module docstring)."""
    prr, irr = params.numerators
    g = params.buckets
    a, keep = Fraction(prr, ONE), Fraction(irr, ONE)
    other = (1 - a) / (g - 1)
    own_report = keep * a + (1 - keep) / g
    other_report = keep * other + (1 - keep) / g
    return ln(a / other), ln(own_report / other_report)


def stated_within(stated: float, exact: Decimal) -> bool:
    """Never below the exact epsilon, and above it by rounding only (``SLACK``)."""
    return exact <= Decimal(stated) <= exact * Decimal(1 + SLACK)


CASES = [
    (epsilon, report, t)
    for epsilon in (0.01, 0.5, 1.0, 4.0, 8.0, 20.0)
    for report in (epsilon, epsilon / 2, epsilon / 100)
    for t in (None, 1, 8)
]


@pytest.mark.parametrize(("epsilon", "report", "t"), CASES)
def test_stated_epsilons_are_the_exact_log_ratios_within_the_declared(
    epsilon: float, report: float, t: int | None
) -> None:
    params = DiscoveryParams(epsilon=epsilon, report_epsilon=report, bucket_bits=t)
    exact_inf, exact_1 = exact_epsilons(params)
    assert stated_within(params.epsilon_inf, exact_inf)
    assert stated_within(params.epsilon_1, exact_1)
    assert params.epsilon_inf <= epsilon * (1 + SLACK)
    assert params.epsilon_1 <= report * (1 + SLACK)
    assert params.epsilon_1 <= params.epsilon_inf * (1 + SLACK)
    # rounding towards less information costs little, unless 2**32 probabilities saturate
    if epsilon < 20:
        assert params.epsilon_inf >= epsilon - 1e-6
        assert params.epsilon_1 >= report - 1e-6
    p, q = params.support_probs
    assert q == 1 / params.buckets and p > q
    prr, irr = params.numerators
    keep = irr / ONE
    assert p == pytest.approx(keep * prr / ONE + (1 - keep) / params.buckets, rel=1e-12)


def test_without_instantaneous_noise_a_report_is_the_permanent_response() -> None:
    params = DiscoveryParams(epsilon=2.0)
    assert params.numerators[1] == ONE
    assert params.epsilon_1 == params.epsilon_inf


def test_the_default_bucket_bits_are_those_docs_discovery_states() -> None:
    params = DiscoveryParams(epsilon=4.0)
    assert params.bucket_bits == 6
    assert params.share_variance() == pytest.approx(0.0764, abs=5e-5)  # docs/discovery.md


@pytest.mark.parametrize(("epsilon", "report"), [(0.5, 0.5), (1.0, 1.0), (2.0, 2.0), (4.0, 4.0),
                                                 (8.0, 8.0), (4.0, 2.0), (8.0, 1.0)])
def test_chosen_bucket_bits_minimize_the_variance_per_report(epsilon: float, report: float,
                                                             ) -> None:
    # the variance per report of an absent vector's share, q (1 - q) / (p - q)^2 with
    # (p, q) = support_probs, recomputed for every t = 1..8 from parameters that fix it
    def variance(t: int) -> float:
        p, q = DiscoveryParams(epsilon=epsilon, report_epsilon=report, bucket_bits=t).support_probs
        return q * (1 - q) / (p - q) ** 2

    variances = {t: variance(t) for t in range(1, 9)}
    chosen = DiscoveryParams(epsilon=epsilon, report_epsilon=report).bucket_bits
    assert chosen == min(variances, key=variances.__getitem__), variances


def test_variance_is_that_of_local_hashing() -> None:
    params = DiscoveryParams(epsilon=4.0, bucket_bits=4)
    p, q = params.support_probs
    assert params.share_variance(0.0, 100) == pytest.approx(q * (1 - q) / (100 * (p - q) ** 2))
    assert params.share_variance(1.0) == pytest.approx(p * (1 - p) / (p - q) ** 2)


# --- the registry -----------------------------------------------------------------------

TOML = """
version = 2

[metrics.homepage]
kind = "string"
k = 32
h = 2
m = 8

[metrics.homepage.discovery]
share = 0.75
segment = 1
max_length = 16
epsilon = 3.0

[metrics.browser]
kind = "category"
categories = ["chrome", "firefox"]

[metrics."web.page"]
kind = "boolean"
"""


def test_nested_toml_form_becomes_a_channel_metric() -> None:
    registry = Registry.from_toml(TOML)
    assert list(registry) == ["homepage", "homepage.discovery", "browser", "web.page"]
    channel = registry["homepage.discovery"]
    assert channel.kind == "discovery" and channel.of == "homepage"
    assert channel.params == DiscoveryParams(share=0.75, segment=1, max_length=16, epsilon=3.0)
    assert registry["homepage"].params == StringParams(k=32, h=2, m=8)
    assert registry.channel("homepage") == channel
    assert registry.channel("browser") is None and registry.channel("nope") is None
    assert registry["homepage"].of == ""


def test_round_trips_through_toml_and_the_flat_json_form() -> None:
    registry = Registry.from_toml(TOML)
    flat = registry.to_dict()
    assert flat["metrics"]["homepage.discovery"]["kind"] == "discovery"
    assert flat["metrics"]["homepage.discovery"]["of"] == "homepage"
    assert "of" not in flat["metrics"]["homepage"]
    assert "discovery" not in flat["metrics"]["homepage"]
    assert Registry.from_dict(flat) == registry
    text = registry.to_toml()
    assert "[metrics.homepage.discovery]" in text and '[metrics."web.page"]' in text
    assert Registry.from_toml(text) == registry
    assert Registry.from_dict(Registry.from_toml(text).to_dict()) == registry


def test_a_channel_defined_before_its_metric_round_trips() -> None:
    flat = Registry.from_toml(TOML).to_dict()
    metrics = flat["metrics"]
    reordered = {"version": 2, "metrics": {"homepage.discovery": metrics["homepage.discovery"],
                                           **metrics}}
    registry = Registry.from_dict(reordered)
    assert next(iter(registry)) == "homepage.discovery"
    assert Registry.from_toml(registry.to_toml()) == registry


def test_the_nested_table_may_repeat_its_kind_and_of() -> None:
    text = TOML.replace("share = 0.75", 'kind = "discovery"\nof = "homepage"\nshare = 0.75')
    assert Registry.from_toml(text) == Registry.from_toml(TOML)


def test_of_is_a_metric_key_written_only_when_set() -> None:
    assert METRIC_KEYS[-1] == "of"
    channel = Metric("homepage.discovery", DiscoveryParams(), of="homepage", note="hand made")
    written = channel.to_dict()
    assert list(written)[:6] == ["kind", *METRIC_KEYS, "share"]
    assert "of" not in Metric("homepage", StringParams()).to_dict()


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (TOML.replace("segment = 1", "segment = 5"), "metrics.homepage.discovery.segment",
         "segment"),
        (TOML.replace("share = 0.75", "bits = 3"), "metrics.homepage.discovery.bits", "bits"),
        (TOML.replace("share = 0.75", 'kind = "string"'), "metrics.homepage.discovery.kind",
         "must be 'discovery'"),
        (TOML.replace("share = 0.75", 'of = "browser"'), "metrics.homepage.discovery.of",
         "must be 'homepage'"),
        (TOML.replace("share = 0.75", "min_reports = 0"),
         "metrics.homepage.discovery.min_reports", "min_reports"),
        (TOML + "\n[metrics.browser.discovery]\nshare = 0.5\n", "metrics.browser.discovery",
         "only a string metric may have a discovery channel"),
        (TOML + '\n[metrics.flag]\nkind = "boolean"\ndiscovery = 3\n', "metrics.flag.discovery",
         "only a string metric"),
        ('[metrics.homepage]\nkind = "string"\ndiscovery = 3\n', "metrics.homepage.discovery",
         "must be a table"),
    ],
)
def test_errors_of_a_nested_channel_name_its_key(text: str, field: str, message: str) -> None:
    with pytest.raises(ParameterError) as info:
        Registry.from_toml(text)
    assert info.value.field == field
    assert message in str(info.value)


BASE = {"homepage": {"kind": "string", "k": 32}, "browser": {"kind": "category",
                                                             "categories": ["a", "b"]}}


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"homepage.discovery": {"kind": "discovery", "of": "nope"}},
         "metrics.homepage.discovery.of", "names no metric"),
        ({"homepage.discovery": {"kind": "discovery", "of": "browser"}},
         "metrics.homepage.discovery.of", "names a category metric"),
        ({"homepage.discovery": {"kind": "discovery"}}, "metrics.homepage.discovery.of",
         "needs of"),
        ({"flag": {"kind": "boolean", "of": "homepage"}}, "metrics.flag.of",
         "only a discovery channel belongs to another metric"),
        ({"homepage.discovery": {"kind": "discovery", "of": "homepage"},
          "homepage.words": {"kind": "discovery", "of": "homepage"}},
         "metrics.homepage.words.of", "has a discovery channel already"),
        ({"homepage.discovery": {"kind": "discovery", "of": 3}}, "metrics.homepage.discovery.of",
         "of must be"),
    ],
)
def test_errors_of_a_flat_channel_name_its_key(extra: dict[str, object], field: str,
                                               message: str) -> None:
    with pytest.raises(ParameterError) as info:
        Registry.from_dict({"metrics": {**BASE, **extra}})
    assert info.value.field == field
    assert message in str(info.value)


def test_a_channel_both_nested_and_flat_is_defined_twice() -> None:
    data = {"metrics": {"homepage": {"kind": "string", "discovery": {}},
                        "homepage.discovery": {"kind": "discovery", "of": "homepage"}}}
    with pytest.raises(ParameterError, match="defined twice"):
        Registry.from_dict(data)
    lenient = Registry.from_dict(data, lenient=True)
    assert list(lenient) == ["homepage"] and "homepage.discovery" in lenient.skipped


def test_lenient_parsing_skips_a_broken_channel_and_keeps_its_string_metric() -> None:
    broken = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": 32, "discovery": {"segment": 5}},
        "flag": {"kind": "boolean"},
    }}, lenient=True)
    assert list(broken) == ["homepage", "flag"]
    assert broken.channel("homepage") is None
    assert "segment" in broken.skipped["homepage.discovery"]
    # a channel of a newer kind's parameters, as an older client sees it: skipped alone
    newer = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string"},
        "homepage.discovery": {"kind": "discovery", "of": "homepage", "shape": "trie"},
    }}, lenient=True)
    assert list(newer) == ["homepage"] and "shape" in newer.skipped["homepage.discovery"]


def test_lenient_parsing_skips_the_channels_of_a_skipped_metric() -> None:
    registry = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": -1, "discovery": {"share": 0.5}},
        "flag": {"kind": "boolean", "of": "homepage"},
        "other": {"kind": "string"},
        "other.discovery": {"kind": "discovery", "of": "other"},
        "other.more": {"kind": "discovery", "of": "other"},
    }}, lenient=True)
    assert list(registry) == ["other", "other.discovery"]
    assert set(registry.skipped) == {"homepage", "homepage.discovery", "flag", "other.more"}
    assert "names no metric" in registry.skipped["homepage.discovery"]


def test_a_metric_and_its_channel_compose_by_the_maximum() -> None:
    registry = Registry.from_toml(TOML)
    home = registry["homepage"].params.epsilon_inf
    channel = registry["homepage.discovery"].params.epsilon_inf
    browser = registry["browser"].params.epsilon_inf
    flag = registry["web.page"].params.epsilon_inf
    assert home != channel
    assert registry.epsilon_total() == pytest.approx(max(home, channel) + browser + flag,
                                                     rel=1e-11)
    assert registry.epsilon_total() >= max(home, channel) + browser + flag
    # per_metric figures (what an installation spent) group the same way
    assert registry.epsilon_total({"homepage": 1.0, "homepage.discovery": 2.5,
                                   "browser": 0.5}) == pytest.approx(3.0)
    assert registry.epsilon_total({"homepage.discovery": 2.5}) == 2.5
    assert registry.epsilon_total({"gone": 1.0, "homepage": 1.0}) == pytest.approx(2.0)


# --- the statistic ----------------------------------------------------------------------


def test_bucket_counts_per_level_match_the_reports_one_by_one() -> None:
    statistic = statistic_for(SMALL)
    assert statistic is STATISTICS["buckets"] and statistic.payload_type == "bytes"
    assert [field.column for field in statistic.fields] == ["bit_counts"]  # no new column
    assert "bit_counts" in COLUMNS
    generator = random.Random(11)
    cohorts = np.array([generator.randrange(SMALL.levels) for _ in range(500)])
    buckets = np.array([generator.randrange(SMALL.buckets) for _ in cohorts])
    stored = [statistic.stored_payload(SMALL, None, SMALL.parse_payload(
        (bytes(6) + bytes([bucket])).hex())) for bucket in buckets.tolist()]
    # per cohort: its reports and how many drew each bucket, counted from the draws
    expected = {int(cohort): (int(np.count_nonzero(cohorts == cohort)),
                              np.bincount(buckets[cohorts == cohort], minlength=SMALL.buckets))
                for cohort in np.unique(cohorts)}
    arrays = np.frombuffer(b"".join(stored), dtype=np.uint8).reshape(len(stored), -1)
    for result in (statistic.accumulate(SMALL, cohorts, stored),
                   statistic.accumulate_arrays(SMALL, cohorts, arrays)):
        assert [c for c, _, _ in result] == sorted(expected)
        for cohort, reports, state in result:
            assert reports == expected[cohort][0]
            assert state["counts"].dtype == np.uint64
            assert state["counts"].tolist() == expected[cohort][1].tolist()
            entry = statistic.to_entry(state)
            assert statistic.from_entry(SMALL, entry, reports, "c")["counts"].tolist() \
                == entry["counts"]
            with pytest.raises(ParameterError, match="add up"):
                statistic.from_entry(SMALL, entry, reports + 1, "c")
    assert statistic.accumulate(SMALL, np.array([], dtype=np.int64), []) == []
