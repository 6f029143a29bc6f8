"""``veil demo`` end to end at a reduced size: real collector process, real clients, real decoder."""

from __future__ import annotations

import pytest

from veil.server.cli import main
from veil.simulations.demo import SITES


def test_demo_detects_the_top_strings_and_cleans_up(tmp_path, capsys) -> None:
    """500 installations x 4 sites = 2000 reports at f = 0.25 (p* = 0.3125, q* = 0.6875).

    A string's share has standard error about sqrt(rho (1 - rho)) / (q* - p*) / sqrt(h N)
    = 0.5 / 0.375 / sqrt(4000) = 0.021; the two most visited sites hold about 23% and 17%
    of the reports, 8 or more standard errors above the Bonferroni threshold (about 3),
    so missing either has probability below 1e-9.
    """
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    out = tmp_path / "out"
    code = main(["demo", "--installations", "500", "--f", "0.25", "--out", str(out),
                 "--temp-root", str(temp_root)])
    assert code == 0
    printed = capsys.readouterr().out
    table = printed.split("Top strings of 'homepage'")[1].split("dark_mode:")[0]
    detected = [line.split()[0] for line in table.splitlines()[2:] if line.strip()
                and not line.strip().startswith("not detected")]
    assert SITES[0] in detected and SITES[1] in detected
    assert "epsilon_inf" in printed and "temporary files removed" in printed
    # the joint metric: the dark-mode share for each of the four session buckets, and the test
    joint = printed.split("dark_by_session (one joint report each)")[1].split("Privacy cost")[0]
    assert "independence test p = " in joint
    assert sum("session_minutes=" in line and "truth" in line for line in joint.splitlines()) == 4
    assert list(temp_root.iterdir()) == []  # state dirs, SQLite file and log all removed
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    header = (out / "homepage_results.csv").read_text().splitlines()[0].split(",")
    # the tidy table, with google/rappor's columns for its tools
    assert header[:4] == ["metric", "kind", "value", "string"]
    assert {"estimate", "std_error", "proportion", "prop_low_95", "prop_high_95"} <= set(header)


@pytest.mark.parametrize("installations", ["99", "100001", "100000000000"])
def test_demo_refuses_a_size_it_cannot_run_before_starting_anything(tmp_path, capsys,
                                                                   installations) -> None:
    """99 used to run every client and then fail on a metric's min_reports (100 dark_mode
    reports); 10^11 ran for ever."""
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    assert main(["demo", "--installations", installations, "--out", str(tmp_path / "out"),
                 "--temp-root", str(temp_root)]) == 2
    assert "--installations must be from 100 (the fewest" in capsys.readouterr().err
    assert list(temp_root.iterdir()) == [] and not (tmp_path / "out").exists()


def test_demo_refuses_more_workers_than_a_machine_runs(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--workers", "1000000", "--out", str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert "--workers: must be from 1 to 256; got 1000000" in capsys.readouterr().err
