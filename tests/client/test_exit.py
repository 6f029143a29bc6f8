"""Issue 25, item 9: what a program that exits without ``flush()`` or ``close()`` delivers.

On an installation's first run (no cached registry) the values reported before the
registry arrived waited in memory, and a normal exit lost them: nothing delivered,
nothing counted, nothing logged, with ``background=True`` too (its exit hook was
registered only once a report reached the outbox). Each test runs a real program in a
subprocess against a real ``veil serve``: it makes a client on an empty state directory,
reports 10 values and returns, as a short-lived command-line tool does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from veil.client import Client

PROGRAM = textwrap.dedent("""\
    import sys

    from veil.client import Client

    url, state, registry, background, shutdown_timeout = sys.argv[1:]
    options = {"shutdown_timeout": float(shutdown_timeout)} if shutdown_timeout else {}
    client = Client(url, state, registry=registry or None, background=background == "yes",
                    **options)
    for index in range(10):
        client.report("dark_mode", index % 3 == 0)
    print(client.pending)
""")


def run_program(tmp_path: Path, url: str, state: Path, *, registry: Path | None = None,
                background: bool = False, shutdown_timeout: float | None = None
                ) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run :data:`PROGRAM` to its normal exit (``shutdown_timeout``: ``None`` for the
    default); return it and how long it took (seconds)."""
    script = tmp_path / "tool.py"
    script.write_text(PROGRAM)
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, str(script), url, str(state), str(registry or ""),
         "yes" if background else "no", "" if shutdown_timeout is None else str(shutdown_timeout)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    elapsed = time.monotonic() - started
    assert completed.returncode == 0, completed.stderr
    return completed, elapsed


@pytest.mark.parametrize("background", [False, True], ids=["flush-by-hand", "background"])
@pytest.mark.parametrize("shipped", [False, True], ids=["fetched-registry", "shipped-registry"])
def test_a_first_run_that_exits_without_flushing_delivers_its_reports(
    collector, tmp_path, background, shipped
):
    state = tmp_path / "state"
    registry = collector.registry_path if shipped else None
    completed, _ = run_program(tmp_path, collector.url, state, registry=registry,
                               background=background)
    assert completed.stdout.split() == ["10"]  # waiting in memory, or queued, at exit
    assert collector.counts("dark_mode")["reports"] == 10
    assert "Traceback" not in completed.stderr
    with Client(collector.url, state) as again:
        assert again.pending == 0 and again.dropped == 0


def test_with_the_collector_down_the_loss_is_logged_and_counted_for_the_next_start(
    collector, tmp_path
):
    collector.stop()
    state = tmp_path / "state"
    completed, elapsed = run_program(tmp_path, collector.url, state)
    [warning] = [line for line in completed.stderr.splitlines() if line.startswith("lost ")]
    assert warning.startswith("lost 10 values reported before the metric registry arrived: it "
                              "could not be fetched at exit, within shutdown_timeout=2 s")
    assert "connection refused" in warning and "client.drops['no_registry']" in warning
    assert elapsed < 10
    again = Client(collector.url, state)
    assert again.drops["no_registry"] == 10 and again.pending == 0
    collector.start()
    assert again.flush(timeout=10).ok
    again.close()


def test_the_exit_is_bounded_by_shutdown_timeout_against_a_collector_that_hangs(
    tmp_path, silent_url
):
    state = tmp_path / "state"
    completed, elapsed = run_program(tmp_path, silent_url, state, shutdown_timeout=1.0)
    assert elapsed < 1.0 + 4.0  # the interpreter's start and the SDK's import included
    assert "lost 10 values" in completed.stderr
    assert "within shutdown_timeout=1 s" in completed.stderr
    with Client(silent_url, state) as again:
        assert again.drops["no_registry"] == 10
    completed, elapsed = run_program(tmp_path, silent_url, tmp_path / "other",
                                     shutdown_timeout=0)
    assert elapsed < 4.0 and "lost 10 values" in completed.stderr
