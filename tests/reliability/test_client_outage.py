"""Issue 31, logs: an application that runs while the collector is unreachable warns once per
outage, not at every ``close()``.

Before, each run of a short-lived program (a CLI tool run once a minute) logged a WARNING at its
``close()`` (the failed final upload), and with a cached registry an INFO line for the failed
refresh too: three runs, three warnings. Now the first failure of an outage is one WARNING, the
later ones (in this run or the next, since the outage is kept in the state database) are counted
and logged at DEBUG, and the first contact after it is one INFO line saying how long it lasted
and how many attempts failed. A program with no registry at all loses what it reports while
offline: its first offline run says so, and the later runs of the same outage count it.

Everything here runs as an outsider sees it: the program is a subprocess that configures
logging at INFO level, the collector a real ``veil serve`` stopped and started on its port.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import CollectorHandle
from veil.client import Client

PROGRAM = textwrap.dedent("""
    import logging
    import sys

    from veil.client import Client

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    url, state, registry = sys.argv[1], sys.argv[2], sys.argv[3] or None
    client = Client(url, state, registry=registry)
    client.report("dark_mode", True)
    client.close(timeout=2)
""")


def run(program: Path, url: str, state: Path, registry: Path | None) -> list[str]:
    """Run ``program`` once; return the log lines it printed (at INFO level and above)."""
    completed = subprocess.run(
        [sys.executable, str(program), url, str(state), str(registry or "")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr
    return completed.stderr.splitlines()


def levels(lines: list[str], level: str) -> list[str]:
    return [line for line in lines if line.startswith(f"{level} ")]


def check_one_warning_then_one_recovery(
    collector: CollectorHandle, program: Path, state: Path, registry: Path | None,
    delivered_before: int,
) -> None:
    """Three runs with the collector down: one WARNING in all; a fourth with it up: one INFO
    line for the recovery, and every report delivered."""
    collector.stop()
    runs = [run(program, collector.url, state, registry) for _ in range(3)]
    warnings = [line for lines in runs for line in levels(lines, "WARNING")]
    assert len(warnings) == 1, runs
    [warning] = warnings
    # the final upload, or (with the registry cached) the refresh that may have failed first
    assert warning.startswith(("WARNING the collector is unreachable: POST ",
                               "WARNING the collector is unreachable: GET ")), warning
    assert "connection refused" in warning and "stay queued and will be retried" in warning
    assert runs[1] == [] and runs[2] == [], runs  # later runs: nothing at INFO level or above

    collector.start()  # the same port
    lines = run(program, collector.url, state, registry)
    assert levels(lines, "WARNING") == [] and levels(lines, "ERROR") == [], lines
    [recovered] = levels(lines, "INFO")
    assert recovered.startswith("INFO the collector is reachable again after "), recovered
    failed = int(recovered.split(" failed attempts since ")[0].rsplit("(", 1)[1])
    assert failed >= 3  # at least the final upload of each run
    assert collector.counts("dark_mode")["reports"] == delivered_before + 4


def test_a_program_run_three_times_offline_warns_once_with_its_registry_given(
    collector_factory, tmp_path
):
    collector = collector_factory()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    check_one_warning_then_one_recovery(
        collector, program, tmp_path / "state", collector.registry_path, delivered_before=0
    )


def test_a_program_run_three_times_offline_warns_once_with_its_registry_cached(
    collector_factory, tmp_path
):
    """The registry comes from the cache the first run wrote: each offline run fails to
    refresh it as well as to upload, and those failures belong to the same outage."""
    collector = collector_factory()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    state = tmp_path / "state"
    assert run(program, collector.url, state, None) == []
    assert collector.counts("dark_mode")["reports"] == 1
    check_one_warning_then_one_recovery(collector, program, state, None, delivered_before=1)


def test_a_program_that_never_had_a_registry_announces_its_losses_in_its_first_offline_run(
    collector_factory, tmp_path
):
    """With no registry given or cached, each offline run loses the values it reported (they
    wait in memory for a registry that does not come). The first run says so; the later runs of
    the same outage only count the loss (client.drops['no_registry'])."""
    collector = collector_factory()
    collector.stop()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    state = tmp_path / "state"
    runs = [run(program, collector.url, state, None) for _ in range(3)]
    first = levels(runs[0], "WARNING")
    assert len(first) == 2 and runs[0] == first, runs[0]
    assert first[0].startswith("WARNING the collector is unreachable: GET ")
    assert "dropped and counted in client.drops['no_registry']" in first[0]
    assert first[1].startswith("WARNING lost 1 value reported before the metric registry arrived")
    assert runs[1] == [] and runs[2] == [], runs

    collector.start()
    lines = run(program, collector.url, state, None)
    [recovered] = lines
    assert recovered.startswith("INFO the collector is reachable again after "), lines
    assert collector.counts("dark_mode")["reports"] == 1
    with Client(collector.url, state) as again:
        assert again.drops["no_registry"] == 3 and again.outage is None
