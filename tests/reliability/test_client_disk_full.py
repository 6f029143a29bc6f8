"""Issue 25, item 10: a full disk under the client's state directory was logged as "cannot
rollback - no transaction is active" instead of what happened. SQLite rolls a transaction
back by itself when a write fails for want of space; the SDK's ROLLBACK then failed, and
its error replaced the real one.

A real program fills a real file system: a 256 KiB tmpfs (mounting one needs root on
Linux, else that variant is skipped), or a file-size limit (``RLIMIT_FSIZE``, anywhere on
POSIX; SQLite reports the refused write as a "disk I/O error").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""\
    import logging
    import resource
    import signal
    import sys

    from veil.client import Client

    logging.basicConfig(format="%(levelname)s %(message)s")
    url, state, registry, limit = sys.argv[1:]
    client = Client(url, state, registry=registry, max_retries=0)
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
    for index in range(20_000):
        client.report("browser", "firefox" if index % 2 else "chrome")
        if index % 100 == 0 and client.drops["state"]:
            break
    queued = client.pending
    result = client.close()
    print(queued, result.remaining, result.error, sep="\\n")
""")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, unmounted after the test."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux (the file-size limit test runs anyway)")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs",
                              str(mount_point)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill(tmp_path: Path, url: str, state: Path, registry: Path, limit: int | None
         ) -> tuple[str, int, int, str]:
    """Run :data:`PROGRAM` until the state directory's disk refuses writes; return what it
    logged, the reports it had queued, what ``close()`` said remains, and close()'s error."""
    script = tmp_path / "fill.py"
    script.write_text(PROGRAM)
    completed = subprocess.run(
        [sys.executable, str(script), url, str(state), str(registry), str(limit or "")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    queued, remaining, error = completed.stdout.splitlines()
    return completed.stderr, int(queued), int(remaining), error


@pytest.mark.parametrize("way", ["tmpfs", "file-size-limit"])
def test_a_full_state_disk_is_reported_as_such(request, tmp_path, test_registry, offline_url,
                                               way):
    registry = tmp_path / "metrics.toml"
    registry.write_text(test_registry.to_toml())
    if way == "tmpfs":
        state, limit, cause = request.getfixturevalue("small_disk") / "state", None, \
            "database or disk is full"
    else:
        state, limit, cause = tmp_path / "state", 150_001, "disk I/O error"
    logged, queued, remaining, error = fill(tmp_path, offline_url, state, registry, limit)
    assert "cannot rollback" not in logged + error
    assert f"dropped a report of 'browser': {cause}" in logged  # report() said it already
    assert f"the state database failed during an upload: {cause}" in logged
    assert error == f"the state database failed: {cause}"
    assert queued > 0 and remaining == queued  # still queued for the next start, not 0
