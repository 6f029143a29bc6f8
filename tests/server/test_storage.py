"""Storage on every backend (aggregates equal the raw reports, policy, reading the reports back,
replacing aggregates) and SQLite's own: schema versions and migration, group commit, its file.

Tests of the backend-neutral interface take ``store_url`` (or ``filled``) and run once per
backend, ``[sqlite]`` on a file in ``tmp_path`` and ``[postgresql]`` on a fresh database of the
test run's PostgreSQL server (skipped, saying why, when there is none; see ``tests/conftest.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import sqlite3
import threading
import time

import numpy as np
import pytest

from tests.server.conftest import before_the_fold_mark
from veil.server.storage import (
    BACKENDS,
    DailyCap,
    DailyCapReached,
    InsertResult,
    RegistryMismatchError,
    SchemaOutdatedError,
    SQLiteStorage,
    Storage,
    StorageError,
    StorageUnavailable,
    StoredReports,
    TooFewReportsError,
    open_storage,
)
from veil.server.storage.backends import backend_class
from veil.server.storage.sqlite import SCHEMA_VERSION
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import statistic_for

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """Where a new store goes, once per backend: a SQLite file in ``tmp_path``, then a fresh
    PostgreSQL database (``postgres_url``)."""
    if request.param == "sqlite":
        return str(tmp_path / "veil.db")
    return request.getfixturevalue("postgres_url")


def fill(url, wire):
    """A new store at ``url`` with reports of every kind spread over three days:
    ``(storage, sent by day)``."""
    storage = open_storage(url, wire.registry, create=True)
    sent: dict[str, list[dict]] = {}
    values = {"homepage": ["a.example", "b.example", "c.example"] * 7,
              "browser": ["chrome", "other"] * 5, "dark_mode": [True, False, False],
              "load_time": [1.0, 2.5, 9.75], "battery": [3.0, 97.0], "latency": [0.25, 0.75]}
    for day in DAYS:
        reports = [r for metric, vals in values.items() for r in wire.reports(metric, vals)]
        result = storage.insert(wire.validated(reports), day)
        assert (result.accepted, result.duplicates) == (len(reports), 0)
        sent[day] = reports
    return storage, sent


@pytest.fixture
def filled(store_url, wire):
    """:func:`fill` on every backend; returns (storage, sent by day)."""
    storage, sent = fill(store_url, wire)
    yield storage, sent
    storage.close()


@pytest.fixture
def sqlite_filled(tmp_path, wire):
    """:func:`fill` on a SQLite file, ``tmp_path / "veil.db"``; returns (storage, sent by day)."""
    storage, sent = fill(tmp_path / "veil.db", wire)
    yield storage, sent
    storage.close()


def test_new_file_has_current_schema_and_wal(tmp_path, wire):
    with open_storage(tmp_path / "veil.db", wire.registry, create=True) as storage:
        assert storage.schema_version == SCHEMA_VERSION
    with sqlite3.connect(tmp_path / "veil.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_counts_by_day_range_equal_the_reports_of_those_days(filled, wire):
    storage, sent = filled
    for start, end, days in [(None, None, DAYS), ("2026-11-02", None, DAYS[1:]),
                             (None, "2026-11-01", DAYS[:1]), ("2026-11-02", "2026-11-02", DAYS[1:2])]:
        chosen = [r for day in days for r in sent[day]]
        for metric in ("homepage", "browser", "dark_mode", "battery"):
            document = storage.counts(wire.registry[metric], start, end)
            assert (document["start"], document["end"]) == (start, end)
            expected = wire.expected(metric, chosen)
            assert document["reports"] == expected["reports"]
            assert document["cohorts"] == expected["cohorts"]
        got = storage.counts(wire.registry["load_time"], start, end)["cohorts"][0]
        want = wire.expected("load_time", chosen)["cohorts"][0]
        assert got["sum"] == pytest.approx(want["sum"], rel=1e-12)
        assert got["sum_squares"] == pytest.approx(want["sum_squares"], rel=1e-12)


def test_days_lists_each_day_with_reports_of_the_metric_oldest_first(filled, wire):
    storage, _ = filled
    later = wire.reports("homepage", ["a.example"])
    storage.insert(wire.validated(later), "2026-12-01")
    assert storage.days("homepage") == [*DAYS, "2026-12-01"]
    assert storage.days("browser") == DAYS
    assert storage.days("rare") == []


def test_rebuild_aggregates_equals_incremental(filled, wire):
    storage, _ = filled
    before = {m: storage.counts(wire.registry[m], min_reports=0) for m in wire.registry}
    assert storage.rebuild_aggregates() == storage.total_reports() == 3 * (21 + 10 + 3 + 3 + 2 + 2)
    after = {m: storage.counts(wire.registry[m], min_reports=0) for m in wire.registry}
    for metric in wire.registry:
        for old, new in zip(before[metric]["cohorts"], after[metric]["cohorts"], strict=True):
            assert old.keys() == new.keys()
            for key in old:
                # float sums may differ in the last bits: the order of additions changed
                assert new[key] == (pytest.approx(old[key], rel=1e-12) if key.startswith("sum")
                                    else old[key])


def test_duplicates_are_not_counted_again(filled, wire):
    storage, sent = filled
    again = storage.insert(wire.validated(sent[DAYS[0]][:5]), DAYS[2])
    assert (again.accepted, again.duplicates) == (0, 5)
    assert storage.total_reports() == sum(len(v) for v in sent.values())


def stored_payload(wire, report):
    """What a store keeps as the payload of wire ``report`` (its statistic's ``stored_payload``)."""
    params = wire.registry[report["metric"]].params
    value = params.parse_payload(report["payload"])
    return statistic_for(params).stored_payload(params, report["payload"], value)


def read_back(storage, wire, **query):
    """Every report ``storage.iter_reports(**query)`` yields, checking each chunk's arrays
    (shapes and dtypes as :class:`StoredReports` says): ``[(id, metric, day, cohort, stored
    payload)]`` and the size of each chunk."""
    rows, sizes = [], []
    for chunk in storage.iter_reports(**query):
        assert isinstance(chunk, StoredReports)
        n = len(chunk)
        sizes.append(n)
        statistic = statistic_for(wire.registry[chunk.metric].params)
        assert (chunk.ids.dtype, chunk.ids.shape) == (np.uint8, (n, 16))
        assert (chunk.cohorts.dtype, chunk.cohorts.shape) == (np.int64, (n,))
        if statistic.payload_type == "bytes":
            assert chunk.payloads.dtype == np.uint8 and chunk.payloads.shape[0] == n
            assert chunk.payloads.ndim == 2
            payloads = [bytes(row) for row in chunk.payloads]
        else:
            dtype = np.int64 if statistic.payload_type == "int" else np.float64
            assert (chunk.payloads.dtype, chunk.payloads.shape) == (dtype, (n,))
            payloads = chunk.payloads.tolist()
        rows += [(bytes(report_id).hex(), chunk.metric, chunk.day, int(cohort), payload)
                 for report_id, cohort, payload in zip(chunk.ids, chunk.cohorts, payloads,
                                                       strict=True)]
    return rows, sizes


def test_a_daily_cap_counts_each_stored_report_once_in_the_store(store_url, wire):
    """A cap counts the reports a call stores under its key and day, in the store itself, so
    two stores opened on it (two collector processes) share the count; a replay costs
    nothing, and a call that would pass the cap stores nothing and counts nothing."""
    first = open_storage(store_url, wire.registry, create=True)
    second = open_storage(store_url)

    def new(n: int) -> list:
        return wire.validated(wire.reports("dark_mode", [True] * n))

    try:
        cap = DailyCap(bytes(32), 10)
        sent = new(6)
        assert first.insert(sent, DAYS[0], cap=cap) == InsertResult(6, 0)
        assert second.insert(sent, DAYS[0], cap=cap) == InsertResult(0, 6)  # a replay: free
        with pytest.raises(DailyCapReached) as refused:  # 5 new would make 11
            second.insert([*sent[:2], *new(5)], DAYS[0], cap=cap)
        assert (refused.value.limit, refused.value.stored, refused.value.day) == (10, 6, DAYS[0])
        assert refused.value.retry_after >= 1
        assert first.total_reports() == 6 and first.counts("dark_mode")["reports"] == 6
        assert second.insert(new(4), DAYS[0], cap=cap) == InsertResult(4, 0)  # exactly 10
        with pytest.raises(DailyCapReached):
            first.insert(new(1), DAYS[0], cap=cap)
        assert first.insert(sent, DAYS[0], cap=cap) == InsertResult(0, 6)  # at the cap too
        assert first.insert(new(10), DAYS[1], cap=cap).accepted == 10  # another day
        assert first.insert(new(10), DAYS[0], cap=DailyCap(b"\1" * 32, 10)).accepted == 10
        assert first.insert(new(3), DAYS[0]).accepted == 3  # no cap
        assert first.total_reports() == 6 + 4 + 10 + 10 + 3
        # today's cap is refused until the end of today, UTC (by the store's clock)
        today_cap = DailyCap(b"\2" * 32, 1)
        first.insert(new(1), cap=today_cap)
        with pytest.raises(DailyCapReached) as refused:
            second.insert(new(1), cap=today_cap)
        midnight = dt.datetime.combine(dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1),
                                       dt.time(), dt.UTC)
        assert refused.value.retry_after == pytest.approx(midnight.timestamp() - time.time(),
                                                          abs=5)
    finally:
        first.close()
        second.close()


def test_a_daily_cap_needs_a_positive_integer_limit():
    for limit in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            DailyCap(bytes(32), limit)


def test_iter_reports_yields_every_stored_report_once_in_chunks_of_one_metric_and_day(
        filled, wire):
    storage, sent = filled
    expected = sorted((r["id"], r["metric"], day, r.get("cohort", 0), stored_payload(wire, r))
                      for day, reports in sent.items() for r in reports)
    rows, sizes = read_back(storage, wire, batch_size=4)
    assert sorted(rows) == expected  # each report once, with its metric, day, cohort, payload
    assert all(1 <= size <= 4 for size in sizes)
    rows, _ = read_back(storage, wire)
    assert sorted(rows) == expected


def test_iter_reports_keeps_to_the_metric_and_days_asked_for(filled, wire):
    storage, sent = filled
    rows, _ = read_back(storage, wire, metric="homepage", start=DAYS[1], end=DAYS[2])
    assert sorted(row[0] for row in rows) == sorted(
        r["id"] for day in DAYS[1:] for r in sent[day] if r["metric"] == "homepage")
    rows, _ = read_back(storage, wire, start=DAYS[2])
    assert sorted(row[0] for row in rows) == sorted(r["id"] for r in sent[DAYS[2]])
    rows, _ = read_back(storage, wire, end=DAYS[0])
    assert sorted(row[0] for row in rows) == sorted(r["id"] for r in sent[DAYS[0]])
    assert read_back(storage, wire, metric="rare") == ([], [])
    assert read_back(storage, wire, start="2027-01-01") == ([], [])


def test_replacing_aggregates_with_those_read_back_changes_nothing(filled, wire):
    """replace_aggregates is idempotent: the aggregates a store holds, written back once or
    twice, leave every counts document as it was."""
    storage, _ = filled
    documents = {(name, day): storage.counts(name, day, day, min_reports=0)
                 for name in wire.registry for day in storage.days(name)}
    for name, day in documents:
        reports, states = storage.read_aggregates(wire.registry[name], day, day)
        storage.replace_aggregates(name, day, reports, states)
        storage.replace_aggregates(name, day, reports, states)
    assert {(name, day): storage.counts(name, day, day, min_reports=0)
            for name, day in documents} == documents
    assert storage.total_reports() == sum(d["reports"] for d in documents.values())


def test_replaced_aggregates_are_those_of_the_day_until_a_rebuild(filled, wire):
    """Aggregates replaced on one day take the place of what was there, every cohort, and
    leave other days and metrics alone; cohorts without reports get no row, so a day replaced
    by nothing has no reports; rebuild_aggregates recounts the raw reports again."""
    storage, _ = filled
    metric = wire.registry["homepage"]
    before = {name: storage.counts(name, min_reports=0) for name in wire.registry}
    third = storage.counts(metric, DAYS[2], DAYS[2])
    reports, states = storage.read_aggregates(metric, DAYS[2], DAYS[2])
    storage.replace_aggregates("homepage", DAYS[0], reports, states)
    storage.replace_aggregates("homepage", DAYS[0], reports, states)
    assert storage.counts(metric, DAYS[0], DAYS[0])["cohorts"] == third["cohorts"]
    assert storage.counts(metric, DAYS[2], DAYS[2]) == third
    assert storage.counts("browser", min_reports=0) == before["browser"]
    empty = np.zeros(metric.params.cohorts, dtype=np.int64)
    statistic = statistic_for(metric.params)
    storage.replace_aggregates("homepage", DAYS[1], empty,
                               [statistic.zero(metric.params)] * metric.params.cohorts)
    assert storage.days("homepage") == [DAYS[0], DAYS[2]]
    with pytest.raises(TooFewReportsError):
        storage.counts(metric, DAYS[1], DAYS[1])
    storage.rebuild_aggregates()
    for name in wire.registry:
        assert storage.counts(name, min_reports=0) == wire.approx(before[name])


def _stored_ids(conn):
    """Number of report ids stored, merged into the index or not."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM report_ids) + (SELECT count(*) FROM recent_ids)").fetchone()[0]


def _queue_while_locked(storage, batches, day, caps=None):
    """Start one insert thread per batch (with the cap of ``caps`` at its index) while the
    write lock is held, so that they all queue (in batch order) and the first to get the lock
    commits them as one group; returns each call's result or exception."""
    outcomes: list = [None] * len(batches)

    def insert(index, reports):
        try:
            outcomes[index] = storage.insert(reports, day, cap=caps[index] if caps else None)
        except Exception as exc:  # the outcome under test
            outcomes[index] = exc

    threads = [threading.Thread(target=insert, args=(i, b)) for i, b in enumerate(batches)]
    with storage.commits.hold():
        for queued, thread in enumerate(threads, start=1):
            thread.start()  # and wait until it is queued, so the queue is in batch order
            deadline = time.monotonic() + 30
            while storage.commits.waiting < queued and time.monotonic() < deadline:
                time.sleep(0.001)
            assert storage.commits.waiting == queued
    for thread in threads:
        thread.join()
    return outcomes


def test_a_group_commit_counts_each_id_once(sqlite_filled, wire):
    """Calls committed together that share ids (retries racing the original, replays of stored
    reports) accept each new id exactly once, in queue order."""
    storage, sent = sqlite_filled
    before = storage.counts("homepage")["reports"]
    fresh = wire.validated(wire.reports("homepage", [f"site{i}.example" for i in range(12)]))
    stored = wire.validated([r for r in sent[DAYS[0]] if r["metric"] == "homepage"][:3])
    batches = [fresh[:6], fresh[3:9] + stored, fresh[6:], fresh[:6]]
    outcomes = _queue_while_locked(storage, batches, DAYS[2])
    assert [(o.accepted, o.duplicates) for o in outcomes] == [(6, 0), (3, 6), (3, 3), (0, 6)]
    assert storage.counts("homepage")["reports"] == before + 12
    # calls that repeat each other's ids when none of them was stored before
    more = wire.validated(wire.reports("homepage", [f"more{i}.example" for i in range(4)]))
    outcomes = _queue_while_locked(storage, [more[:3], more[1:]], DAYS[2])
    assert [(o.accepted, o.duplicates) for o in outcomes] == [(3, 0), (1, 2)]
    before += 4
    assert storage.counts("homepage")["reports"] == before + 12
    assert storage.rebuild_aggregates() == storage.total_reports()
    assert storage.counts("homepage")["reports"] == before + 12


def test_a_group_commit_refuses_only_the_calls_over_their_cap(sqlite_filled, wire):
    """Calls committed together are charged in queue order; a refused call stores nothing, so
    a later call of the group (or a later insert) stores its ids."""
    storage, _ = sqlite_filled
    before = storage.total_reports()
    cap = DailyCap(bytes(32), 10)
    f = wire.validated(wire.reports("homepage", [f"site{i}.example" for i in range(12)]))
    # calls that repeat each other's ids: charged for their new reports only
    outcomes = _queue_while_locked(storage, [f[:6], f[6:11], f[6:10], f[10:], f[:2]], DAYS[2],
                                   [cap, cap, cap, None, cap])
    assert isinstance(outcomes[1], DailyCapReached) and outcomes[1].stored == 6
    assert [(o.accepted, o.duplicates) for o in outcomes if not isinstance(o, Exception)] == [
        (6, 0), (4, 0), (2, 0), (0, 2)]
    assert storage.total_reports() == before + 12
    # calls without shared ids: the refused call's ids are not taken as stored
    g = wire.validated(wire.reports("homepage", [f"other{i}.example" for i in range(8)]))
    other = DailyCap(b"\1" * 32, 6)
    outcomes = _queue_while_locked(storage, [g[:4], g[4:7], g[7:]], DAYS[2], [other, other, None])
    assert isinstance(outcomes[1], DailyCapReached)
    assert [(o.accepted, o.duplicates) for o in (outcomes[0], outcomes[2])] == [(4, 0), (1, 0)]
    assert storage.insert(g[4:7], DAYS[2]) == InsertResult(3, 0)
    assert storage.rebuild_aggregates() == storage.total_reports() == before + 20


def test_a_failed_group_commit_fails_every_call_and_stores_nothing(sqlite_filled, wire, tmp_path):
    storage, _ = sqlite_filled
    before = storage.total_reports()
    with sqlite3.connect(tmp_path / "veil.db") as other:  # the next transaction cannot insert
        other.execute("ALTER TABLE reports RENAME TO reports_elsewhere")
    batches = [wire.validated(wire.reports("dark_mode", [True, False])) for _ in range(3)]
    outcomes = _queue_while_locked(storage, batches, DAYS[2])
    # every call of the group sees the backend-neutral StorageUnavailable naming SQLite's error
    assert all(isinstance(o, StorageUnavailable) for o in outcomes), outcomes
    assert all("no such table" in str(o) for o in outcomes), outcomes
    with sqlite3.connect(tmp_path / "veil.db") as other:
        assert _stored_ids(other) == before
        other.execute("ALTER TABLE reports_elsewhere RENAME TO reports")
    assert storage.total_reports() == before
    retried = [storage.insert(batch, DAYS[2]) for batch in batches]
    assert [(r.accepted, r.duplicates) for r in retried] == [(2, 0)] * 3


def _id_tables(path):
    with sqlite3.connect(path) as conn:
        indexed = {row[0] for row in conn.execute("SELECT id FROM report_ids")}
        recent = [row[0] for row in conn.execute("SELECT id FROM recent_ids")]
    return indexed, recent


def test_a_merge_by_another_process_keeps_every_id_a_duplicate(tmp_path, wire):
    """Two stores on one file stand for two worker processes, each with its own copy of
    recent_ids: when one merges them into the index, the other's copy must not go stale."""
    path = tmp_path / "veil.db"
    first = open_storage(path, wire.registry, create=True, recent_ids_limit=6)
    second = open_storage(path, recent_ids_limit=6)
    try:
        a = wire.validated(wire.reports("homepage", [f"a{i}" for i in range(5)]))
        b = wire.validated(wire.reports("homepage", ["b0", "b1"]))
        assert first.insert(a, DAYS[0]).accepted == 5
        assert _id_tables(path) == (set(), [bytes.fromhex(r.id) for r in a])
        assert second.insert(b, DAYS[0]).accepted == 2  # 7 recent ids >= 6: merged
        indexed, recent = _id_tables(path)
        assert (len(indexed), recent) == (7, [])
        # new ids after the merge reuse the emptied table's rowids, which the first store
        # had already read up to: it must start over, not read on from where it was
        c = wire.validated(wire.reports("homepage", ["c0", "c1"]))
        assert second.insert(c, DAYS[1]).accepted == 2
        for store in (first, second):
            again = store.insert([*c, *a, *b], DAYS[1])
            assert (again.accepted, again.duplicates) == (0, 9)
        d = wire.validated(wire.reports("homepage", ["d0"]))
        assert first.insert([*d, *a[:2]], DAYS[1]).accepted == 1
        assert second.insert(d, DAYS[1]).duplicates == 1
        assert first.counts("homepage", min_reports=0) == wire_counts(wire, [*a, *b, *c, *d])
    finally:
        first.close()
        second.close()


def wire_counts(wire, reports):
    """The counts document a store must give for ``reports`` of ``homepage``, all days."""
    fingerprint = wire.registry["homepage"].params.fingerprint
    expected = wire.expected("homepage", [r.to_wire(fingerprint) for r in reports])
    return {"metric": "homepage", "kind": "string", "params": wire.registry["homepage"].to_dict(),
            "start": None, "end": None, **expected}


def test_interleaved_stores_and_merges_accept_each_id_once(tmp_path, wire):
    """Random calls on two stores sharing a file (repeats within a call, replays of merged and
    unmerged ids, merges every few calls) accept exactly the ids no earlier call stored."""
    rng = random.Random(20261122)
    pool = wire.validated(wire.reports("homepage", [f"site{i}" for i in range(60)]))
    path = tmp_path / "veil.db"
    stores = [open_storage(path, wire.registry, create=True, recent_ids_limit=7),
              open_storage(path, recent_ids_limit=7)]
    stored: dict[str, object] = {}
    try:
        for _ in range(80):
            call = rng.sample(pool, rng.randint(1, 9))
            call += rng.choices(call, k=rng.randint(0, 2))  # repeats within the call
            new = {r.id for r in call} - stored.keys()
            result = rng.choice(stores).insert(call, rng.choice(DAYS))
            assert (result.accepted, result.duplicates) == (len(new), len(call) - len(new))
            stored.update((r.id, r) for r in call if r.id in new)
        indexed, recent = _id_tables(path)
        assert len(indexed) > 40, "the limit of 7 should have merged most ids into the index"
        assert len(recent) == len(set(recent)) and not indexed & set(recent)
        assert {i.hex() for i in indexed | set(recent)} == stored.keys()
        assert stores[1].counts("homepage", min_reports=0) == wire_counts(wire, stored.values())
    finally:
        for store in stores:
            store.close()


def test_min_reports_is_enforced_with_an_override(filled, wire):
    storage, _ = filled
    metric = wire.registry["dark_mode"]
    strict = dataclasses.replace(metric, min_reports=10)
    with pytest.raises(TooFewReportsError) as info:
        storage.counts(strict)
    assert (info.value.reports, info.value.min_reports) == (9, 10)
    assert "9" in str(info.value) and "10" in str(info.value)
    assert storage.counts(strict, min_reports=0)["reports"] == 9
    with pytest.raises(TooFewReportsError):
        storage.counts(metric, "2027-01-01")


def test_counts_refuse_parameters_that_differ_from_the_stored_ones(filled, wire):
    storage, _ = filled
    other = Metric.from_dict("homepage", {"kind": "string", "k": 32, "h": 3, "m": 4})
    with pytest.raises(RegistryMismatchError, match="homepage"):
        storage.counts(other)


def test_registry_changes_on_metrics_with_data_are_refused(filled, store_url, wire):
    storage, _ = filled
    storage.close()
    data = wire.registry.to_dict()
    data["metrics"]["homepage"]["h"] = 3
    with pytest.raises(RegistryMismatchError, match="homepage"):
        open_storage(store_url, Registry.from_dict(data))
    # description and min_reports may change; a dropped metric with data stays decodable
    data = wire.registry.to_dict()
    data["metrics"]["homepage"]["min_reports"] = 7
    del data["metrics"]["browser"]
    with open_storage(store_url, Registry.from_dict(data)) as reopened:
        assert reopened.registry["homepage"].min_reports == 7
        assert "browser" in reopened.registry
    with open_storage(store_url) as plain:
        assert plain.registry["homepage"].min_reports == 7
        assert plain.counts("browser")["reports"] == 30


def test_migrates_a_version_1_file(tmp_path, wire):
    """Version 1 had raw reports only; migrating it builds the aggregates from them."""
    reports = [*wire.reports("homepage", ["a", "b", "a"] * 4), *wire.reports("dark_mode", [True] * 3)]
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE TABLE reports (id BLOB PRIMARY KEY, metric TEXT NOT NULL, day TEXT "
                     "NOT NULL, cohort INTEGER NOT NULL, payload ANY) STRICT, WITHOUT ROWID")
        conn.execute("INSERT INTO meta VALUES ('registry', ?)", (json.dumps(wire.registry.to_dict()),))
        for r in reports:
            payload = bytes.fromhex(r["payload"]) if r["metric"] == "homepage" else r["payload"]
            conn.execute("INSERT INTO reports VALUES (?, ?, ?, ?, ?)",
                         (bytes.fromhex(r["id"]), r["metric"], "2026-10-01", r.get("cohort", 0),
                          payload))
        conn.execute("PRAGMA user_version = 1")
    with pytest.raises(SchemaOutdatedError, match="veil migrate"):
        open_storage(path)
    with open_storage(path, migrate=True) as storage:
        assert storage.schema_version == SCHEMA_VERSION
        assert storage.counts("homepage")["cohorts"] == wire.expected("homepage", reports)["cohorts"]
        assert storage.counts("dark_mode")["cohorts"] == wire.expected("dark_mode", reports)["cohorts"]


def test_migrates_a_version_2_file(tmp_path, wire, sqlite_filled):
    """Version 2 keyed raw reports by id; migrating it moves the ids to their own set and keeps
    every report, aggregate and duplicate check."""
    storage, sent = sqlite_filled
    before = {m: storage.counts(m) for m in ("homepage", "dark_mode", "load_time")}
    storage.close()
    path = tmp_path / "veil.db"
    before_the_fold_mark(path)
    with sqlite3.connect(path) as conn:  # turn the file back into the version 2 layout
        conn.execute("CREATE TABLE reports_v2 (id BLOB PRIMARY KEY, metric TEXT NOT NULL, day TEXT "
                     "NOT NULL, cohort INTEGER NOT NULL, payload ANY) STRICT, WITHOUT ROWID")
        conn.execute("INSERT INTO reports_v2 SELECT id, metric, day, cohort, payload FROM reports")
        conn.execute("DROP TABLE reports")
        conn.execute("DROP TABLE report_ids")
        conn.execute("DROP TABLE recent_ids")
        conn.execute("DELETE FROM meta WHERE key = 'ids_generation'")
        conn.execute("ALTER TABLE reports_v2 RENAME TO reports")
        conn.execute("PRAGMA user_version = 2")
    with open_storage(path, migrate=True) as migrated:
        assert migrated.schema_version == SCHEMA_VERSION
        assert [step.version for step in migrated.migrated] == list(range(2, SCHEMA_VERSION))
        assert {m: migrated.counts(m) for m in before} == before
        stored = sum(len(reports) for reports in sent.values())
        assert migrated.total_reports() == stored
        resent = sent[DAYS[0]][:5]
        assert migrated.insert(wire.validated(resent), DAYS[0]).duplicates == 5
        assert migrated.rebuild_aggregates() == stored
        assert {m: migrated.counts(m) for m in before} == before
    indexed, recent = _id_tables(path)
    assert (len(indexed), recent) == (stored, [])


def test_migrates_a_version_3_file(tmp_path, wire, sqlite_filled):
    """Version 3 put every id straight into report_ids; migrating it adds recent_ids, and ids
    stored before stay duplicates."""
    storage, sent = sqlite_filled
    storage.close()
    path = tmp_path / "veil.db"
    before_the_fold_mark(path)
    with sqlite3.connect(path) as conn:  # turn the file back into the version 3 layout
        conn.execute("INSERT INTO report_ids SELECT id FROM recent_ids")
        conn.execute("DROP TABLE recent_ids")
        conn.execute("DELETE FROM meta WHERE key = 'ids_generation'")
        conn.execute("PRAGMA user_version = 3")
    with open_storage(path, migrate=True) as migrated:
        assert migrated.schema_version == SCHEMA_VERSION
        resent = wire.validated(sent[DAYS[1]])
        assert migrated.insert(resent, DAYS[2]).duplicates == len(resent)
        new = wire.validated(wire.reports("dark_mode", [True, False]))
        assert migrated.insert([*new, *new], DAYS[2]).accepted == 2
    indexed, recent = _id_tables(path)
    assert len(indexed) == sum(len(reports) for reports in sent.values())
    assert recent == [bytes.fromhex(r.id) for r in new]


def test_migrates_a_version_4_file(tmp_path, wire, sqlite_filled):
    """Version 4 kept no counts under daily caps; migrating it adds their table."""
    storage, sent = sqlite_filled
    storage.close()
    path = tmp_path / "veil.db"
    before_the_fold_mark(path)
    with sqlite3.connect(path) as conn:  # turn the file back into the version 4 layout
        conn.execute("DROP TABLE cap_counts")
        conn.execute("PRAGMA user_version = 4")
    with pytest.raises(SchemaOutdatedError, match="veil migrate"):
        open_storage(path)
    with open_storage(path, migrate=True) as migrated:
        assert [step.version for step in migrated.migrated] == [4, 5]
        cap = DailyCap(bytes(32), 2)
        assert migrated.insert(wire.validated(sent[DAYS[0]][:2]), DAYS[0], cap=cap).duplicates == 2
        assert migrated.insert(wire.validated(wire.reports("dark_mode", [True] * 2)), DAYS[0],
                               cap=cap).accepted == 2
        with pytest.raises(DailyCapReached):
            migrated.insert(wire.validated(wire.reports("dark_mode", [True])), DAYS[0], cap=cap)


def test_refuses_newer_foreign_and_missing_files(tmp_path, wire):
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StorageError, match="newer"):
        open_storage(newer, wire.registry)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(StorageError, match="not a Veil database"):
        open_storage(foreign, wire.registry)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError, match="not a usable SQLite database"):
        open_storage(junk, wire.registry)
    with pytest.raises(StorageError, match="no Veil database"):
        open_storage(tmp_path / "missing.db")
    with open_storage(tmp_path / "fresh.db", wire.registry, create=True) as storage, \
            pytest.raises(StorageError, match="YYYY-MM-DD"):
        storage.counts("homepage", "11/01/2026")


def test_backup_is_a_consistent_copy(sqlite_filled, tmp_path, wire):
    storage, _ = sqlite_filled
    target = storage.backup(tmp_path / "copy.db")
    with open_storage(target) as copy:
        for metric in ("homepage", "dark_mode"):
            assert copy.counts(metric) == storage.counts(metric)
    with pytest.raises(StorageError, match="exists"):
        storage.backup(target)


def test_open_storage_picks_the_backend_from_the_url(store_url, wire):
    """A store's URL (or path) opens the backend :data:`BACKENDS` names for its scheme;
    reopened, it has the registry recorded."""
    from veil.server.storage.postgres import PostgresStorage

    scheme = store_url.split("://", 1)[0] if "://" in store_url else "sqlite"
    expected = {"sqlite": SQLiteStorage, "postgresql": PostgresStorage}[scheme]
    with open_storage(store_url, wire.registry, create=True) as storage:
        assert type(storage) is expected
    with open_storage(store_url) as storage:
        assert type(storage) is expected
        assert set(storage.registry) == set(wire.registry)


def test_open_storage_opens_sqlite_for_a_path_or_a_sqlite_url(tmp_path, wire, monkeypatch):
    """A plain path and sqlite:/// URLs (relative, or absolute with four slashes) open SQLite;
    other schemes name the backends there are."""
    monkeypatch.chdir(tmp_path)
    with open_storage("sqlite:///relative.db", wire.registry, create=True) as storage:
        assert isinstance(storage, Storage) and storage.location == "relative.db"
    absolute = tmp_path / "absolute.db"
    with open_storage(f"sqlite:///{absolute}", wire.registry, create=True) as storage:
        assert storage.location == str(absolute)
    with open_storage(absolute) as storage:
        assert set(storage.registry) == set(wire.registry)
    known = ", ".join(sorted(BACKENDS))
    with pytest.raises(StorageError, match=rf"no storage backend for 'mysql' URLs \(known: {known}"):
        open_storage("mysql://db.example/veil")
    with pytest.raises(StorageError, match="names no file"):
        open_storage("sqlite:///", create=True)
    assert backend_class("sqlite") is SQLiteStorage


def test_recorded_parameters_are_permanent_even_without_reports(store_url, wire):
    """A rolling deploy where a second collector changes a metric nobody reported yet is
    refused at its start, and the first keeps a usable database (it used to end in 503s
    and 'cannot reshape' for good)."""
    first = open_storage(store_url, wire.registry, create=True)
    changed = wire.registry.to_dict()
    changed["metrics"]["homepage"]["k"] = 64
    with pytest.raises(RegistryMismatchError, match=r"homepage.*recorded the old ones.*homepage\.v2"):
        open_storage(store_url, Registry.from_dict(changed))
    # a metric dropped from the registry stays recorded: it cannot come back changed either
    dropped = wire.registry.to_dict()
    del dropped["metrics"]["homepage"]
    open_storage(store_url, Registry.from_dict(dropped)).close()
    with pytest.raises(RegistryMismatchError, match="homepage"):
        open_storage(store_url, Registry.from_dict(changed))
    reports = wire.validated(wire.reports("homepage", ["a.example"] * 5))
    assert first.insert(reports).accepted == 5
    assert first.counts("homepage")["reports"] == 5
    first.close()
    with open_storage(store_url) as reopened:
        assert reopened.registry["homepage"].params == wire.registry["homepage"].params


@pytest.mark.parametrize("cohorts, payloads", [
    ([7, 4095, 0], [31, 0, 17]),            # cohorts and payloads packed in one integer
    ([0, 2**31 - 1, 0], [2**32 - 1, 0, 1]),  # the packing's largest cohort and payload
    ([5, 2**31 - 1, 3], [2**40, 2, 2**32]),  # beyond the packing's range: JSON pairs
], ids=["packed", "packed-edges", "pairs"])
def test_integer_payloads_are_stored_exactly_in_each_statement_shape(tmp_path, wire, cohorts,
                                                                     payloads):
    from veil.server.storage.sqlite.rows import insert_statement

    path = tmp_path / "veil.db"
    open_storage(str(path), wire.registry, create=True).close()
    statistic = statistic_for(wire.registry["dark_mode"].params)
    assert statistic.payload_type == "int"
    group = [(bytes([i]) * 16, "dark_mode", "2026-11-01", cohort, payload)
             for i, (cohort, payload) in enumerate(zip(cohorts, payloads, strict=True))]
    statement, parameters, many = insert_statement(statistic, "dark_mode", "2026-11-01", group)
    assert not many
    with sqlite3.connect(path) as conn:
        conn.execute(statement, parameters)
        stored = conn.execute("SELECT id, metric, day, cohort, payload FROM reports "
                              "ORDER BY id").fetchall()
    conn.close()
    assert stored == group


def test_a_store_recorded_before_the_size_limit_still_opens(store_url, tmp_path):
    """A registry may not declare a metric whose statistic holds more than MAX_COUNTERS
    counters, but a store that an earlier version let record one keeps its reports: it
    opens (without a registry, or with one that leaves the metric out) and counts them."""
    from veil.client.encoders import make_encoder
    from veil.shared.errors import ParameterError
    from veil.shared.kinds.base import MAX_COUNTERS, as_recorded
    from veil.shared.wire import make_batch, make_report, validate_batch

    toml = ("version = 1\n[metrics.wide]\nkind = \"string\"\nk = 4096\nm = 16384\n"
            "min_reports = 1\n[metrics.flag]\nkind = \"boolean\"\n")
    with pytest.raises(ParameterError, match="counters"):
        Registry.from_toml(toml)
    with as_recorded():
        earlier = Registry.from_toml(toml)  # what an earlier version accepted and recorded
    assert earlier["wide"].params.counters > MAX_COUNTERS
    storage = open_storage(store_url, earlier, create=True)
    encoder = make_encoder(earlier["wide"], bytes(32), 7)
    report = make_report("ab" * 16, "wide", encoder.cohort, encoder.encode("example.com"),
                         earlier["wide"].params.fingerprint)
    storage.insert(validate_batch(make_batch("cd" * 16, [report]), earlier).reports, DAYS[0])
    storage.close()
    for registry in (None, Registry.from_toml("version = 1\n[metrics.flag]\nkind = \"boolean\"\n")):
        reopened = open_storage(store_url, registry)
        try:
            assert reopened.registry["wide"].params == earlier["wide"].params
            document = reopened.stats("wide", DAYS[0], DAYS[0])
            assert [entry["reports"] for entry in document["metrics"]] == [1], document
        finally:
            reopened.close()
    # and its archive, whose manifest records the same registry, is read again: a second
    # run and an aggregation read the manifest back (they refused it as malformed)
    from veil.server.cli import main

    root = tmp_path / "archive"
    for _ in range(2):
        assert main(["archive", "--db", store_url, "--out", str(root)]) == 0
    assert main(["aggregate", "--archive", str(root), "--db", store_url, "--workers", "1"]) == 0


def test_a_stored_registry_this_veil_refuses_is_named_not_called_damaged(tmp_path):
    """A registry an earlier Veil recorded may hold what this one refuses (here a β realized
    as 0): the file is sound, so the error says what and what to do, not "damaged"."""
    path = tmp_path / "veil.db"
    open_storage(path, Registry.from_toml('version = 1\n[metrics.b]\nkind = "boolean"\n'),
                 create=True).close()
    with sqlite3.connect(path) as conn:
        record = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'registry'")
                            .fetchone()[0])
        record["metrics"]["b"]["beta"] = 1e-300
        conn.execute("UPDATE meta SET value = ? WHERE key = 'registry'", (json.dumps(record),))
    conn.close()
    with pytest.raises(StorageError) as info:
        open_storage(path)
    assert "declares what this Veil refuses" in str(info.value)
    assert "metrics.b" in str(info.value) and "damaged" not in str(info.value)
