"""The Parquet archive of raw reports and the aggregates recomputed from it on Dask.

Stores are real SQLite files filled with genuinely encoded reports of every kind of
:data:`TEST_REGISTRY` over several days; aggregation runs on a real ``distributed``
cluster of 2 worker processes (1 thread each), started once for the module. The
archive's aggregates must equal the collector's own, document for document (real sums
to 1e-12: buckets add floats in another order than the collector's batches).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.server.conftest import Wire
from veil.server.archive import (
    FORMAT_VERSION,
    ArchiveError,
    ArchiveFile,
    Manifest,
    aggregate,
    aggregate_bucket,
    archive,
    first_occurrences,
)
from veil.server.archive.layout import bucket_of, from_table, to_table
from veil.server.cli import main
from veil.server.storage import Storage, open_storage
from veil.server.storage.base import payload_array, today
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import statistic_for

DAYS = ["2025-03-01", "2025-03-02", "2025-03-03"]
VALUES: dict[str, list[Any]] = {
    "homepage": ["a.example", "b.example", "c.example", "d.example"] * 15,
    "browser": ["chrome", "firefox", "other"] * 6,
    "dark_mode": [True, False, False, True, False],
    "load_time": [1.0, 2.5, 9.75, 4.0],
    "battery": [3.0, 97.0, 50.0],
    "latency": [0.25, 0.75, 0.5],
    "rare": ["x", "y"] * 4,
}
BUCKETS = 4


def fill(storage: Storage, wire, days=DAYS) -> int:
    """Reports of every metric on each day; how many were stored."""
    total = 0
    for day in days:
        reports = [r for metric, values in VALUES.items() for r in wire.reports(metric, values)]
        assert storage.insert(wire.validated(reports), day).accepted == len(reports)
        total += len(reports)
    return total


def documents(storage: Storage) -> dict[tuple[str, str | None], dict[str, Any]]:
    """Every metric's counts document for each day and for all days."""
    return {(name, day): storage.counts(name, day, day, min_reports=0)
            for name in sorted(VALUES) for day in [*DAYS, None]}


def assert_same(got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]]) -> None:
    """The same counts documents (:func:`documents`), sums within 1e-12 relative."""
    assert got.keys() == want.keys()
    for key, document in want.items():
        assert got[key] == Wire.approx(document), key


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A client of a local cluster of 2 worker processes, 1 thread each, for the module."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        yield client


@pytest.fixture
def store(tmp_path, wire) -> Iterator[Storage]:
    """A SQLite store holding reports of every metric on each of :data:`DAYS`."""
    storage = open_storage(tmp_path / "veil.db", wire.registry, create=True)
    fill(storage, wire)
    yield storage
    storage.close()


@pytest.fixture
def fresh(tmp_path, wire) -> Iterator[Storage]:
    """An empty store with the test registry: where aggregates from the archive go."""
    storage = open_storage(tmp_path / "fresh.db", wire.registry, create=True)
    yield storage
    storage.close()


def parquet_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def plant_replays(root: Path, metric: str, day: str, rows: int) -> int:
    """Copy ``rows`` reports of the largest file of (metric, day) into a second file of its
    bucket, from another source, listed in the manifest: replayed ids across files."""
    manifest = Manifest.load(root)
    entry = max((f for f in manifest.files if (f.metric, f.day) == (metric, day)),
                key=lambda f: f.rows)
    copies = pq.read_table(root / entry.path).slice(0, rows)
    relative = str(Path(entry.path).with_name("part-replay.parquet"))
    pq.write_table(copies, root / relative)
    manifest.files.append(ArchiveFile(relative, metric, day, entry.bucket, "replay",
                                      copies.num_rows))
    manifest.save()
    return copies.num_rows


def test_aggregates_from_the_archive_equal_the_collectors_and_replays_are_dropped(
        store, fresh, tmp_path, dask_client):
    root = tmp_path / "archive"
    summary = archive(store, root, buckets=BUCKETS, progress=False)
    stored = store.total_reports()
    assert summary.reports == stored and len(summary.days) == len(VALUES) * len(DAYS)
    planted = sum(plant_replays(root, metric, day, rows) for metric, day, rows in [
        ("homepage", DAYS[0], 3), ("browser", DAYS[1], 2), ("load_time", DAYS[2], 1),
        ("dark_mode", DAYS[2], 1)])
    result = aggregate(root, fresh, scheduler=dask_client, progress=False)
    assert (result.reports, result.duplicates, result.rows) == (stored, planted, stored + planted)
    assert (result.metrics, result.days, result.workers) == (len(VALUES),
                                                             len(VALUES) * len(DAYS), 2)
    want = documents(store)
    assert_same(documents(fresh), want)
    # setting, not adding: a rerun, and a run into the collector's own store, change nothing
    aggregate(root, fresh, scheduler=dask_client, progress=False)
    assert_same(documents(fresh), want)
    aggregate(root, store, scheduler=dask_client, progress=False)
    assert_same(documents(store), want)


def test_the_manifest_lists_every_file_with_its_rows(store, tmp_path):
    root = tmp_path / "archive"
    archive(store, root, buckets=BUCKETS, progress=False)
    document = json.loads((root / "manifest.json").read_text())
    assert document["format_version"] == FORMAT_VERSION and document["buckets"] == BUCKETS
    assert Registry.from_dict(document["registry"]) == store.registry
    listed = sorted(entry["path"] for entry in document["files"])
    assert listed == parquet_files(root)
    assert sum(entry["rows"] for entry in document["files"]) == store.total_reports()
    for entry in document["files"]:
        assert entry["path"] == (f"metric={entry['metric']}/day={entry['day']}/"
                                 f"bucket={entry['bucket']:02d}/part-main.parquet")
        table = pq.read_table(root / entry["path"])
        assert table.num_rows == entry["rows"]
        assert table.schema.field("id").type == pa.binary(16)
        assert table.schema.field("cohort").type == pa.int32()
        ids, _, _ = from_table(statistic_for(store.registry[entry["metric"]].params), table, "")
        assert set(bucket_of(ids, BUCKETS).tolist()) == {entry["bucket"]}
    types = {entry["metric"]: pq.read_schema(root / entry["path"]).field("payload").type
             for entry in document["files"]}
    assert types["homepage"] == pa.binary(4) and types["rare"] == pa.binary(2)
    assert types["dark_mode"] == pa.int64() and types["load_time"] == pa.float64()


def test_an_archive_rerun_replaces_files_and_a_default_run_writes_only_new_days(
        store, fresh, wire, tmp_path, dask_client):
    root = tmp_path / "archive"
    archive(store, root, buckets=BUCKETS, progress=False)
    files, manifest = parquet_files(root), Manifest.load(root).files
    again = archive(store, root, start=DAYS[0], progress=False)
    assert len(again.days) == len(VALUES) * len(DAYS)
    assert parquet_files(root) == files and Manifest.load(root).files == manifest
    nothing = archive(store, root, progress=False)
    assert (nothing.days, nothing.skipped) == ([], len(VALUES) * len(DAYS))
    assert "already archived" in str(nothing)
    # a day that gained reports, written again, replaces its files: no copies, no leftovers
    fill(store, wire, [DAYS[1]])
    archive(store, root, start=DAYS[1], end=DAYS[1], progress=False)
    assert sum(f.rows for f in Manifest.load(root).files) == store.total_reports()
    assert sorted(f.path for f in Manifest.load(root).files) == parquet_files(root)
    assert not list(root.rglob("*.tmp"))
    aggregate(root, fresh, scheduler=dask_client, progress=False)
    assert_same(documents(fresh), documents(store))


def test_windows_row_groups_and_spills_that_bound_memory_keep_every_report(store, tmp_path,
                                                                           monkeypatch):
    from veil.server.archive import writer

    whole = tmp_path / "whole"
    archive(store, whole, buckets=2, progress=False)
    monkeypatch.setattr(writer, "BUFFERED_REPORTS", 20)
    monkeypatch.setattr(writer, "WINDOW_REPORTS", 150)  # a scan of the store per day or so
    small = tmp_path / "small"
    archive(store, small, buckets=2, row_group_reports=7, progress=False)
    assert parquet_files(small) == parquet_files(whole)
    assert Manifest.load(small).files == Manifest.load(whole).files
    assert not list(small.rglob("*.tmp"))
    for path in parquet_files(whole):
        metadata = pq.ParquetFile(small / path).metadata
        groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        assert all(size == 7 for size in groups[:-1]) and 0 < groups[-1] <= 7
        assert pq.read_table(small / path).sort_by("id").equals(
            pq.read_table(whole / path).sort_by("id"))


def test_a_run_that_fails_half_way_leaves_the_archive_as_it_was(store, tmp_path,
                                                                 monkeypatch):
    import fcntl

    from veil.server.archive import writer

    root = tmp_path / "archive"
    archive(store, root, buckets=BUCKETS, progress=False)
    before = (root / "manifest.json").read_bytes()
    files = {path: (root / path).read_bytes() for path in parquet_files(root)}
    real_add, calls = writer._add, []

    def failing_add(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            # the parts written so far lie in temporary files when the failure comes
            assert list(root.rglob("*.tmp"))
            raise OSError("disk full")
        real_add(*args, **kwargs)

    monkeypatch.setattr(writer, "_add", failing_add)
    monkeypatch.setattr(writer, "BUFFERED_REPORTS", 10)
    with pytest.raises(OSError, match="disk full"):
        archive(store, root, start=DAYS[0], progress=False)
    assert (root / "manifest.json").read_bytes() == before
    assert {path: (root / path).read_bytes() for path in parquet_files(root)} == files
    assert not list(root.rglob("*.tmp"))
    with (root / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(ArchiveError, match="another veil archive is writing to"):
            archive(store, root, progress=False)


def test_days_whose_raw_reports_are_gone_from_the_store_stay_archived(store, tmp_path):
    import sqlite3

    root = tmp_path / "archive"
    archive(store, root, progress=False)
    kept = [f for f in Manifest.load(root).files if f.day == DAYS[0]]
    with sqlite3.connect(tmp_path / "veil.db") as conn:  # as a retention job would
        conn.execute("DELETE FROM reports WHERE day = ?", (DAYS[0],))
    summary = archive(store, root, start=DAYS[0], progress=False)
    assert summary.empty == [(name, DAYS[0]) for name in sorted(VALUES)]
    assert "no raw reports left" in str(summary)
    assert [f for f in Manifest.load(root).files if f.day == DAYS[0]] == kept
    assert all((root / f.path).exists() for f in kept)


def test_by_default_only_days_that_are_over_are_archived(store, wire, tmp_path, caplog):
    fill(store, wire, [today()])
    caplog.set_level("INFO", logger="veil.server.archive")
    summary = archive(store, tmp_path / "archive", progress=False)
    assert "yesterday (UTC): days that are over" in caplog.text
    assert summary.end < today()
    assert {f.day for f in Manifest.load(tmp_path / "archive").files} == set(DAYS)


def test_a_day_that_is_not_over_is_neither_archived_nor_aggregated(store, wire, fresh,
                                                                    tmp_path):
    """Archived before it was over, a day was left as it was by the nightly run (its files
    existed) and aggregated short of the store's counts: now refused when archiving, and
    still refused when aggregating an archive an earlier Veil wrote so."""
    fill(store, wire, [today()])
    root = tmp_path / "archive"
    with pytest.raises(ArchiveError, match=f"--end {today()} is a UTC day that is not over"):
        archive(store, root, end=today(), progress=False)
    # the caller's input: a usage error of the command (exit 2), nothing written
    assert main(["archive", "--db", str(store.location), "--out", str(root), "--end",
                 today()]) == 2
    assert not root.exists()
    archive(store, root, progress=False)
    # as an earlier Veil recorded an open day: its file moved under today's name
    document = json.loads((root / "manifest.json").read_text())
    entry = document["files"][0]
    moved = entry["path"].replace(f"day={entry['day']}", f"day={today()}")
    (root / moved).parent.mkdir(parents=True)
    (root / entry["path"]).rename(root / moved)
    emptied = entry["day"]
    entry["day"], entry["path"] = today(), moved
    (root / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(ArchiveError, match=f"{today()}, a UTC day that is not over"):
        aggregate(root, fresh, workers=1, progress=False)
    # the days that are over still aggregate, as the store counts them
    aggregate(root, fresh, workers=1, end=DAYS[-1], progress=False)
    for day in DAYS:
        if day != emptied:
            assert fresh.counts("homepage", day, day, min_reports=0) \
                == store.counts("homepage", day, day, min_reports=0), day


#: runs veil with its arguments, killing itself (SIGKILL) right after the first archive file
#: gets its final name: a run stopped half-way, as a crash or an operator's kill -9 leaves it
KILLED_AFTER_FIRST_FILE = """
import os, signal, sys
from veil.server.cli import main
real = os.replace
def replace(source, target, *args, **kwargs):
    real(source, target, *args, **kwargs)
    if str(target).endswith(".parquet"):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
sys.exit(main(sys.argv[1:]))
"""


def test_a_first_run_killed_half_way_is_continued_by_the_next(store, fresh, tmp_path):
    """A first run killed after some files left no manifest, and every later run refused
    the directory as not a Veil archive; now the next run writes the rest, and the archive
    aggregates to the store's counts."""
    root = tmp_path / "archive"
    command = ["archive", "--db", str(store.location), "--out", str(root), "--buckets",
               str(BUCKETS)]
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_FILE, *command],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (root / "manifest.json").exists() and list(root.glob("**/*.parquet"))
    again = subprocess.run([sys.executable, "-m", "veil.server.cli", *command],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert not list(root.glob("**/.*.tmp"))
    aggregate(root, fresh, workers=1, progress=False)
    assert documents(fresh) == documents(store)


def test_one_metric_and_a_day_range(store, tmp_path):
    summary = archive(store, tmp_path / "archive", metric="battery", start=DAYS[1],
                      progress=False)
    assert summary.days == [("battery", DAYS[1]), ("battery", DAYS[2])]
    files = Manifest.load(tmp_path / "archive").files
    assert {(entry.metric, entry.day) for entry in files} == set(summary.days)


def test_local_cluster_with_one_worker(store, fresh, tmp_path):
    root = tmp_path / "archive"
    archive(store, root, metric="homepage", progress=False)
    summary = aggregate(root, fresh, workers=1, progress=False)
    assert summary.workers == 1 and summary.reports == store.total_reports("homepage")
    assert fresh.counts("homepage", min_reports=0) == store.counts("homepage", min_reports=0)


def test_metrics_must_have_the_archives_parameters_in_the_target(store, wire, tmp_path):
    root = tmp_path / "archive"
    archive(store, root, progress=False)
    others = [metric for name, metric in wire.registry.items() if name != "browser"]
    with open_storage(tmp_path / "other.db", Registry(others), create=True) as target, \
            pytest.raises(ArchiveError, match=r"metric 'browser' of the archive is not in the "
                                              r"registry.*--config"):
        aggregate(root, target, progress=False)
    changed = Registry([*others, Metric("browser", wire.registry["homepage"].params,
                                        min_reports=1)])
    with open_storage(tmp_path / "changed.db", changed, create=True) as target, \
            pytest.raises(ArchiveError, match="metric 'browser' has other parameters"):
        aggregate(root, target, progress=False)


def test_archive_errors(store, tmp_path):
    root = tmp_path / "archive"
    archive(store, root, buckets=BUCKETS, progress=False)
    with pytest.raises(ArchiveError, match="has 4 buckets, not 8"):
        archive(store, root, buckets=8, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ArchiveError, match=r"not empty and has no manifest\.json"):
        archive(store, tmp_path / "other", progress=False)
    document = json.loads((root / "manifest.json").read_text())
    document["files"][0]["path"] = "../../elsewhere.parquet"
    (root / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(ArchiveError,
                       match=r"is malformed: '\.\./\.\./elsewhere\.parquet' is not a file"):
        Manifest.load(root)


def test_files_that_disagree_with_the_manifest_are_refused(store, fresh, tmp_path, dask_client):
    root = tmp_path / "archive"
    archive(store, root, metric="homepage", progress=False)
    entry = Manifest.load(root).files[0]
    path = root / entry.path
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table]), path)
    with pytest.raises(ArchiveError, match="the archive changed since it was written"):
        aggregate(root, fresh, scheduler=dask_client, progress=False)
    path.unlink()
    with pytest.raises(ArchiveError, match=r"listed in .* but missing; write that day again"):
        aggregate(root, fresh, scheduler=dask_client, progress=False)


def veil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *args], capture_output=True,
                          text=True, timeout=120)


def tamper(root: Path, metric: str, day: str, value: Any) -> tuple[Path, int]:
    """Put ``value`` in the payload of the last row of the file of (metric, day), as someone
    with write access to the archive would (the manifest's row count still holds); the file
    and the row."""
    manifest = Manifest.load(root)
    entry = next(f for f in manifest.files if (f.metric, f.day) == (metric, day))
    path = root / entry.path
    statistic = statistic_for(manifest.registry[metric].params)
    ids, cohorts, payloads = from_table(statistic, pq.read_table(path), str(path))
    payloads = payloads.copy()
    payloads[-1] = value
    pq.write_table(to_table(statistic, ids, cohorts, payloads), path)
    return path, len(ids) - 1


@pytest.mark.parametrize(("metric", "value", "reason"), [
    ("load_time", 1e300, "payload: must be in"),
    ("load_time", float("nan"), "payload: must be in"),
    ("load_time", float("inf"), "payload: must be in"),
    ("load_time", -float("inf"), "payload: must be in"),
    ("load_time", 2.5 + 0.01, "payload: must be low + step * n"),
    ("dark_mode", 10**12, "payload: must be the integer 0 or 1"),
    ("dark_mode", -1, "payload: must be the integer 0 or 1"),
    ("battery", 7, "payload: must be the integer 0 or 1"),
    ("browser", np.array([0xF0], dtype=np.uint8), "payload: sets bits at or above k=4"),
], ids=["laplace-1e300", "laplace-nan", "laplace-inf", "laplace-minus-inf", "laplace-off-grid",
        "boolean-1e12", "boolean-minus-1", "1bitmean-7", "category-pad-bits"])
def test_aggregate_refuses_a_row_the_wire_refuses_and_sets_nothing(
        store, tmp_path, dask_client, capsys, metric, value, reason):
    """A Parquet file of the archive carrying a payload the collector would have refused
    stops ``veil aggregate`` (exit 2) with the file, the row, the field and the wire's
    reason, before any aggregate is set (the other days are sound and are not set either)."""
    registry = tmp_path / "metrics.toml"
    registry.write_text(store.registry.to_toml())
    root, target = tmp_path / "archive", tmp_path / "target.db"
    archive(store, root, buckets=1, progress=False)
    path, row = tamper(root, metric, DAYS[1], value)
    assert main(["aggregate", "--archive", str(root), "--db", str(target), "--config",
                 str(registry), "--scheduler", dask_client.scheduler.address]) == 1
    err = capsys.readouterr().err
    assert f"the archive file {path}, row {row} (counting from 0)" in err, err
    assert reason in err and f"for metric {metric!r}" in err, err
    with open_storage(target) as aggregated:
        assert aggregated.daily_reports(None, None, None) == []


def test_the_veil_aggregate_command_exits_non_zero_on_a_boolean_of_10_to_the_12(
        store, tmp_path, dask_client):
    """The attack as reported: one boolean row of 10**12 made a day's ``ones`` 10**12 plus the
    honest ones, and the command exited 0."""
    registry = tmp_path / "metrics.toml"
    registry.write_text(store.registry.to_toml())
    root, target = tmp_path / "archive", tmp_path / "target.db"
    archive(store, root, buckets=1, progress=False)
    path, row = tamper(root, "dark_mode", DAYS[0], 10**12)
    done = veil("aggregate", "--archive", str(root), "--db", str(target), "--config",
                str(registry), "--scheduler", dask_client.scheduler.address)
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(f"veil aggregate: error: the archive file {path}, row {row} "
                                  "(counting from 0): the wire refuses its payload "
                                  "1000000000000 for metric 'dark_mode' (wrong_type): "
                                  "payload: must be the integer 0 or 1."), done.stderr
    assert "aggregated" not in done.stdout


def test_a_cohort_the_wire_refuses_names_the_file_and_row(store, tmp_path):
    root = tmp_path / "archive"
    archive(store, root, metric="homepage", buckets=1, progress=False)
    entry = Manifest.load(root).files[0]
    path = root / entry.path
    table = pq.read_table(path)
    cohorts = table.column("cohort").to_numpy().copy()
    cohorts[1] = store.registry["homepage"].params.cohorts
    pq.write_table(table.set_column(1, "cohort", pa.array(cohorts, type=pa.int32())), path)
    with pytest.raises(ArchiveError, match=rf"the archive file {path}, row 1 \(counting from "
                                           rf"0\): cohort 4, outside \[0, 4\)"):
        aggregate_bucket(store.registry["homepage"], [path])


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_every_archive_file_and_directory_is_private_whatever_the_umask(store, tmp_path, umask):
    """The archive holds the raw reports of the 0600 store: ``veil archive`` makes every file
    (Parquet files, manifest.json, .lock) 0600 and every directory 0700, root included, and
    a run makes private what an earlier Veil left to the umask."""
    root = tmp_path / "archive"

    def modes() -> dict[str, int]:
        found = {".": root.stat().st_mode}
        found.update({str(p.relative_to(root)): p.stat().st_mode for p in root.rglob("*")})
        return found

    def run(*args: str) -> None:
        done = veil("archive", "--db", str(tmp_path / "veil.db"), "--out", str(root),
                    "--buckets", "2", "--end", DAYS[-1], *args)
        assert done.returncode == 0, done.stderr

    previous = os.umask(umask)
    try:
        run()
        found = modes()
        assert {".", ".lock", "manifest.json"} <= found.keys()
        assert len([name for name in found if name.endswith(".parquet")]) > 20
        assert {name: oct(stat.S_IMODE(mode)) for name, mode in found.items()} == {
            name: oct(0o700 if stat.S_ISDIR(mode) else 0o600) for name, mode in found.items()}
        # an archive an earlier Veil wrote under this umask, then a rerun of one day
        for name, mode in found.items():
            (root / name).chmod(0o777 & ~umask if stat.S_ISDIR(mode) else 0o666 & ~umask)
        run("--start", DAYS[-1])
        assert {name: oct(stat.S_IMODE(mode)) for name, mode in modes().items()} == {
            name: oct(0o700 if stat.S_ISDIR(mode) else 0o600) for name, mode in found.items()}
    finally:
        os.umask(previous)


def test_cli_round_trip_into_a_fresh_store(store, wire, tmp_path, dask_client):
    registry = tmp_path / "metrics.toml"
    registry.write_text(wire.registry.to_toml())
    root, target = tmp_path / "archive", tmp_path / "target.db"
    done = veil("archive", "--db", str(tmp_path / "veil.db"), "--out", str(root),
                "--buckets", "2", "--end", DAYS[-1])
    assert done.returncode == 0, done.stderr
    assert f"archived {store.total_reports():,} reports" in done.stdout
    done = veil("aggregate", "--archive", str(root), "--db", str(target), "--config",
                str(registry), "--scheduler", dask_client.scheduler.address)
    assert done.returncode == 0, done.stderr
    assert f"aggregated {store.total_reports():,} reports (0 duplicate ids" in done.stdout
    assert "reports/s" in done.stdout
    with open_storage(target) as aggregated:
        assert_same(documents(aggregated), documents(store))


def test_cli_errors_name_the_problem(store, tmp_path, capsys):
    db = str(tmp_path / "veil.db")

    def error(*args: str, code: int = 1) -> str:
        assert main(list(args)) == code
        return capsys.readouterr().err

    # naming no archive, or a metric it lacks, is a usage error (2): nothing was done
    assert "is not a directory" in error("aggregate", "--archive", str(tmp_path / "nope"),
                                         "--db", db, code=2)
    (tmp_path / "empty").mkdir()
    assert "has no manifest.json" in error("aggregate", "--archive", str(tmp_path / "empty"),
                                           "--db", db)
    root = tmp_path / "archive"
    archive(store, root, progress=False)
    assert "no reports of metric 'nope'" in error("aggregate", "--archive", str(root), "--db",
                                                  db, "--metric", "nope", code=2)
    assert "has no metric 'nope'; it has: " in error("archive", "--db", db, "--out",
                                                     str(root), "--metric", "nope", code=2)
    with pytest.raises(SystemExit) as stopped:  # argparse's usage error, before any cluster
        main(["aggregate", "--archive", str(root), "--db", db, "--workers", "100000"])
    assert stopped.value.code == 2
    assert "--workers: must be from 1 to 256; got 100000" in capsys.readouterr().err
    assert "--workers sizes a local cluster" in error(
        "aggregate", "--archive", str(root), "--db", db, "--scheduler", "tcp://127.0.0.1:1",
        "--workers", "2", code=2)
    document = json.loads((root / "manifest.json").read_text())
    document["format_version"] = FORMAT_VERSION + 1
    (root / "manifest.json").write_text(json.dumps(document))
    assert f"format version {FORMAT_VERSION + 1}" in error("aggregate", "--archive", str(root),
                                                           "--db", db)


def test_aggregate_bucket_alone_drops_replayed_ids_without_an_engine(wire):
    metric = wire.registry["homepage"]
    statistic = statistic_for(metric.params)
    reports = wire.validated(wire.reports("homepage", [f"v{i % 7}" for i in range(300)]))
    ids = np.frombuffer(b"".join(bytes.fromhex(r.id) for r in reports), np.uint8).reshape(-1, 16)
    cohorts = np.array([r.cohort for r in reports])
    stored = [statistic.stored_payload(metric.params, r.payload, r.value) for r in reports]
    payloads = payload_array(statistic.payload_type, stored)
    first = to_table(statistic, ids[:200], cohorts[:200], payloads[:200])
    second = to_table(statistic, ids[150:], cohorts[150:], payloads[150:])
    result = aggregate_bucket(metric, [first, second])
    assert (result.rows, result.duplicates, int(result.reports.sum())) == (350, 50, 300)
    want = {c: (n, s) for c, n, s in statistic.accumulate(metric.params, cohorts, stored)}
    for cohort in range(metric.params.cohorts):
        n, state = want.get(cohort, (0, statistic.zero(metric.params)))
        assert result.reports[cohort] == n
        assert statistic.to_entry(result.states[cohort]) == statistic.to_entry(state)
    merged = result.merge(aggregate_bucket(metric, []), metric)
    assert merged.reports.tolist() == result.reports.tolist()


def test_aggregate_bucket_reads_files_and_refuses_bad_ones(wire, tmp_path):
    metric = wire.registry["dark_mode"]
    statistic = statistic_for(metric.params)
    ids = np.arange(32, dtype=np.uint8).reshape(2, 16)
    path = tmp_path / "part.parquet"
    pq.write_table(to_table(statistic, ids, np.zeros(2), np.array([1, 0])), path)
    result = aggregate_bucket(metric, [path, str(path)])
    assert (result.rows, result.duplicates, result.states[0]["ones"]) == (4, 2, 1)
    with pytest.raises(ArchiveError, match="cohort 3, outside"):
        aggregate_bucket(metric, [to_table(statistic, ids, np.array([0, 3]), np.array([1, 0]))])
    with pytest.raises(ArchiveError, match="column payload must be int64"):
        aggregate_bucket(metric, [to_table(statistic_for(wire.registry["load_time"].params),
                                           ids, np.zeros(2), np.array([1.0, 0.0]))])
    path.write_bytes(b"not parquet")
    with pytest.raises(ArchiveError, match="cannot read the archive file"):
        aggregate_bucket(metric, [path])


def test_first_occurrences_is_exact():
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, size=(1000, 16), dtype=np.uint8)
    assert first_occurrences(ids) is None
    twins = ids.copy()
    twins[500:, :8] = twins[:500, :8]  # same first half, different ids
    assert first_occurrences(twins) is None
    replayed = np.concatenate([ids, ids[[3, 3, 700]]])
    keep = first_occurrences(replayed)
    assert keep is not None and keep[:1000].all() and not keep[1000:].any()
    # many replays, shuffled, some sharing only a first half: the first row of each id stays
    mixed = np.concatenate([twins, twins[rng.integers(0, 1000, 3000)]])[rng.permutation(4000)]
    seen: set[bytes] = set()
    want = []
    for row in mixed:
        want.append(row.tobytes() not in seen)
        seen.add(row.tobytes())
    assert first_occurrences(mixed).tolist() == want


def test_the_bucket_function_imports_no_engine():
    code = ("import sys, veil.server.archive.bucket, veil.server.archive.layout; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("source", ["collector-1\n", "", "a" * 65, "a b", "a/b", "ü"])
def test_a_source_name_must_match_whole(source: str) -> None:
    """A source names files (``part-<source>.parquet``): a name ending in a newline passed
    ``match`` with ``$`` (which matches before a final newline) and made a file name
    with a line break in it."""
    from veil.server.archive.layout import check_source
    from veil.shared.errors import ParameterError

    with pytest.raises(ParameterError, match="source name"):
        check_source(source)
    assert check_source("collector-1") == "collector-1"
