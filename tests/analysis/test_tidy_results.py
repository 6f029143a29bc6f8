"""One tidy table for every kind, p-values that keep their size, the notebook API, the charts,
the privacy cost statement, and string metrics declared by their epsilon targets.

Decodes read real collector SQLite files (``write_database``: SDK-encoded reports stored
as the collector stores them) or counts drawn from the RAPPOR model.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import veil.server.analysis
from tests.analysis.test_cli_small_populations import METRIC, write_database
from tests.test_common_checks import EXAMPLES, IDS, population, sdk_reports
from veil.server.analysis import (
    RAPPOR_COLUMNS,
    RESULT_COLUMNS,
    STRING_COLUMNS,
    DecodeResult,
    build_map,
    counts_document,
    decode_counts,
    decode_metric,
    simulate_string_counts,
)
from veil.server.analysis.api import discover
from veil.server.analysis.joint import variable_columns
from veil.server.cli import main
from veil.server.storage import open_storage
from veil.shared.kinds import (
    BooleanParams,
    DiscoveryParams,
    JointParams,
    MechanismParams,
    NumberParams,
    StringParams,
)
from veil.shared.privacy import format_epsilon
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, validate_batch


def decode_example(params: MechanismParams, shares: dict, truth: dict, tmp_path: Path,
                   ) -> DecodeResult:
    """300 SDK-encoded reports of the example population, decoded from a database file."""
    tmp_path.mkdir(exist_ok=True)
    db = write_database(tmp_path / "veil.db", params, population(shares, 300, seed=5), seed=6)
    return decode_metric(db=db, metric=METRIC, candidates=[*truth, "never.example"], force=True)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_every_kind_writes_the_same_columns(
    params: MechanismParams, shares: dict, truth: dict, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = write_database(tmp_path / "veil.db", params, population(shares, 300, seed=1), seed=2)
    (tmp_path / "candidates.txt").write_text("\n".join(truth) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    if isinstance(params, DiscoveryParams):  # found strings, in the string decoder's table
        assert main(["discover", "--db", str(db), "--metric", METRIC, "--force",
                     "--out", str(out)]) == 0
        with open(out / "results.csv", newline="", encoding="utf-8") as handle:
            assert next(csv.reader(handle)) == list(STRING_COLUMNS)
        frame = discover(METRIC, db=str(db), force=True).result.to_pandas()
        assert list(frame.columns) == list(STRING_COLUMNS)
        return
    candidates = ["--candidates", str(tmp_path / "candidates.txt")] \
        if params.kind == "string" else []  # refused for the other kinds
    assert main(["decode", "--db", str(db), "--metric", METRIC, "--force", *candidates,
                 "--out", str(out)]) == 0
    with open(out / "results.csv", newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    if params.kind == "string":
        assert header == list(STRING_COLUMNS)
        assert set(RAPPOR_COLUMNS) <= set(header)  # google/rappor's tools still read it
    elif isinstance(params, JointParams):  # the same table, with a column per variable
        assert header == [*RESULT_COLUMNS[:2], *variable_columns(params), *RESULT_COLUMNS[2:],
                          "consistent"]
    else:
        assert header == list(RESULT_COLUMNS)
    # the DataFrame is the same table
    frame = decode_metric(db=db, metric=METRIC, candidates=list(truth), force=True).to_pandas()
    assert list(frame.columns) == header
    assert set(frame["kind"]) == {params.kind} and set(frame["metric"]) == {METRIC}
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["privacy"]["statement"] in capsys.readouterr().out


def test_a_number_row_fills_its_columns_and_leaves_share_and_p_value_empty(
        tmp_path: Path) -> None:
    params = NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0)
    [row] = decode_example(params, {2.5: 0.5, 7.5: 0.5}, {"mean": 5.0}, tmp_path).rows
    assert row["value"] == "mean" and row["kind"] == "number"
    assert row["low_95"] < row["estimate"] < row["high_95"] and row["std_error"] > 0
    # a mean is no share of reports, and "the mean is low" no hypothesis: left empty
    for name in ("proportion", "prop_std_error", "prop_low_95", "prop_high_95", "p_value",
                 "log10_p_value"):
        assert row[name] is None, name


def test_p_values_far_in_the_tail_keep_their_size_in_log10() -> None:
    """At a million reports a common string's z is in the hundreds: its p-value is below the
    smallest float (z above about 38.5), so ``p_value`` is 0 and ``log10_p_value`` says how
    small, as scipy's log survival function does."""
    params = StringParams(k=32, h=2, m=8)
    names = ["alpha.example", "beta.example", "gamma.example"]
    reports, ones = simulate_string_counts(params, build_map(params, names),
                                           np.array([0.6, 0.3, 0.1]), 1_000_000,
                                           np.random.default_rng(3))
    result = decode_counts(counts_document(params, reports, ones), names)
    top = result.rows[0]
    z = top["proportion"] / top["prop_std_error"]
    assert z > 100
    assert top["p_value"] == 0.0
    assert top["log10_p_value"] == pytest.approx(stats.norm.logsf(z) / math.log(10), rel=1e-9)
    assert top["log10_p_value"] < -2000
    for row in result.rows:  # where the p-value is a float, the two agree
        if row["p_value"] > 0:
            assert math.log10(row["p_value"]) == pytest.approx(row["log10_p_value"], rel=1e-9)


def test_the_package_lists_its_lazy_names() -> None:
    names = dir(veil.server.analysis)
    assert {"decode_counts", "decode_metric", "decode_metric_by_day", "StringDecoder",
            "DecodeResult", "DailyResult"} <= set(names)


def test_the_notebook_view_is_a_compact_table(tmp_path: Path) -> None:
    params = BooleanParams(alpha=0.6, beta=0.4)
    result = decode_example(params, {True: 0.3, False: 0.7}, {"true": 0.3}, tmp_path)
    page = result._repr_html_()
    assert page.count("<tr>") == 1 + len(result.rows)  # the header and one row per value
    assert METRIC in page and "true share" in page and "300 reports" in page


def test_the_charts_say_what_they_show(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    number = decode_example(NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0),
                            {2.5: 0.5, 7.5: 0.5}, {"mean": 5.0}, tmp_path / "n")
    ax = number.plot()
    try:
        low, high = ax.get_xlim()
        assert low <= 0.0 and high >= 10.0  # the whole range, not a lone dot
        assert METRIC in ax.get_xlabel()
        assert any(text.get_text().startswith("mean ") for text in ax.texts)
    finally:
        plt.close(ax.figure)
    boolean = decode_example(BooleanParams(alpha=0.6, beta=0.4), {True: 0.3, False: 0.7},
                             {"true": 0.3}, tmp_path / "b")
    figure, ax = plt.subplots()
    try:
        assert boolean.plot(ax) is ax
        words = " ".join(text.get_text() for text in ax.texts)
        assert "true" in words and "false" not in words  # the true share, once
    finally:
        plt.close(figure)
    strings = decode_example(StringParams(k=32, h=2, m=8), {"a.example": 0.5, "b.example": 0.5},
                             {"a.example": 0.5, "b.example": 0.5}, tmp_path / "s")
    ax = strings.plot()
    try:
        labels = [label.get_text() for label in ax.get_yticklabels()]
        assert any(label.startswith("not in the table") for label in labels)
    finally:
        plt.close(ax.figure)


def test_the_headline_names_a_fractional_confidence_as_the_columns_do(tmp_path: Path) -> None:
    """At 0.999 the headline said '100% interval' (a percentage rounded to a whole one)."""
    db = write_database(tmp_path / "veil.db", StringParams(k=32, h=2, m=8),
                        population({"a.example": 0.5, "b.example": 0.5}, 300, seed=5), seed=6)
    result = decode_metric(db=db, metric=METRIC, candidates=["a.example", "never.example"],
                           force=True, confidence=0.999)
    assert "(99.9% interval " in result.headline and "100% interval" not in result.headline


def test_the_privacy_cost_per_installation_follows_the_ledger(tmp_path: Path) -> None:
    """Each distinct value (grid point) costs epsilon_inf; a number has resolution + 1."""
    params = NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0, resolution=16)
    privacy = decode_example(params, {2.5: 1.0}, {"mean": 2.5}, tmp_path / "n").summary["privacy"]
    assert privacy["distinct_values"] == 17
    assert privacy["epsilon_per_value"] == params.epsilon_inf
    assert 17 * 2.0 <= privacy["epsilon_per_installation"] <= 17 * 2.0 * (1 + 1e-9)
    assert "17 possible grid points" in privacy["statement"]
    strings = decode_example(StringParams(k=32, h=2, m=8), {"a.example": 1.0},
                             {"a.example": 1.0}, tmp_path / "s").summary["privacy"]
    assert strings["distinct_values"] is None and strings["epsilon_per_installation"] is None
    assert strings["epsilon_once"] < strings["epsilon_per_value"]
    assert "no upper limit" in strings["statement"]


@pytest.mark.parametrize(
    ("epsilon", "shown"),
    [
        (4.3944, "4.40"),
        (1.0, "1.00"),
        # rounding up to the next power of ten keeps three significant digits
        (0.99999999989, "1.00"),
        (9.9999, "10.0"),
        (99.95, "100"),
        (0.0123, "0.0123"),
    ],
)
def test_a_stated_cost_has_three_digits_and_is_never_below_the_true_one(
    epsilon: float, shown: str,
) -> None:
    assert format_epsilon(epsilon) == shown
    assert float(shown) >= epsilon * (1 - 1e-9)


EPSILON_REGISTRY = """\
[metrics.homepage]
kind = "string"
k = 32
h = 2
m = 8
epsilon_inf = 2.0
epsilon_1 = 0.5
"""


def test_a_string_metric_declared_by_its_epsilons(tmp_path: Path) -> None:
    registry = Registry.from_toml(EPSILON_REGISTRY)
    params = registry["homepage"].params
    assert isinstance(params, StringParams)
    # the realized probabilities meet the targets to within the realization's rounding
    assert params.epsilon_inf == pytest.approx(2.0, rel=1e-8)
    assert params.epsilon_1 == pytest.approx(0.5, rel=1e-8)
    assert "epsilon_inf = 2" in registry["homepage"].note
    # the registry records the chosen p, q, f: clients and collectors read the same numbers
    written = registry.to_toml()
    assert "epsilon_inf" not in written.split("note")[0] and f"f = {params.f!r}" in written
    assert Registry.from_toml(written) == registry
    # reports encoded under it decode with that cost
    with open_storage(tmp_path / "veil.db", registry, create=True) as storage:
        reports = [{**report, "metric": "homepage"}
                   for report in sdk_reports(params, ["a.example"] * 200, 7)]
        batch = validate_batch(make_batch("0" * 32, reports), registry)
        assert batch.errors == []
        storage.insert(batch.reports)
    summary = decode_metric(db=tmp_path / "veil.db", metric="homepage",
                            candidates=["a.example"], force=True).summary
    assert summary["epsilon_inf"] == params.epsilon_inf


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ("epsilon_inf = 2.0\nf = 0.5\n", "metrics.homepage.f", "not both"),
        ("epsilon_1 = 0.5\n", "metrics.homepage.epsilon_1", "needs epsilon_inf"),
        ("epsilon_inf = 0\n", "metrics.homepage.epsilon_inf", "above 0"),
        ("epsilon_inf = \"2\"\n", "metrics.homepage.epsilon_inf", "a number"),
        ("epsilon_inf = 2.0\nepsilon_1 = 40.0\n", "metrics.homepage.epsilon_1", "cannot be reached"),
    ],
)
def test_bad_epsilon_targets_name_the_field(extra: str, field: str, words: str) -> None:
    text = '[metrics.homepage]\nkind = "string"\n' + extra
    with pytest.raises(ValueError, match=words) as caught:
        Registry.from_toml(text)
    assert getattr(caught.value, "field", None) == field
