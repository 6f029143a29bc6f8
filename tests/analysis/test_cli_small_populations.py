"""``veil decode --db ... --force`` on tiny and empty-looking populations of every mechanism.

At small N an unbiased estimate can fall below 0 (or a mean below the metric's
``low``), i.e. below the lower end of its interval, which is clipped to where the
truth lies. ``veil decode`` once wrote ``results.csv`` and ``summary.json`` for
such a decode and then crashed drawing ``estimates.png``. Here every mechanism of
:data:`veil.shared.kinds.MECHANISMS` (through the examples of
``tests/test_common_checks.py``) is decoded from a real collector SQLite file
holding 300, 2 and 1 reports, and with none at all; and populations built to
give negative estimates are decoded to all three files.

Reports come from the SDK encoders (seeded secrets and noise, so runs repeat),
pass wire validation and are stored with :meth:`Storage.insert`, as the
collector stores them. The command line runs in-process (``main([...])``).
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.test_common_checks import EXAMPLES, IDS, population, registry_for, sdk_reports
from veil.server.analysis.joint import variable_columns
from veil.server.analysis.tables import RESULT_COLUMNS, STRING_COLUMNS, TEXT_COLUMNS
from veil.server.cli import main
from veil.server.storage import open_storage
from veil.server.storage.base import today
from veil.shared.kinds import (
    MECHANISMS,
    CategoryParams,
    DiscoveryParams,
    GrrParams,
    HadamardParams,
    JointParams,
    MechanismParams,
    NumberParams,
    OlhParams,
    OracleParams,
    OueParams,
)
from veil.shared.registry import DEFAULT_MIN_REPORTS
from veil.shared.wire import make_batch, validate_batch

#: the metric's name (``sdk_reports`` encodes every report for a metric called "m"; a
#: discovery example's reports go to its channel "m.discovery", and its string reports to "m")
METRIC = "m"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SIZES = [300, 2, 1]


def fewest_reports(params: MechanismParams) -> int:
    """Reports a decode needs: laplace and gaussian means take their standard error from the
    reports' sample variance, so they need two (``decode_number``); the rest need one."""
    if isinstance(params, NumberParams) and params.mechanism in ("laplace", "gaussian"):
        return 2
    return 1


def write_database(path: Path, params: MechanismParams, values: list[Any], seed: int) -> Path:
    """A collector SQLite file with ``params`` registered as :data:`METRIC` (default
    ``min_reports``) and one SDK-encoded report per value, validated and stored as the
    collector does. A discovery example is registered as the channel "m.discovery" of the
    string metric :data:`METRIC`: one report per value to the channel and, under other ids,
    one string report per value to :data:`METRIC`."""
    registry = registry_for(params)
    reports = sdk_reports(params, values, seed)
    if isinstance(params, DiscoveryParams):  # the string channel's reports too, own ids
        strings = sdk_reports(registry[METRIC].params, values, seed + 1)
        reports += [{**report, "id": f"f{report['id'][1:]}"} for report in strings]
    with open_storage(path, registry, create=True) as storage:
        if reports:
            batch = validate_batch(make_batch(f"{seed:032x}", reports), registry)
            assert batch.errors == []
            assert storage.insert(batch.reports).accepted == len(reports)
    return path


def decode_args(db: Path, out: Path, params: MechanismParams, candidates: list[str],
                *extra: str) -> list[str]:
    """``veil decode --db DB --metric m --force --out OUT`` (plus ``--candidates`` for strings);
    ``veil discover`` for a discovery channel (of string metric ``m``)."""
    args = [args_command(params), "--db", str(db), "--metric", METRIC, "--force", "--out", str(out), *extra]
    if params.kind == "string":
        file = out.parent / "candidates.txt"
        file.write_text("\n".join(candidates) + "\n", encoding="utf-8")
        args += ["--candidates", str(file)]
    return args


def args_command(params: MechanismParams) -> str:
    """The command that reads ``params``' reports: ``discover`` for a discovery channel."""
    return "discover" if isinstance(params, DiscoveryParams) else "decode"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``veil`` in-process; return its exit code, stdout and stderr. Fails on numeric
    (RuntimeWarning: NaN, division by zero, overflow) or user warnings (matplotlib's)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(args)
    captured = capsys.readouterr()
    noisy = [w for w in caught if issubclass(w.category, RuntimeWarning | UserWarning)]
    assert not noisy, [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in noisy]
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def _reject_constant(name: str) -> None:
    raise AssertionError(f"summary.json holds {name}, which is not JSON")


def check_outputs(out: Path, params: MechanismParams, reports: int,
                  candidates: list[str] | None) -> list[dict[str, str]]:
    """The three files are there and sound; return the rows of results.csv."""
    kind = "string" if isinstance(params, DiscoveryParams) else params.kind
    columns = list(STRING_COLUMNS if kind == "string" else RESULT_COLUMNS)
    text = set(TEXT_COLUMNS)
    if isinstance(params, JointParams):  # a column per variable, and the consistent share
        variables = variable_columns(params)
        columns = [*RESULT_COLUMNS[:2], *variables, *RESULT_COLUMNS[2:], "consistent"]
        text |= set(variables)
    with open(out / "results.csv", newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        assert next(reader) == columns
        cells = list(reader)
    rows = [dict(zip(columns, row, strict=True)) for row in cells]
    for row in rows:
        assert (row["metric"], row["kind"]) == (METRIC, kind)
        # every other cell a number (no NaN, no inf), or empty where it has no meaning
        values = {name: float(row[name]) for name in columns
                  if name not in text and row[name] != ""}
        assert all(math.isfinite(v) for v in values.values()), row
        if isinstance(params, NumberParams):
            # a mean is not a share: its share and p-value columns are left empty
            assert row["value"] == "mean" and row["p_value"] == row["proportion"] == "", row
            assert params.low <= values["low_95"] <= values["high_95"] <= params.high, row
            continue
        assert set(values) == set(columns) - text, row
        assert values["log10_p_value"] <= 0.0
        assert values["p_value"] == pytest.approx(10 ** values["log10_p_value"], rel=1e-9)
        # the estimate is unbiased, so it may leave [0, 1]; its interval may not
        assert 0.0 <= values["prop_low_95"] <= values["prop_high_95"] <= 1.0, row
        assert values["std_error"] >= 0 and values["prop_std_error"] >= 0, row
        assert values["estimate"] == pytest.approx(values["proportion"] * reports, abs=1e-9)
        assert 0.0 <= values["p_value"] <= 1.0, row
    labels = [row["value"] for row in rows]
    if params.kind == "number":
        assert labels == ["mean"]
    elif params.kind == "boolean":
        assert labels == ["true", "false"]
    elif isinstance(params, CategoryParams | OracleParams):
        assert labels == list(params.categories)
    elif isinstance(params, JointParams):  # every cell of the product domain, once
        assert len(labels) == len(set(labels)) == params.cells
    else:  # strings: the detected candidates, each once
        assert len(set(labels)) == len(labels)
        assert candidates is None or set(labels) <= set(candidates)

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"),
                         parse_constant=_reject_constant)
    assert summary["reports"] == reports
    assert summary["metric"] == METRIC
    assert summary["start"] == summary["end"] == today()  # the day the reports were stored
    assert summary["kind"] == kind

    chart = (out / "estimates.png").read_bytes()
    assert chart.startswith(PNG_MAGIC) and len(chart) > 1000
    return rows


# ---------------------------------------------------------------------------------------------
# every mechanism, with 300, 2 and 1 reports

CASES = [
    pytest.param(params, shares, truth, size, id=f"{name}-{size}")
    for (params, shares, truth), name in zip(EXAMPLES, IDS, strict=True)
    for size in SIZES
    if size >= fewest_reports(params)
]
TOO_FEW = [
    pytest.param(params, size, id=f"{name}-{size}")
    for (params, _, _), name in zip(EXAMPLES, IDS, strict=True)
    for size in SIZES
    if size < fewest_reports(params)
]


def test_every_mechanism_is_covered() -> None:
    assert {params.mechanism_name for params, _, _ in EXAMPLES} == set(MECHANISMS)
    decoded = {params.mechanism_name for params, _, _ in EXAMPLES
               if any(size >= fewest_reports(params) for size in SIZES)}
    assert decoded == set(MECHANISMS)


@pytest.mark.parametrize(("params", "shares", "truth", "size"), CASES)
def test_tiny_population_decodes_to_all_three_files(
    params: MechanismParams, shares: dict[Any, float], truth: dict[str, float], size: int,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    values = population(shares, 300, seed=21)[:size]  # a seeded sample of an exact population
    assert len(values) == size
    db = write_database(tmp_path / "veil.db", params, values, seed=22)
    candidates = [*truth, "never.example"]
    out = tmp_path / "out"
    if size < DEFAULT_MIN_REPORTS:  # the file honours min_reports unless forced
        args = decode_args(db, out, params, candidates)
        args.remove("--force")
        code, _, err = run_cli(args, capsys)
        assert code == 1 and f"at least {DEFAULT_MIN_REPORTS}" in err
        assert not out.exists()
    code, stdout, _ = run_cli(decode_args(db, out, params, candidates), capsys)
    assert code == 0
    if isinstance(params, DiscoveryParams):  # found strings come from the search
        assert stdout.startswith(f"{size:,} discovery reports, ")
        found = json.loads((out / "summary.json").read_text())["discovery"]["candidates"]
        candidates = ended_strings(out / "prefixes.csv")
        # discover() hands the search's strings (one per ended prefix that is UTF-8) to the
        # string decoder as its candidates, and results.csv holds some of them
        assert found == len(candidates)
    check_outputs(out, params, size, candidates)


def ended_strings(path: Path) -> list[str]:
    """The strings the prefix search found, read from ``prefixes.csv``: the rows marked
    ``ended`` (:meth:`DiscoveryResult.prefix_rows` writes each kept or ended prefix once, its
    text up to the end marker). A prefix whose bytes are not UTF-8 is written with U+FFFD
    (so two of them may read alike) but left out of the search's strings
    (``PrefixSearch.strings_``, whose keys are :func:`discover`'s candidates), so it is
    left out here too."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert all(row["ended"] in ("True", "False") for row in rows), rows
    ended = [row["prefix"] for row in rows
             if row["ended"] == "True" and "\ufffd" not in row["prefix"]]
    assert len(set(ended)) == len(ended), ended  # a string ends at one level, once
    return sorted(ended)


@pytest.mark.parametrize(("params", "size"), TOO_FEW)
def test_too_few_reports_for_a_sample_variance_are_refused_cleanly(
    params: MechanismParams, size: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A laplace or gaussian mean of one report has no standard error: exit 2, no files."""
    db = write_database(tmp_path / "veil.db", params, [2.5] * size, seed=23)
    out = tmp_path / "out"
    code, _, err = run_cli(decode_args(db, out, params, []), capsys)
    assert code == 2
    assert f"only {size} report(s); need at least 2 to estimate" in err
    assert not (out / "results.csv").exists()


@pytest.mark.parametrize("empty", ["nothing stored", "nothing in the date range"])
@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_no_reports_is_refused_cleanly(
    params: MechanismParams, shares: dict[Any, float], truth: dict[str, float], empty: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A registered metric without reports (none stored, or none on the days asked for)
    is a clean error (exit 2) before any file is written, never a crash or an empty table."""
    values = [] if empty == "nothing stored" else population(shares, 300, seed=24)[:5]
    db = write_database(tmp_path / "veil.db", params, values, seed=25)
    out = tmp_path / "out"
    extra = [] if empty == "nothing stored" else ["--start", "2001-01-01", "--end", "2001-01-31"]
    code, _, err = run_cli(decode_args(db, out, params, [*truth], *extra), capsys)
    assert code == 2
    assert err.startswith(f"veil {args_command(params)}: error: ") and "no reports" in err
    assert not (out / "results.csv").exists()


# ---------------------------------------------------------------------------------------------
# estimates below 0, below their interval's lower end

SIXTEEN = tuple(f"c{i}" for i in range(16))
#: 285 reports of c0 and one of each other category (the tracker's "most on one category")
SKEWED = {"c0": 285 / 300, **{category: 1 / 300 for category in SIXTEEN[1:]}}


@pytest.mark.parametrize(
    "params",
    [
        # the tracker's case: basic RAPPOR, 16 categories, p=0.25, q=0.75, f=0, 300 reports
        pytest.param(CategoryParams(categories=SIXTEEN, p=0.25, q=0.75, f=0.0), id="rappor"),
        *[pytest.param(cls(categories=SIXTEEN, epsilon=3.0), id=cls.oracle)
          for cls in (GrrParams, OueParams, OlhParams, HadamardParams)],
    ],
)
def test_negative_category_shares_reach_every_output(
    params: MechanismParams, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    values = population(SKEWED, 300, seed=31)
    assert len(values) == 300
    db = write_database(tmp_path / "veil.db", params, values, seed=32)
    out = tmp_path / "out"
    code, _, err = run_cli(decode_args(db, out, params, []), capsys)
    assert code == 0
    rows = check_outputs(out, params, 300, [])
    negative = [row for row in rows if float(row["proportion"]) < 0]
    assert negative, rows
    for row in negative:
        # the table keeps the unbiased share (and count) below 0, below its clipped interval
        assert float(row["estimate"]) < 0
        assert float(row["proportion"]) < float(row["prop_low_95"]) == 0.0
    # ... and the summary's note names them, which the command repeats on stderr
    note = json.loads((out / "summary.json").read_text())["note"]
    assert "outside [0, 1] by sampling noise" in note
    assert all(repr(row["value"]) in note for row in negative)
    assert f"note: {note}" in err


@pytest.mark.parametrize(
    ("params", "seed"),
    [
        # every value at ``low``: the unbiased mean falls below it about half the time; these
        # seeds make it fall below
        pytest.param(NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0), 41,
                     id="laplace"),
        pytest.param(NumberParams(low=0.0, high=10.0, mechanism="gaussian", epsilon=2.0,
                                  delta=1e-6), 42, id="gaussian"),
        pytest.param(NumberParams(low=0.0, high=10.0, mechanism="1bitmean", epsilon=2.0), 43,
                     id="1bitmean"),
    ],
)
def test_a_mean_below_low_reaches_every_output(
    params: NumberParams, seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db = write_database(tmp_path / "veil.db", params, [params.low] * 300, seed=seed)
    out = tmp_path / "out"
    code, _, _ = run_cli(decode_args(db, out, params, []), capsys)
    assert code == 0
    [row] = check_outputs(out, params, 300, [])
    # the estimate stays unclipped (clipping would bias it); its interval is clipped to [low, high]
    assert float(row["estimate"]) < params.low == float(row["low_95"])

