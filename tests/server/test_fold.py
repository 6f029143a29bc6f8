"""Reports counted in bulk on SQLite (veil.server.storage.sqlite.tail): whether the
aggregates have counted a report yet (folded) or readers count it on the spot (past the
fold mark), every count is that of the reports stored, the one-report reference."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import threading
from pathlib import Path

import pytest
import requests

from tests.server.conftest import Wire, before_the_fold_mark
from tests.server.test_crash import kill_while_uploading
from veil.server.cli import main
from veil.server.storage import StorageError, StorageUnavailable, check_storage, open_storage
from veil.server.storage.sqlite.tail import Waiting
from veil.shared.registry import Registry

REGISTRY = Registry.from_toml("""
version = 1
[metrics.homepage]
kind = "string"
k = 32
h = 2
m = 8
min_reports = 1
[metrics.page_hcms]
kind = "string"
oracle = "hcms"
epsilon = 2.0
rows = 64
columns = 8
min_reports = 1
[metrics.page_flh]
kind = "string"
oracle = "flh"
epsilon = 2.0
functions = 64
min_reports = 1
[metrics.browser]
kind = "category"
oracle = "olh"
epsilon = 1.0
categories = ["chrome", "firefox", "safari"]
min_reports = 1
[metrics.dark_mode]
kind = "boolean"
min_reports = 1
[metrics.load_time]
kind = "number"
low = 0.0
high = 10.0
epsilon = 1.0
min_reports = 1
""")
VALUES = {"homepage": ["a.example", "b.example", "c.example"],
          "page_hcms": ["a.example", "b.example"], "page_flh": ["x", "y", "z"],
          "browser": ["chrome", "safari"], "dark_mode": [True, False],
          "load_time": [0.5, 7.25, 3.0]}
DAYS = ["2026-10-01", "2026-10-02"]


@pytest.fixture
def wire() -> Wire:
    return Wire(REGISTRY)


#: a batch's reports of each metric: the string oracles' from 64 cohorts each, so a batch
#: touches more aggregate rows than an insert counts on the spot (as a relay forwards them)
SPREAD = {"page_hcms": 35, "page_flh": 24}


def batches(wire: Wire, rounds: int) -> list[list[dict]]:
    """``rounds`` batches, each with reports of every metric, spread over 128 and more
    aggregate rows: they wait past the fold mark."""
    return [[r for metric, values in VALUES.items()
             for r in wire.reports(metric, values * SPREAD.get(metric, 2))]
            for _ in range(rounds)]


def documents(storage, day: str | None = None) -> dict[str, dict]:
    return {name: storage.counts(name, day, day, min_reports=0) for name in VALUES}


def expected(wire: Wire, sent: list[dict]) -> dict[str, dict]:
    return {name: wire.approx(wire.expected(name, sent)) for name in VALUES}


def counted(document: dict) -> dict:
    return {"reports": document["reports"], "cohorts": document["cohorts"]}


def fold_mark(path: Path) -> tuple[int, int]:
    """The fold mark and the last report's rowid, read by hand."""
    with sqlite3.connect(path) as conn:
        mark = int(conn.execute("SELECT value FROM meta WHERE key = 'folded_rowid'").fetchone()[0])
        last = int(conn.execute("SELECT coalesce(max(rowid), 0) FROM reports").fetchone()[0])
    conn.close()
    return mark, last


@pytest.mark.parametrize("fold_limit", [1, 50, 10**9])
def test_counts_are_those_of_the_reports_however_many_are_folded(tmp_path, wire, fold_limit):
    """fold_limit 1 folds after every commit, 10**9 never (every report past the mark):
    the counts, per-day stats and a reader in another storage are the same."""
    path = tmp_path / "veil.db"
    sent = batches(wire, 4)
    with open_storage(path, REGISTRY, create=True, fold_limit=fold_limit) as storage, \
            open_storage(path) as reader:
        for reports in sent:
            storage.insert(wire.validated(reports))  # today: folded by the limit alone
        flat = [r for reports in sent for r in reports]
        want = expected(wire, flat)
        assert {n: counted(d) for n, d in documents(storage).items()} == want
        assert {n: counted(d) for n, d in documents(reader).items()} == want
        assert reader.stats()["reports"] == len(flat)
        assert len(reader.stats("homepage")["metrics"][0]["days"]) == 1
    mark, last = fold_mark(path)
    assert {1: mark == last, 50: 0 < mark <= last, 10**9: mark == 0}[fold_limit], (mark, last)
    assert check_storage(path).sound


def test_reports_of_a_day_that_is_over_are_folded_at_the_next_insert(tmp_path, wire):
    """Today's reports wait for the fold limit; a past day's are folded right after their
    commit, so raw reports of days that are over are always counted in the aggregates."""
    path = tmp_path / "veil.db"
    first, second = batches(wire, 2)
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(first))  # today (UTC)
        assert fold_mark(path)[0] == 0  # a few reports: nothing folded yet
        storage.insert(wire.validated(second), DAYS[1])
        mark, last = fold_mark(path)
        assert mark == last == len(first) + len(second)
        assert {n: counted(d) for n, d in documents(storage, DAYS[1]).items()} \
            == expected(wire, second)
        today = storage.stats()["metrics"][0]["days"][-1]["day"]
        assert {n: counted(d) for n, d in documents(storage, today).items()} \
            == expected(wire, first)


def test_reports_stored_after_the_last_ones_were_deleted_by_hand_are_counted(tmp_path, wire):
    """Deleting the newest folded reports frees rowids at or below the mark: SQLite gives
    them to the next reports, which must not be taken for folded ones. (The aggregates
    keep counting the deleted reports, as they did before the mark existed.)"""
    path = tmp_path / "veil.db"
    kept, dropped, later = batches(wire, 3)
    with open_storage(path, REGISTRY, create=True, fold_limit=1) as storage:
        storage.insert(wire.validated(kept), DAYS[0])
        storage.insert(wire.validated(dropped), DAYS[0])
    assert fold_mark(path) == (len(kept) + len(dropped),) * 2
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM reports WHERE rowid > ?", (len(kept),))
    conn.close()
    with open_storage(path, fold_limit=10**9) as storage:
        storage.insert(wire.validated(later))
        assert fold_mark(path) == (len(kept), len(kept) + len(later))
        assert {n: counted(d) for n, d in documents(storage).items()} \
            == expected(wire, kept + dropped + later)


def test_concurrent_writers_in_two_storages_fold_without_losing_or_doubling(tmp_path, wire):
    path = tmp_path / "veil.db"
    sent = [batches(wire, 6), batches(wire, 6)]
    stores = [open_storage(path, REGISTRY, create=True, fold_limit=40),
              open_storage(path, fold_limit=40)]
    try:
        threads = [threading.Thread(target=lambda s=store, b=mine: [
            s.insert(wire.validated(reports)) for reports in b])
            for store, mine in zip(stores, sent, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        flat = [r for mine in sent for reports in mine for r in reports]
        assert {n: counted(d) for n, d in documents(stores[1]).items()} == expected(wire, flat)
    finally:
        for store in stores:
            store.close()
    assert fold_mark(path)[0] > 0
    assert check_storage(path).sound


def test_vacuum_backup_and_rebuild_keep_the_counts(tmp_path, wire, capsys):
    """``VACUUM`` renumbers an unnamed rowid once rows were deleted: reports waiting past
    the mark then fell at or below it and left the counts. ``seq`` names the rowid."""
    path = tmp_path / "veil.db"
    sent = batches(wire, 3)
    with open_storage(path, REGISTRY, create=True, fold_limit=10**9) as storage:
        storage.insert(wire.validated(sent[0]))
        storage.rebuild_aggregates()  # folded, then more past the mark
        storage.insert(wire.validated(sent[1]))
        storage.insert(wire.validated(sent[2]))
        want = documents(storage)
    assert main(["backup", "--db", str(path), "--out", str(tmp_path / "copy.db")]) == 0
    with sqlite3.connect(path) as conn:  # by hand: folded reports deleted (their counts stay)
        conn.execute("DELETE FROM reports WHERE seq <= 5")
    conn.execute("VACUUM")
    conn.close()
    assert fold_mark(path) == (len(sent[0]), sum(map(len, sent)))  # no seq renumbered
    for where in (path, tmp_path / "copy.db"):
        with open_storage(where) as storage:
            assert documents(storage) == want
    assert main(["check", "--db", str(tmp_path / "copy.db")]) == 0
    assert f"a recount of {sum(map(len, sent)):,} raw reports" in capsys.readouterr().out


@pytest.mark.parametrize(("metric", "change"), [
    ("browser", "payload = 999"),  # a payload no mechanism produces
    ("homepage", "cohort = 1 << 40"),  # counted as it was, cohorts up to it would fill memory
    ("page_flh", "cohort = -1"),
    ("browser", "payload = x'01'"),  # a BLOB stopped SQLite's JSON: no check could run
    ("page_flh", "payload = 1.0"),  # a REAL: the reader counted what the fold refused
])
def test_a_report_past_the_mark_that_cannot_be_counted_is_damage(tmp_path, wire, capsys, metric,
                                                                  change):
    path = tmp_path / "veil.db"
    sent = batches(wire, 1)
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(sent[0]))
    with sqlite3.connect(path) as conn:  # past the mark
        conn.execute(f"UPDATE reports SET {change} WHERE rowid = (SELECT max(rowid) FROM "
                     "reports WHERE metric = ?)", (metric,))
    conn.close()
    assert main(["check", "--db", str(path)]) == 1
    assert "is DAMAGED" in capsys.readouterr().out
    with open_storage(path, fold_limit=1) as storage:
        with pytest.raises(StorageUnavailable, match="cannot be counted"):
            storage.counts(metric)
        # stored, and its fold fails (logged): nothing is folded, the damaged report neither
        assert storage.insert(wire.validated(wire.reports("dark_mode", [True]))).accepted == 1
    assert fold_mark(path) == (0, sum(map(len, sent)) + 1)


@pytest.mark.parametrize("fold_limit", [1, 10**9])  # the reports folded, or waiting
def test_two_byte_payloads_whose_lengths_offset_each_other_are_damage(tmp_path, wire, capsys,
                                                                       fold_limit):
    """Bloom payloads of 4 bytes changed to 3 and 5: read joined, they shifted every row
    after them into a wrong one, which ``veil check`` took for counts to rebuild."""
    path = tmp_path / "veil.db"
    with open_storage(path, REGISTRY, create=True, fold_limit=fold_limit) as storage:
        storage.insert(wire.validated(batches(wire, 1)[0]))
    with sqlite3.connect(path) as conn:
        first, second = [row[0] for row in conn.execute(
            "SELECT rowid FROM reports WHERE metric = 'homepage' ORDER BY rowid LIMIT 2")]
        conn.execute("UPDATE reports SET payload = x'010203' WHERE rowid = ?", (first,))
        conn.execute("UPDATE reports SET payload = x'0102030405' WHERE rowid = ?", (second,))
    conn.close()
    assert main(["check", "--db", str(path)]) == 1
    out = capsys.readouterr().out
    assert "is DAMAGED" in out
    assert re.search(r"a stored payload has [35] bytes where the others have 4", out), out
    if fold_limit > 1:  # waiting: counts read them, and refuse them
        with open_storage(path) as storage, pytest.raises(StorageUnavailable):
            storage.counts("homepage")


def test_a_fold_that_keeps_failing_is_tried_again_as_the_waiting_reports_double(
        tmp_path, wire, caplog):
    """A damaged report past the mark fails every fold. The fold is tried again once twice as
    many reports wait as when it last failed (or a minute later), not after every commit, which
    would read the growing pile at every insert; once the report is repaired, a later try
    folds every report."""
    path = tmp_path / "veil.db"
    relay = batches(wire, 1)[0]
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(relay))
    with sqlite3.connect(path) as conn:  # a payload no mechanism produces, past the mark
        conn.execute("UPDATE reports SET payload = 999 WHERE rowid = (SELECT max(rowid) FROM "
                     "reports WHERE metric = 'browser')")
    conn.close()

    def failures() -> int:
        return sum("folding" in record.getMessage() for record in caplog.records)

    tried = []
    with caplog.at_level("WARNING", logger="veil.server.storage"), \
            open_storage(path, fold_limit=1) as storage:
        for _ in range(6):  # each insert is due to fold: fold_limit 1
            storage.insert(wire.validated(wire.reports("dark_mode", [True] * 50)))
            tried.append(failures())
        # 162 + 50 = 212 waiting at the first failure: tried again at 462, not at 262, 312,
        # 362 or 412
        assert tried == [1, 1, 1, 1, 1, 2], tried
        with sqlite3.connect(path) as conn:  # repaired by hand
            conn.execute("UPDATE reports SET payload = 0 WHERE payload = 999")
        conn.close()
        while fold_mark(path)[0] == 0:  # tried again once 924 wait
            assert fold_mark(path)[1] < 924
            storage.insert(wire.validated(wire.reports("dark_mode", [True] * 50)))
        assert failures() == 2
    # the first insert with 924 or more waiting: 162 + 16 x 50 = 962, all folded
    assert fold_mark(path) == (len(relay) + 50 * 16,) * 2
    assert check_storage(path).sound


def test_a_missing_fold_mark_is_damage_not_a_recount(tmp_path, wire):
    """Without the mark every report would be counted a second time on top of the
    aggregates: the file is called damaged instead."""
    path = tmp_path / "veil.db"
    with open_storage(path, REGISTRY, create=True, fold_limit=1) as storage:
        storage.insert(wire.validated(batches(wire, 1)[0]))
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'folded_rowid'")
    conn.close()
    assert not check_storage(path).sound
    with open_storage(path) as storage, pytest.raises(StorageError, match="fold mark"):
        storage.counts("homepage")


def test_through_veil_serve_with_two_workers_every_count_is_that_of_the_reports(
        collector_factory, wire):
    """Real uploads to ``veil serve --workers 2 --fold-limit 50`` from several threads:
    the workers fold in turn (each after its own commits), and the counts over HTTP,
    ``veil stats`` and ``veil check`` agree with the reports sent."""
    collector = collector_factory(REGISTRY, workers=2, serve_args=["--fold-limit", "50"])
    sent = batches(wire, 12)
    errors: list[str] = []

    def upload(mine: list[list[dict]]) -> None:
        with requests.Session() as session:
            for reports in mine:
                answer = session.post(collector.url + "/v1/reports", json=wire.batch(reports),
                                      timeout=30)
                if answer.status_code != 200 or answer.json()["accepted"] != len(reports):
                    errors.append(answer.text)

    threads = [threading.Thread(target=upload, args=(sent[i::3],)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    flat = [r for reports in sent for r in reports]
    for name in VALUES:
        document = requests.get(f"{collector.url}/v1/metrics/{name}/counts",
                                headers={"Authorization": f"Bearer {collector.token}"},
                                timeout=30).json()
        assert counted(document) == wire.approx(wire.expected(name, flat)), name
    mark, last = fold_mark(collector.db_path)
    assert 0 < mark <= last == len(flat)
    assert main(["check", "--db", str(collector.db_path)]) == 0


def test_a_worker_started_before_the_registry_gained_a_metric_folds_its_reports(tmp_path,
                                                                                 wire):
    """Folds count every report waiting, of every worker: with the metrics recorded in
    the file, not those of the process that folds (which failed at every commit)."""
    path = tmp_path / "veil.db"
    older = Registry([metric for name, metric in REGISTRY.items() if name != "page_flh"],
                     version=1)
    sent = batches(wire, 2)
    flh = [r for r in sent[0] if r["metric"] == "page_flh"]
    with open_storage(path, older, create=True, fold_limit=1) as first, \
            open_storage(path, REGISTRY, fold_limit=10**9) as second:
        second.insert(wire.validated(flh))  # waits past the mark
        first.insert(wire.validated([r for r in sent[1] if r["metric"] != "page_flh"]))
        mark, last = fold_mark(path)
        assert mark == last  # the first worker folded the page_flh reports too
        assert counted(second.counts("page_flh", min_reports=0)) \
            == wire.approx(wire.expected("page_flh", flh))


def test_a_collector_of_schema_5_still_running_after_the_migration_cannot_write(tmp_path,
                                                                                 wire):
    """Schema 5 counted each insert into ``aggregates``: still running once the file is at
    schema 6, its reports would also wait past the mark and be counted twice. The table
    it writes is renamed by the migration, so its writes fail (its uploads get 503)."""
    path = tmp_path / "veil.db"
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(batches(wire, 1)[0]))
    before_the_fold_mark(path)
    running = sqlite3.connect(path)  # the schema 5 collector's connection, open throughout
    upsert = ("INSERT INTO aggregates (metric, day, cohort, reports) VALUES ('dark_mode', "
              "'2026-10-01', 0, 1) ON CONFLICT (metric, day, cohort) DO UPDATE SET "
              "reports = reports + excluded.reports")
    running.execute(upsert)
    running.rollback()
    assert main(["migrate", "--db", str(path)]) == 0
    with pytest.raises(sqlite3.OperationalError, match="no such table: aggregates"):
        running.execute(upsert)
    running.close()


def test_a_day_that_is_over_while_its_reports_wait_is_due_at_the_next_insert():
    """The first insert after midnight (UTC) folds the day before: the day of the first
    report waiting is over, whatever the day of the new reports."""
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert Waiting(mark=10, highest=12, since=yesterday).fold_due(1, [today], limit=1000)
    assert not Waiting(mark=10, highest=12, since=today).fold_due(1, [today], limit=1000)
    assert Waiting(mark=10, highest=12, since=today).fold_due(998, [today], limit=1000)
    assert Waiting(mark=10, highest=10, since=None).fold_due(1, [yesterday], limit=1000)


def test_deleted_reports_not_yet_folded_are_named(tmp_path, wire, capsys) -> None:
    """Reports past the fold mark are counted when read: deleted, they leave the counts
    too, and the aggregates agree with a recount; the ids still say reports are gone."""
    path = tmp_path / "veil.db"
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(batches(wire, 1)[0]))  # today's: they wait
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM reports WHERE seq IN (SELECT seq FROM reports "
                     "ORDER BY seq DESC LIMIT 2)")
    conn.close()
    assert main(["check", "--db", str(path)]) == 0
    said = capsys.readouterr().out
    assert "2 stored report id(s) have no raw report" in said


def test_a_batch_from_one_installation_is_counted_at_once_unless_reports_wait(tmp_path, wire):
    """A few aggregate rows are cheaper to update in the insert's transaction than to read
    the reports again in a fold: with nothing waiting, the mark moves past them at once;
    behind reports waiting, they wait too (the mark covers a prefix of the reports)."""
    path = tmp_path / "veil.db"
    one = [r for metric, values in VALUES.items()
           for r in wire.reports(metric, values, cohort_seed=3)]
    spread = batches(wire, 1)[0]
    later = wire.reports("homepage", VALUES["homepage"], cohort_seed=5)
    with open_storage(path, REGISTRY, create=True) as storage:
        storage.insert(wire.validated(one))
        assert fold_mark(path) == (len(one), len(one))
        storage.insert(wire.validated(spread))
        storage.insert(wire.validated(later))
        assert fold_mark(path) == (len(one), len(one) + len(spread) + len(later))
        assert {n: counted(d) for n, d in documents(storage).items()} \
            == expected(wire, one + spread + later)


def test_sigkill_among_folds_through_veil_serve_loses_and_doubles_nothing(collector_factory,
                                                                          wire):
    """Uploads spread over 128 cohorts to ``veil serve --workers 2 --fold-limit 200``, so a
    fold runs every few commits, SIGKILLed mid-stream: after a restart every acknowledged
    report is counted once (over HTTP, against the reports stored), and veil check finds
    the aggregates equal to a recount up to the mark."""
    collector = collector_factory(REGISTRY, workers=2, serve_args=["--fold-limit", "200"])

    def spread() -> list[dict]:
        return [*wire.reports("page_hcms", VALUES["page_hcms"] * 35),
                *wire.reports("page_flh", VALUES["page_flh"] * 24)]

    _, stored = kill_while_uploading(collector, wire, spread)
    assert fold_mark(collector.db_path)[0] > 0  # folds ran before the kill
    for name in ("page_hcms", "page_flh"):
        assert counted(collector.counts(name)) == wire.approx(wire.expected(name, stored)), name
    collector.stop()
    assert main(["check", "--db", str(collector.db_path)]) == 0
