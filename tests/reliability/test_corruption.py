"""A damaged database is refused at open, answered 503 while serving, and reported with its
recovery by ``veil check``; no command prints a traceback.

Damage is made as a failing disk or a stray write makes it: whole pages of a real SQLite
file overwritten, after the storage closed it or under a running collector.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from veil.server.storage import StorageError, open_storage
from veil.server.storage.sqlite.files import PAGE_SIZE
from veil.shared.registry import Registry
from veil.shared.wire import Report, make_batch, make_report

DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
#: what overwrites a page: not a valid b-tree page type, so SQLite sees the damage
PATTERN = b"\xa5" * PAGE_SIZE
COMMAND_TIMEOUT = 60


def fill(path: Path, registry: Registry, per_day: int = 400) -> int:
    """A sound database holding string, yes/no and number reports; the number stored."""
    with open_storage(path, registry, create=True) as storage:
        for day in DAYS:
            reports = [Report(os.urandom(16).hex(), "homepage", i % 4, os.urandom(4).hex(), None)
                       for i in range(per_day)]
            reports += [Report(os.urandom(16).hex(), "dark_mode", 0, i % 2, i % 2)
                        for i in range(per_day)]
            reports += [Report(os.urandom(16).hex(), "load_time", 0, i / 7, i / 7)
                        for i in range(per_day)]
            storage.insert(reports, day)
    return 3 * per_day * len(DAYS)


def root_page(path: Path, table: str) -> int:
    """The page number of ``table``'s b-tree root."""
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = ?",
                                (table,)).fetchone()[0])


def middle_pages(path: Path, count: int = 4) -> range:
    """``count`` pages in the middle of the file (numbered from 1, as SQLite does)."""
    first = path.stat().st_size // PAGE_SIZE // 2
    return range(first, first + count)


def scribble(path: Path, pages: Iterable[int]) -> None:
    """Overwrite whole pages with :data:`PATTERN`."""
    with path.open("r+b") as file:
        for page in pages:
            file.seek((page - 1) * PAGE_SIZE)
            file.write(PATTERN)


def veil(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``veil`` command."""
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT)


@pytest.fixture
def db(tmp_path: Path, test_registry: Registry) -> Path:
    """A closed, sound database file."""
    path = tmp_path / "veil.db"
    fill(path, test_registry)
    return path


def test_opening_a_scribbled_file_refuses_naming_the_file_and_the_recovery(db):
    scribble(db, middle_pages(db))
    with pytest.raises(StorageError) as refused:
        open_storage(db)
    message = str(refused.value)
    assert f"{db} is damaged" in message
    assert f"veil check --db {db}" in message and "backup" in message


def test_a_collector_answers_503_when_a_damaged_page_is_read_or_written(db, test_registry,
                                                                        app_factory):
    """Pages damaged under a running collector: counts and uploads answer 503 (nothing is
    stored), and from then on the readiness probe says the collector is not ready."""
    client = app_factory(DATABASE=db, READ_TOKENS=["reader"]).test_client()
    assert client.get("/readyz").status_code == 200
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT count(*) FROM reports").fetchone()[0]
    # counts read the aggregates; an upload writes the new ids (the aggregates count them later)
    scribble(db, [root_page(db, "folded_aggregates"), root_page(db, "recent_ids")])
    with sqlite3.connect(db) as conn:
        # another process commits (as a second worker would), so this collector reads its pages
        # from the file again rather than from its own page cache; the file's rows stay as they are
        conn.execute("INSERT INTO meta (key, value) VALUES ('other', '')")
        conn.execute("DELETE FROM meta WHERE key = 'other'")

    counts = client.get("/v1/metrics/homepage/counts", headers={"Authorization": "Bearer reader"})
    params = test_registry["homepage"].params
    batch = make_batch(os.urandom(16).hex(), [
        make_report(os.urandom(16).hex(), "homepage", 1, "0f0f0f0f", params.fingerprint)])
    upload = client.post("/v1/reports", json=batch)
    for response in (counts, upload):
        assert response.status_code == 503, response.get_data(as_text=True)
        assert response.headers["Retry-After"] == "5"
        assert response.json["error"]["code"] == "unavailable"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM reports").fetchone()[0] == stored

    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "is damaged" in ready.json["error"]["message"]
    assert client.get("/healthz").status_code == 200


def test_a_malformed_aggregate_row_is_503_and_rebuilding_repairs_it(db, app_factory):
    """A row SQLite reads without complaint but Veil never wrote (a counter blob of the
    wrong size, written by another program): counts answer 503, veil check calls the
    file inconsistent, and rebuilding the aggregates from the raw reports repairs it."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE folded_aggregates SET bit_counts = x'0102' "
                     "WHERE metric = 'homepage' AND day = ? AND cohort = 1", (DAYS[1],))
    client = app_factory(DATABASE=db, READ_TOKENS=["reader"]).test_client()
    counts = client.get("/v1/metrics/homepage/counts", headers={"Authorization": "Bearer reader"})
    assert counts.status_code == 503, counts.get_data(as_text=True)
    checked = veil("check", "--db", str(db))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "INCONSISTENT" in checked.stdout
    assert f"metric 'homepage', day {DAYS[1]}, cohort 1: bit_counts differ" in checked.stdout
    assert f"veil rebuild-aggregates --db {db}" in checked.stdout
    rebuilt = veil("rebuild-aggregates", "--db", str(db))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert client.get("/v1/metrics/homepage/counts",
                      headers={"Authorization": "Bearer reader"}).status_code == 200
    assert veil("check", "--db", str(db)).returncode == 0


@pytest.mark.parametrize("command", [
    ["serve", "--config", "{config}", "--port", "0"],
    ["export", "--metric", "homepage", "--out", "{tmp}/export"],
    ["rebuild-aggregates"],
    ["backup", "--out", "{tmp}/copy.db"],
    ["decode", "--metric", "dark_mode", "--out", "{tmp}/decoded"],
], ids=lambda command: command[0])
def test_commands_on_a_damaged_file_print_one_line_and_exit_1(db, tmp_path, test_registry,
                                                              command):
    config = tmp_path / "metrics.toml"
    config.write_text(test_registry.to_toml(), encoding="utf-8")
    scribble(db, [root_page(db, "meta"), *middle_pages(db)])
    args = [arg.format(config=config, tmp=tmp_path) for arg in command]
    result = veil(*args, "--db", str(db))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"veil {command[0]}: error: {db} is damaged")
    assert f"veil check --db {db}" in result.stderr


def test_veil_check_says_sound_or_damaged_with_the_recovery(db):
    sound = veil("check", "--db", str(db))
    assert sound.returncode == 0, sound.stdout + sound.stderr
    assert f"{db} is sound" in sound.stdout and f"recount of {3 * 400 * 3:,} raw" in sound.stdout

    scribble(db, middle_pages(db))
    damaged = veil("check", "--db", str(db))
    assert damaged.returncode == 1, damaged.stdout + damaged.stderr
    assert "Traceback" not in damaged.stderr
    assert f"{db} is DAMAGED" in damaged.stdout
    assert "veil backup" in damaged.stdout and f"mv {db} {db}.damaged" in damaged.stdout
    assert "Reports acknowledged after that backup are not in the copy" in damaged.stdout
