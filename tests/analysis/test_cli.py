"""``veil decode`` and ``veil map`` end to end: google/rappor files, a live collector over
HTTP, and the collector's SQLite file, for every kind of metric.

Reports are encoded by the real client encoders (seeded noise so runs repeat),
uploaded with ``requests`` to a real collector on 127.0.0.1, and decoded.
"""

from __future__ import annotations

import csv
import json
import random
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.analysis.test_cli_small_populations import METRIC, write_database
from veil.client.encoders import make_encoder
from veil.server.analysis import (
    RAPPOR_COLUMNS,
    build_map,
    simulate_string_counts,
    write_counts,
    write_map,
    write_params,
)
from veil.server.cli import main
from veil.shared.kinds import BooleanParams, StringParams
from veil.shared.wire import make_batch, make_report

STRING_COLUMNS = [
    "metric", "kind", "value", "string", "estimate", "std_error", "low_95", "high_95",
    "proportion", "prop_std_error", "prop_low_95", "prop_high_95", "p_value", "log10_p_value",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_listing_the_commands_does_not_load_the_numeric_stack() -> None:
    code = (
        "import sys, veil.server.analysis, veil.server.analysis.cli; "
        "assert not {'numpy', 'scipy', 'sklearn', 'matplotlib'} & set(sys.modules), sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


CHART_HELPER = """
import sys
from pathlib import Path
import numpy as np
from veil.server.analysis import StringDecoder, build_map, simulate_string_counts
from veil.server.analysis.charts import ChartWorker, plot_estimates
from veil.server.analysis.files import write_outputs
from veil.shared.kinds import StringParams

out = Path(sys.argv[1])
with ChartWorker() as charts:
    assert charts is not None  # one thread, and fork is available: the helper runs
    params = StringParams(k=32, h=2, m=8)
    names = ["alpha.example", "beta.example"]
    counts = simulate_string_counts(
        params, build_map(params, names), np.array([0.7, 0.3]), 100_000, np.random.default_rng(1)
    )
    result = StringDecoder(params).fit(*counts, names).result_
    paths = write_outputs(result, out, charts=charts)
    assert paths["chart"].read_bytes().startswith(b"\\x89PNG")
    try:  # an error while drawing reaches the caller
        charts.submit(plot_estimates, result, out / "absent" / "chart.png").result()
    except FileNotFoundError:
        print("error reported")
"""


def test_the_chart_is_drawn_by_a_helper_process_that_reports_its_errors(tmp_path: Path) -> None:
    if sys.platform == "win32":
        pytest.skip("no fork on Windows: the chart is drawn in-process there")
    done = subprocess.run(
        [sys.executable, "-c", CHART_HELPER, str(tmp_path / "out")],
        check=True, capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.strip() == "error reported"
    assert (tmp_path / "out" / "results.csv").exists()


def test_decode_google_rappor_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = StringParams(k=32, h=2, m=8)
    names = ["alpha.example", "beta.example", "gamma.example"]
    shares = np.array([0.6, 0.3, 0.1])
    reports, ones = simulate_string_counts(
        params, build_map(params, names), shares, 300_000, np.random.default_rng(41)
    )
    write_params(params, tmp_path / "params.csv")
    write_counts(reports, ones, tmp_path / "counts.csv")
    write_map(params, names + [f"decoy{i}.example" for i in range(40)], tmp_path / "map.csv")
    out = tmp_path / "out"
    code = main(["decode", "--params", str(tmp_path / "params.csv"), "--counts",
                 str(tmp_path / "counts.csv"), "--map", str(tmp_path / "map.csv"), "--out", str(out)])
    assert code == 0
    assert "3 of 43 candidates detected" in capsys.readouterr().out
    with open(out / "results.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert header == STRING_COLUMNS
    assert set(RAPPOR_COLUMNS) <= set(header)
    rows = _read_csv(out / "results.csv")
    assert [row["string"] for row in rows] == [row["value"] for row in rows] == names
    for row, share in zip(rows, shares, strict=True):
        # within 4 stated standard errors of the truth
        assert abs(float(row["proportion"]) - share) < 4 * float(row["prop_std_error"])
        assert float(row["prop_low_95"]) <= float(row["proportion"]) <= float(row["prop_high_95"])
        assert float(row["estimate"]) == pytest.approx(float(row["proportion"]) * 300_000, rel=0.01)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("reports", "detected", "allocated_proportion", "missing_proportion",
                "signal_explained_by_detected", "unexplained_variance", "noise_sd_per_bit_share",
                "min_detectable_proportion", "epsilon_1", "epsilon_inf", "elapsed_seconds"):
        assert key in summary
    assert summary["reports"] == int(reports.sum())
    assert summary["epsilon_inf"] == params.epsilon_inf
    chart = (out / "estimates.png").read_bytes()
    assert chart.startswith(PNG_MAGIC) and len(chart) > 5000


def test_map_command_writes_google_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = StringParams(k=16, h=2, m=4)
    write_params(params, tmp_path / "params.csv")
    (tmp_path / "candidates.txt").write_text("apple\nbanana\n\napple\ncarrot\n", encoding="utf-8")
    assert main(["map", "--params", str(tmp_path / "params.csv"),
                 "--candidates", str(tmp_path / "candidates.txt")]) == 0
    write_map(params, ["apple", "banana", "carrot"], tmp_path / "expected.csv")
    assert capsys.readouterr().out == (tmp_path / "expected.csv").read_text()


def test_a_full_disk_is_named_with_its_fix(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/full answers every write with ENOSPC; the message said 'check the path and its
    permissions'."""
    if not Path("/dev/full").exists():
        pytest.skip("this system has no /dev/full")
    params = StringParams(k=16, h=2, m=4)
    write_params(params, tmp_path / "params.csv")
    (tmp_path / "candidates.txt").write_text("apple\nbanana\n", encoding="utf-8")
    assert main(["map", "--params", str(tmp_path / "params.csv"), "--candidates",
                 str(tmp_path / "candidates.txt"), "--out", "/dev/full"]) == 1
    error = capsys.readouterr().err
    assert "No space left on device; free some space on that filesystem" in error
    assert "permissions" not in error


#: google/rappor's map.csv rows for k=16, h=2, m=4 (its bin/hash_candidates_test.py vectors;
#: google/rappor ends lines with CRLF, gen_case.py and Veil with LF)
GOOGLE_MAP = "apple,5,1,26,26,38,34,63,62\nbanana,12,14,28,24,37,34,62,49\ncarrot,4,12,25,21,48,38,61,54\n"


def test_map_command_reproduces_googles_map_with_md5_google(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "params.csv").write_text("k,h,m,p,q,f\n16,2,4,0.5,0.75,0.5\n")
    (tmp_path / "candidates.txt").write_text("apple\nbanana\ncarrot\n", encoding="utf-8")
    args = ["map", "--params", str(tmp_path / "params.csv"),
            "--candidates", str(tmp_path / "candidates.txt")]
    assert main([*args, "--hashing", "md5-google", "--out", str(tmp_path / "map.csv")]) == 0
    assert (tmp_path / "map.csv").read_bytes() == GOOGLE_MAP.encode()
    assert main(args) == 0
    assert capsys.readouterr().out != GOOGLE_MAP  # Veil's mmh3 hashing stays the default


def test_decode_hashes_candidates_as_google_clients_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--candidates --hashing md5-google`` decodes like Google's own map.csv."""
    params = StringParams(k=16, h=2, m=4, hashing="md5-google")
    names = ["apple", "banana", "carrot"]
    reports, ones = simulate_string_counts(
        params, build_map(params, names), np.array([0.6, 0.3, 0.1]), 200_000,
        np.random.default_rng(7),
    )
    write_params(params, tmp_path / "params.csv")
    write_counts(reports, ones, tmp_path / "counts.csv")
    (tmp_path / "map.csv").write_text(GOOGLE_MAP)
    (tmp_path / "candidates.txt").write_text("\n".join(names) + "\n")
    files = ["--params", str(tmp_path / "params.csv"), "--counts", str(tmp_path / "counts.csv")]
    assert main(["decode", *files, "--map", str(tmp_path / "map.csv"),
                 "--out", str(tmp_path / "google")]) == 0
    assert main(["decode", *files, "--candidates", str(tmp_path / "candidates.txt"),
                 "--hashing", "md5-google", "--out", str(tmp_path / "veil")]) == 0
    google = _read_csv(tmp_path / "google" / "results.csv")
    assert _read_csv(tmp_path / "veil" / "results.csv") == google
    assert {row["string"] for row in google} >= {"apple", "banana"}
    capsys.readouterr()
    # refused for --hashing itself, before the missing database is even looked at
    assert main(["decode", "--db", str(tmp_path / "none.db"), "--metric", "m", "--hashing",
                 "md5-google", "--out", str(tmp_path / "db")]) == 2
    assert "--hashing goes with --params/--counts" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["decode", "discover", "export", "archive", "assoc"])
def test_an_empty_out_is_refused_not_the_current_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """``--out ""`` named the current directory, where a run wrote its files."""
    option = "--output-dir" if command == "assoc" else "--out"
    source = ["--metric-name", "m"] if command == "assoc" else [
        "--db", str(tmp_path / "none.db"), "--metric", "m"]
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        main([command, *source, option, " "])
    assert exited.value.code == 2
    assert f"{option}: names no directory; give one, such as results/" \
        in capsys.readouterr().err


def test_decode_reports_dimension_mismatch_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_params(StringParams(k=16, h=2, m=4), tmp_path / "params.csv")
    write_counts(np.array([5, 5]), np.ones((2, 16), dtype=int), tmp_path / "counts.csv")
    (tmp_path / "c.txt").write_text("a\n")
    code = main(["decode", "--params", str(tmp_path / "params.csv"), "--counts",
                 str(tmp_path / "counts.csv"), "--candidates", str(tmp_path / "c.txt"),
                 "--out", str(tmp_path / "out")])
    assert code == 2
    assert "counts.csv has 2 rows but" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# collected data: real encoders -> real collector -> veil decode --server / --db

STRING_SHARES = {"example.com": 0.6, "veil.dev": 0.3, "news.example": 0.1}
INSTALLATIONS = 3000


def _values(metric: str, rng: random.Random) -> list:
    if metric == "homepage":
        names = list(STRING_SHARES)
        return rng.choices(names, weights=list(STRING_SHARES.values()), k=INSTALLATIONS)
    if metric == "browser":
        return rng.choices(["firefox", "chrome", "safari", "other"], [0.2, 0.5, 0.2, 0.1],
                           k=INSTALLATIONS)
    if metric == "dark_mode":
        return [rng.random() < 0.35 for _ in range(INSTALLATIONS)]
    high = {"load_time": 10.0, "battery": 100.0, "latency": 1.0}[metric]
    return [rng.uniform(0.2, 0.9) * high for _ in range(INSTALLATIONS)]


def _upload(collector, metric: str, values: list, seed: int) -> None:
    definition = collector.registry[metric]
    reports = []
    for i, value in enumerate(values):
        encoder = make_encoder(definition, (seed * 100_000 + i).to_bytes(32, "big"), i,
                               random.Random(seed * 100_000 + i).randbytes)
        payload = encoder.encode(value)
        reports.append(make_report(secrets.token_hex(16), metric, encoder.cohort, payload,
                                   definition.params.fingerprint))
    for start in range(0, len(reports), 1000):
        batch = make_batch(secrets.token_hex(16), reports[start : start + 1000])
        response = requests.post(collector.url + "/v1/reports", json=batch, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] == len(batch["reports"])


def _truth(metric: str, values: list) -> dict[str, float]:
    if metric == "homepage":
        return {name: values.count(name) / len(values) for name in STRING_SHARES}
    if metric == "browser":
        return {name: values.count(name) / len(values) for name in ("firefox", "chrome", "safari", "other")}
    if metric == "dark_mode":
        share = sum(values) / len(values)
        return {"true": share, "false": 1 - share}
    return {"mean": sum(values) / len(values)}


METRICS = ["homepage", "browser", "dark_mode", "load_time", "battery", "latency"]


def test_decode_collected_data_over_http_and_from_the_database(
    live_collector, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(42)
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join([*STRING_SHARES, "other.example", "more.example"]) + "\n")
    for number, metric in enumerate(METRICS):
        values = _values(metric, rng)
        _upload(live_collector, metric, values, seed=number + 1)
        truth = _truth(metric, values)
        extra = ["--candidates", str(candidates)] if metric == "homepage" else []
        http_out, db_out = tmp_path / f"{metric}-http", tmp_path / f"{metric}-db"
        assert main(["decode", "--server", live_collector.url, "--token", live_collector.token,
                     "--metric", metric, "--out", str(http_out), *extra]) == 0
        assert main(["decode", "--db", str(live_collector.db_path), "--metric", metric,
                     "--out", str(db_out), *extra]) == 0
        http_rows, db_rows = _read_csv(http_out / "results.csv"), _read_csv(db_out / "results.csv")
        assert http_rows == db_rows
        assert (db_out / "estimates.png").read_bytes().startswith(PNG_MAGIC)
        summary = json.loads((db_out / "summary.json").read_text())
        assert summary["reports"] == INSTALLATIONS
        assert summary["metric"] == metric
        # a statistic on the metric's range [low, high] is estimated in the metric's unit;
        # the others are shares
        on_range = {"low", "high"} <= summary.keys()
        assert http_rows, metric
        for row in http_rows:
            assert (row["metric"], row["kind"]) == (metric, summary["kind"])
            value = float(row["estimate"] if on_range else row["proportion"])
            se = float(row["std_error"] if on_range else row["prop_std_error"])
            # every reported estimate within 4 of its standard errors of the truth
            assert abs(value - truth[row["value"]]) < 4 * se, (metric, row, truth)
    capsys.readouterr()


def test_decode_errors_from_a_collector(
    live_collector, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    assert main(["decode", "--server", live_collector.url, "--token", "wrong", "--metric",
                 "browser", "--out", out]) == 1
    assert "401" in capsys.readouterr().err
    _upload(live_collector, "rare", ["x"] * 10, seed=9)
    assert main(["decode", "--server", live_collector.url, "--token", live_collector.token,
                 "--metric", "rare", "--out", out]) == 1
    assert "too_few_reports" in capsys.readouterr().err
    # a local database file honours min_reports too, unless the operator forces it
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("x\ny\n", encoding="utf-8")
    rare = ["decode", "--db", str(live_collector.db_path), "--metric", "rare",
            "--candidates", str(candidates), "--out", out]
    assert main(rare) == 1
    assert "at least 50" in capsys.readouterr().err
    assert main([*rare, "--force"]) == 0
    assert json.loads((Path(out) / "summary.json").read_text())["reports"] == 10
    capsys.readouterr()
    _upload(live_collector, "homepage", ["x"] * 10, seed=10)
    assert main(["decode", "--db", str(live_collector.db_path), "--metric", "homepage",
                 "--out", out]) == 2
    assert "give the candidate strings" in capsys.readouterr().err
    assert main(["decode", "--db", str(live_collector.db_path), "--metric", "nope",
                 "--out", out]) == 2
    assert "has no metric 'nope'" in capsys.readouterr().err
    assert main(["decode", "--db", str(tmp_path / "missing.db"), "--metric", "homepage",
                 "--out", out]) == 2
    assert "no Veil database at" in capsys.readouterr().err
    # options only string decoders read are refused for another kind, not ignored
    _upload(live_collector, "browser", ["firefox"] * 60, seed=11)
    for option in (["--candidates", str(candidates)], ["--all"], ["--no-background"],
                   ["--correction", "bh"], ["--alpha", "0.01"], ["--alpha", "0"]):
        assert main(["decode", "--db", str(live_collector.db_path), "--metric", "browser",
                     "--out", out, *option]) == 2
        assert f"{option[0]} applies to string metrics only; 'browser' is a category metric" \
            in capsys.readouterr().err


def test_a_source_on_the_command_line_wins_over_the_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """$VEIL_URL and $VEIL_DB apply only when neither --server nor --db is given: a shell
    exporting both still decodes ``--db "$VEIL_DB"``; with no option it asks to choose."""
    db = write_database(tmp_path / "veil.db", BooleanParams(alpha=0.6, beta=0.4),
                        [True, False] * 150, seed=3)
    nowhere = "http://127.0.0.1:9"  # nothing listens on the discard port
    monkeypatch.setenv("VEIL_DB", str(db))
    monkeypatch.setenv("VEIL_URL", nowhere)
    decode = ["decode", "--metric", METRIC, "--out", str(tmp_path / "out")]
    assert main([*decode, "--db", str(db)]) == 0
    assert "300 reports" in capsys.readouterr().out
    assert main([*decode, "--server", nowhere]) == 1
    assert f"cannot reach the collector at {nowhere}" in capsys.readouterr().err
    assert main(decode) == 2
    assert "$VEIL_URL and $VEIL_DB are both set" in capsys.readouterr().err
    monkeypatch.delenv("VEIL_URL")
    assert main(decode) == 0  # $VEIL_DB alone
    assert "300 reports" in capsys.readouterr().out
