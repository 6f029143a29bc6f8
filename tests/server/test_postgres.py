"""The PostgreSQL store: concurrent writer processes, the replay window, retention, and a
collector on it that loses nothing when one of its workers or PostgreSQL itself goes away.

Every test runs on a fresh database of the test run's PostgreSQL server (``postgres_url``);
without a server they are skipped, saying how to get one (see ``tests/conftest.py``).
What every backend must do is tested once per backend in ``test_storage.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import requests

from tests.conftest import TEST_REGISTRY_TOML, wait_until
from veil.server.storage import (
    DailyCap,
    DailyCapReached,
    SchemaOutdatedError,
    StorageError,
    check_storage,
    open_storage,
    pending_migrations,
)
from veil.server.storage.postgres import PostgresStorage
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, validate_batch

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


def assert_counts(storage, wire, reports, *days: str | None) -> None:
    """Every metric's counts document over ``days`` (all days if none) is the one
    :meth:`Wire.expected` predicts for ``reports`` (float sums up to the order of additions)."""
    for name in wire.registry:
        document = storage.counts(name, *days, min_reports=0)
        expected = wire.approx(wire.expected(name, reports))
        assert (document["reports"], document["cohorts"]) == (
            expected["reports"], expected["cohorts"]), name


def mixed_reports(wire, n: int) -> list[dict]:
    """``n`` wire reports spread over four metrics of different statistics."""
    values = {"homepage": [f"site{i % 7}.example" for i in range(n // 4)],
              "browser": ["chrome", "firefox", "other"] * (n // 12 + 1),
              "dark_mode": [True, False] * (n // 8 + 1),
              "load_time": [i % 11 * 0.9 for i in range(n // 4)]}
    out = [r for metric, vals in values.items() for r in wire.reports(metric, vals[: n // 4])]
    return out + wire.reports("dark_mode", [True] * (n - len(out)))


# storage


def test_postgres_and_postgresql_urls_open_it_and_its_location_hides_the_password(
        postgres_url, wire):
    parts = urlsplit(postgres_url)
    with_password = parts._replace(netloc=f"postgres:s3cret-pw@{parts.hostname}:{parts.port}")
    with open_storage(with_password.geturl(), wire.registry, create=True) as storage:
        assert isinstance(storage, PostgresStorage)
        assert "s3cret-pw" not in storage.location and parts.path in storage.location
    with open_storage(with_password._replace(scheme="postgres").geturl()) as storage:
        assert isinstance(storage, PostgresStorage)
        assert set(storage.registry) == set(wire.registry)


def test_a_database_without_a_store_is_created_only_when_asked(postgres_url, wire):
    with pytest.raises(StorageError, match="no Veil store"):
        open_storage(postgres_url, wire.registry)
    open_storage(postgres_url, wire.registry, create=True).close()
    with open_storage(postgres_url) as storage:
        assert storage.total_reports() == 0


def test_a_store_of_a_newer_schema_is_refused(postgres_url, wire):
    open_storage(postgres_url, wire.registry, create=True).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE veil_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StorageError, match="newer"):
        open_storage(postgres_url, wire.registry)


def test_a_schema_1_store_is_migrated_when_asked_and_then_counts_daily_caps(postgres_url, wire):
    """Schema 1 kept no counts under daily caps; migrating it adds their table."""
    open_storage(postgres_url, wire.registry, create=True).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # back to the schema 1 layout
        conn.execute("DROP TABLE veil_cap_counts")
        conn.execute("UPDATE veil_meta SET value = '1' WHERE key = 'schema_version'")
    assert [step.version for step in pending_migrations(postgres_url)] == [1]
    with pytest.raises(SchemaOutdatedError, match="veil migrate"):
        open_storage(postgres_url)
    with open_storage(postgres_url, migrate=True) as storage:
        assert [step.version for step in storage.migrated] == [1]
        cap = DailyCap(bytes(32), 2)
        assert storage.insert(wire.validated(wire.reports("dark_mode", [True] * 2)), DAYS[0],
                              cap=cap).accepted == 2
        with pytest.raises(DailyCapReached):
            storage.insert(wire.validated(wire.reports("dark_mode", [True])), DAYS[0], cap=cap)
    assert pending_migrations(postgres_url) == []


def _write(url: str, phases: list[tuple[str, list[list[dict]]]], start: Any, done: Any) -> None:
    """A writer process: its own storage on ``url``; for each ``(day, batches)`` of ``phases``,
    wait at the barrier ``start`` for the other writers, then insert the batches. Puts
    ``(accepted, duplicates)`` summed over its calls on the queue ``done``."""
    registry = Registry.from_toml(TEST_REGISTRY_TOML)
    accepted = duplicates = 0
    with open_storage(url, registry) as storage:
        for day, batches in phases:
            start.wait(60)
            for batch in batches:
                batch_reports = validate_batch(make_batch(os.urandom(16).hex(), batch),
                                               registry).reports
                result = storage.insert(batch_reports, day)
                accepted += result.accepted
                duplicates += result.duplicates
    done.put((accepted, duplicates))


def test_concurrent_writer_processes_store_each_id_once(postgres_url, wire):
    """Four processes, each with its own storage on one database, insert the same reports at
    once in different orders: first two thirds of them on one day, then all of them on the
    next (replays of the first day within the replay window, and new ones). Every id is
    stored once, and the aggregates equal a recount and the counts the reports predict."""
    writers = 4
    pool = random.Random(7).sample(mixed_reports(wire, 1200), 1200)
    first = pool[: 2 * len(pool) // 3]
    open_storage(postgres_url, wire.registry, create=True).close()

    def batches(reports: list[dict], seed: int) -> list[list[dict]]:
        shuffled = random.Random(seed).sample(reports, len(reports))
        return [shuffled[i:i + 25] for i in range(0, len(shuffled), 25)]

    # fork: a spawned child could not import this module (pytest imports it by path); the
    # parent holds no connection when it forks
    context = multiprocessing.get_context("fork")
    start, done = context.Barrier(writers), context.Queue()
    processes = [context.Process(target=_write, args=(
        postgres_url, [(DAYS[0], batches(first, i)), (DAYS[1], batches(pool, 100 + i))],
        start, done)) for i in range(writers)]
    for process in processes:
        process.start()
    results: list[tuple[int, int]] = []
    deadline = time.monotonic() + 180
    while len(results) < writers:
        try:
            results.append(done.get(timeout=1))
        except queue.Empty:
            failed = [process.exitcode for process in processes
                      if process.exitcode not in (None, 0)]
            assert not failed, f"writer processes failed (exit codes {failed})"
            assert time.monotonic() < deadline, "the writer processes did not finish"
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert sum(accepted for accepted, _ in results) == len(pool)
    assert sum(duplicates for _, duplicates in results) == writers * (len(first) + len(pool)) \
        - len(pool)
    check = check_storage(postgres_url)
    assert check.sound, check
    assert check.reports == len(pool)
    with open_storage(postgres_url) as storage:
        assert storage.total_reports() == len(pool)
        assert_counts(storage, wire, pool)
        assert_counts(storage, wire, first, DAYS[0], DAYS[0])
        assert_counts(storage, wire, pool[len(first):], DAYS[1], DAYS[1])


def test_a_report_replayed_on_a_later_day_within_the_replay_window_is_a_duplicate(
        postgres_url, wire):
    """By default (7 days) a report sent again the next day, or six days later, is not
    counted again; nor under another storage on the same database."""
    sent = mixed_reports(wire, 40)
    reports = wire.validated(sent)
    with open_storage(postgres_url, wire.registry, create=True) as storage:
        assert storage.replay_window_days == 7
        assert storage.insert(reports, "2026-11-02").accepted == 40
        again = storage.insert(reports, "2026-11-03")
        assert (again.accepted, again.duplicates) == (0, 40)
        with open_storage(postgres_url) as other:
            assert other.insert(reports[:10], "2026-11-08").duplicates == 10
            assert other.insert(reports[:10], "2026-10-28").duplicates == 10
        assert storage.total_reports() == 40
        assert storage.days("homepage") == ["2026-11-02"]
        assert_counts(storage, wire, sent)


@pytest.mark.parametrize("window", [1, 7])
def test_a_day_over_has_its_aggregate_shards_folded_into_one_row_per_cohort(
        postgres_url, wire, window):
    """The first write of a day folds the previous day's shards (written at random among
    :data:`SHARDS` per batch), whatever the replay window (with one day it once never
    folded them); the counts stay those of the reports."""
    sent = mixed_reports(wire, 200)
    with open_storage(postgres_url, wire.registry, create=True,
                      replay_window_days=window) as storage:
        for start in range(0, 160, 10):
            storage.insert(wire.validated(sent[start:start + 10]), DAYS[0])
        with psycopg.connect(postgres_url) as conn:
            shards = conn.execute("SELECT count(DISTINCT shard) FROM veil_aggregates "
                                  "WHERE day = %s", (DAYS[0],)).fetchone()
        assert shards is not None and shards[0] > 1  # 16 batches over 8 shards
        storage.insert(wire.validated(sent[160:]), DAYS[1])
        with psycopg.connect(postgres_url) as conn:
            left = conn.execute("SELECT count(*) FROM veil_aggregates WHERE day = %s "
                                "AND shard <> 0", (DAYS[0],)).fetchone()
        assert left == (0,)
        assert_counts(storage, wire, sent[:160], DAYS[0], DAYS[0])
        assert_counts(storage, wire, sent)


def test_the_replay_window_is_an_option_recorded_with_the_store(postgres_url, wire):
    """``replay_window_days`` chosen at creation holds for every storage opened on the
    database; a replay beyond the window is a new report."""
    reports = wire.validated(wire.reports("dark_mode", [True, False, True]))
    with open_storage(postgres_url, wire.registry, create=True, replay_window_days=2) as storage:
        assert storage.insert(reports, "2026-11-02").accepted == 3
        assert storage.insert(reports, "2026-11-03").duplicates == 3
    with open_storage(postgres_url) as storage:
        assert storage.replay_window_days == 2
        assert storage.insert(reports, "2026-11-12").accepted == 3
        assert storage.total_reports() == 6
        assert storage.days("dark_mode") == ["2026-11-02", "2026-11-12"]


def test_retention_drops_raw_reports_of_old_days_and_keeps_their_counts(postgres_url, wire):
    sent = {day: mixed_reports(wire, 40) for day in DAYS}
    with open_storage(postgres_url, wire.registry, create=True) as storage:
        for day, reports in sent.items():
            assert storage.insert(wire.validated(reports), day).accepted == 40
        everything = [r for reports in sent.values() for r in reports]
        assert storage.drop_days_before("2026-11-03") == DAYS[:2]
        assert storage.total_reports() == 40
        assert {bytes(i).hex() for chunk in storage.iter_reports() for i in chunk.ids} \
            == {r["id"] for r in sent[DAYS[2]]}
        assert_counts(storage, wire, everything)
        assert storage.days("homepage") == DAYS
        check = check_storage(postgres_url)
        assert check.sound and check.reports == 40, check
        # no report of a dropped day is taken, by this storage or another on the database
        with pytest.raises(StorageError, match="2026-11-01"):
            storage.insert(wire.validated(wire.reports("dark_mode", [True])), "2026-11-01")
        with open_storage(postgres_url) as other, pytest.raises(StorageError, match="2026-10-30"):
            other.insert(wire.validated(wire.reports("dark_mode", [True])), "2026-10-30")
        assert storage.insert(wire.validated(wire.reports("dark_mode", [True])), DAYS[2]).accepted == 1
        assert storage.drop_days_before("2026-11-02") == []
        assert_counts(storage, wire, sent[DAYS[0]] + sent[DAYS[1]], None, DAYS[1])


def test_retention_never_drops_a_day_of_the_replay_window(postgres_url, wire):
    """A report of a dropped day resent within the window counted again (its id gone with
    the partition), and dropping today's partition left collectors refusing every upload:
    retention stops at the window's first day, by the database's clock."""
    import datetime as dt

    with open_storage(postgres_url, wire.registry, create=True, replay_window_days=3) as storage:
        today = dt.date.fromisoformat(storage.today())
        first = (today - dt.timedelta(days=2)).isoformat()
        reports = wire.validated(wire.reports("dark_mode", [True, False]))
        assert storage.insert(reports, first).accepted == 2
        for cutoff in (today + dt.timedelta(days=1), today, today - dt.timedelta(days=1)):
            with pytest.raises(StorageError, match=f"drop the days before {first} at the "
                                                   r"latest \(--keep-days 3 or more\)"):
                storage.drop_days_before(cutoff.isoformat())
        assert storage.drop_days_before(first) == []
        assert storage.insert(reports, today.isoformat()).duplicates == 2  # still known


def test_a_long_reader_holds_up_no_upload_behind_partition_ddl(postgres_url, wire, caplog):
    """A transaction reading the raw reports (``veil check``, an archive) holds the table.
    DDL queued behind it held every insert for as long as it ran: retention's drop, and the
    partition a day creates when it first needs one. Both now give up after a second:
    retention says to run again, and the partitions of the days ahead are created once a day
    while they are not needed yet (tried again the next day)."""
    import datetime as dt

    from veil.server.storage.postgres.rows import day_number, day_text

    old = "2026-11-02"
    with open_storage(postgres_url, wire.registry, create=True) as storage:
        storage.insert(wire.validated(wire.reports("dark_mode", [True])), old)
    reader = psycopg.connect(postgres_url)
    reader.execute("SELECT count(*) FROM veil_reports")  # its transaction stays open
    try:
        with open_storage(postgres_url) as storage:
            started = time.monotonic()
            with pytest.raises(StorageError, match="holds the table"):
                storage.drop_days_before("2026-11-03")
            with caplog.at_level("INFO", logger="veil.server.storage"):
                # the process's first write of the day: it folds yesterday, then tries the
                # partitions ahead, which the reader holds up
                assert storage.insert(wire.validated(wire.reports("dark_mode", [True]))
                                      ).accepted == 1
            assert time.monotonic() - started < 10  # two DDL timeouts of 1 s, not the reader
            assert "waits for a later day" in caplog.text
            ahead = day_text(day_number(storage.today()) + 3)
            assert ahead not in storage.partitions()
    finally:
        reader.close()
    with open_storage(postgres_url) as storage:
        assert storage.drop_days_before("2026-11-03") == [old]
        storage.insert(wire.validated(wire.reports("dark_mode", [True])))
        assert ahead in storage.partitions()
    assert dt.date.fromisoformat(ahead) > dt.datetime.now(dt.UTC).date()


def test_opening_a_store_waits_for_no_reader_over_the_days_ahead(postgres_url, wire, caplog):
    """Opening a store created the partitions of the days ahead with no time limit: with one
    missing (a prepare that gave up) and a reader holding the table, every ``veil stats``,
    decode and worker start waited for the reader, and the uploads queued behind it. The
    days ahead are now created as after a day's first write, giving up after a second."""
    from veil.server.storage.postgres import schema
    from veil.server.storage.postgres.rows import day_number, day_text

    with open_storage(postgres_url, wire.registry, create=True) as storage:
        ahead = day_text(day_number(storage.today()) + 2)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {schema.partition_name(ahead)}")
    reader = psycopg.connect(postgres_url)
    reader.execute("SELECT count(*) FROM veil_reports")  # its transaction stays open
    try:
        started = time.monotonic()
        with caplog.at_level("INFO", logger="veil.server.storage"), \
                open_storage(postgres_url) as storage:
            assert storage.insert(wire.validated(wire.reports("dark_mode", [True]))
                                  ).accepted == 1
        assert time.monotonic() - started < 10  # one DDL timeout of 1 s, not the reader
        assert "waits for a later day" in caplog.text
    finally:
        reader.close()
    with open_storage(postgres_url) as storage:
        assert ahead in storage.partitions()


def test_aggregates_replaced_while_the_day_is_folded_are_counted_once(postgres_url, wire):
    """``veil aggregate`` replaces a day's aggregates; the first write of the next day folds
    that day's shards under the day's lock. A replacement racing an uncommitted fold kept the
    folded row and added the archive's counts on top (20 for 10 reports): it now waits for
    the day's lock."""
    from veil.server.storage.postgres import schema
    from veil.server.storage.postgres.rows import day_number

    day = "2026-11-02"
    with open_storage(postgres_url, wire.registry, create=True) as storage:
        for report in wire.reports("dark_mode", [True] * 10):  # shards over several rows
            storage.insert(wire.validated([report]), day)
        reports, states = storage.read_aggregates(storage.registry["dark_mode"], day, day)
    with psycopg.connect(postgres_url) as fold:  # what a collector's next-day write runs
        fold.execute("SELECT pg_advisory_xact_lock(%s, %s)", (schema.LOCK_DAY, day_number(day)))
        fold.execute(schema.FOLD_DAY, {"day": day, "metrics": ["dark_mode"]})

        def replace() -> None:
            with open_storage(postgres_url) as storage:
                storage.replace_aggregates("dark_mode", day, reports, states)

        racing = threading.Thread(target=replace)
        racing.start()
        time.sleep(0.5)
        assert racing.is_alive()  # waits for the fold's transaction
        fold.commit()
    racing.join(30)
    with open_storage(postgres_url) as storage:
        assert storage.counts("dark_mode", day, day, min_reports=0)["reports"] == 10
    assert check_storage(postgres_url).sound


# a collector on PostgreSQL, over HTTP


class Uploaders:
    """Threads that upload batches as the SDK does: each batch is sent again (same batch id,
    same reports) after a network error or a 5xx until it is acknowledged. ``acked`` holds
    the reports of acknowledged batches, ``statuses`` every status code answered,
    ``retry_after`` the Retry-After header of each 5xx, ``broken`` how many requests got no
    answer. Leaving the ``with`` block stops them (a test that failed midway)."""

    def __init__(self, url: str, batches: list[dict], threads: int = 3) -> None:
        self.url = url
        self.acked: list[dict] = []
        self.statuses: list[int] = []
        self.retry_after: list[str | None] = []
        self.broken = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._todo = list(batches)
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> Uploaders:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self) -> None:
        with requests.Session() as session:
            while True:
                with self._lock:
                    if not self._todo or self.errors:
                        return
                    batch = self._todo.pop()
                try:
                    self._send(session, batch)
                except BaseException as exc:  # for join() to raise in the test's thread
                    with self._lock:
                        self.errors.append(exc)
                    return

    def _send(self, session: requests.Session, batch: dict) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                response = session.post(self.url + "/v1/reports", json=batch, timeout=30)
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                with self._lock:
                    self.broken += 1
                time.sleep(0.05)  # the worker died with the request: send it again
                continue
            with self._lock:
                self.statuses.append(response.status_code)
                if response.status_code >= 500:
                    self.retry_after.append(response.headers.get("Retry-After"))
            if response.status_code == 200:
                body = response.json()
                assert body["accepted"] + body["duplicates"] == len(batch["reports"]), body
                with self._lock:
                    self.acked.extend(batch["reports"])
                return
            assert response.status_code == 503, (response.status_code, response.text)
            time.sleep(0.1)  # the SDK waits Retry-After; the test need not
        if not self._stop.is_set():
            raise AssertionError(f"batch {batch['batch_id']} was never acknowledged")

    def wait_for(self, acked: int, timeout: float = 60.0) -> None:
        """Until ``acked`` reports are acknowledged."""
        deadline = time.monotonic() + timeout
        while len(self.acked) < acked:
            assert time.monotonic() < deadline, f"only {len(self.acked)} reports acknowledged"
            time.sleep(0.01)

    def join(self, timeout: float = 240.0) -> None:
        """Until every batch is acknowledged; raises what went wrong in an uploader."""
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), "an uploader is still sending"
        if self.errors:
            raise self.errors[0]


def assert_stored_once(postgres_url: str, wire, sent: list[dict]) -> None:
    """Every report of ``sent`` stored exactly once; aggregates equal a recount and the
    counts the reports predict."""
    check = check_storage(postgres_url)
    assert check.sound, check
    assert check.reports == len(sent)
    with open_storage(postgres_url) as storage:
        assert storage.total_reports() == len(sent)
        stored = {bytes(i).hex() for chunk in storage.iter_reports() for i in chunk.ids}
        assert stored == {r["id"] for r in sent}
        assert_counts(storage, wire, sent)


def _log(collector) -> str:
    return (collector.workdir / "serve.log").read_text(errors="replace")[-4000:]


def test_a_worker_killed_during_uploads_loses_nothing_acknowledged(
        collector_factory: Callable[..., Any], postgres_url, wire, children_of):
    """SIGKILL of one of two ``veil serve`` workers while four clients upload: the
    requests it held fail, the clients send them again, and in the end every report is
    stored once."""
    collector = collector_factory(db=postgres_url, workers=2)
    batches = [wire.batch(wire.reports("homepage", ["kill.example", "x.example"] * 25))
               for _ in range(120)]
    with Uploaders(collector.url, batches, threads=4) as uploaders:
        uploaders.wait_for(1000)
        victim = children_of(collector.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        uploaders.join()
    sent = [r for batch in batches for r in batch["reports"]]
    assert len(uploaders.acked) == len(sent), _log(collector)
    assert f"worker {victim} was killed by signal SIGKILL" in _log(collector)
    assert_stored_once(postgres_url, wire, sent)
    assert collector.counts("homepage")["reports"] == len(sent)


def test_postgres_down_during_uploads_gives_503_and_loses_nothing(
        collector_factory: Callable[..., Any], postgres_server, postgres_url, wire):
    """PostgreSQL stopped while clients upload: the collector keeps running and answers 503
    with Retry-After (uploads and /readyz); once PostgreSQL is back, uploads succeed again
    without a restart of ``veil serve``, and every report is stored once."""
    if not postgres_server.restartable:
        pytest.skip("the PostgreSQL server of $VEIL_TEST_POSTGRES is not these tests' to stop")
    collector = collector_factory(db=postgres_url, workers=2)
    serve_pid = collector.process.pid
    batches = [wire.batch(mixed_reports(wire, 40)) for _ in range(150)]
    probe = wire.batch(wire.reports("dark_mode", [True, False]))
    with Uploaders(collector.url, batches) as uploaders:
        uploaders.wait_for(1200)
        postgres_server.stop()
        try:
            response = requests.post(collector.url + "/v1/reports", json=probe, timeout=60)
            assert response.status_code == 503, (response.status_code, response.text)
            assert response.headers["Retry-After"].isdigit()
            assert response.json()["error"]["code"] == "unavailable"
            assert requests.get(collector.url + "/readyz", timeout=60).status_code == 503
            acked_while_down = len(uploaders.acked)
            refused = uploaders.statuses.count(503)
            wait_until(lambda: uploaders.statuses.count(503) > refused,
                       "an uploader's batch refused while PostgreSQL is down")
            assert len(uploaders.acked) == acked_while_down
        finally:
            postgres_server.start()
        deadline = time.monotonic() + 60
        while (response := requests.post(collector.url + "/v1/reports", json=probe,
                                         timeout=60)).status_code == 503:
            assert time.monotonic() < deadline, "uploads still fail after PostgreSQL is back"
            time.sleep(0.2)
        assert response.status_code == 200 and response.json()["accepted"] == 2, response.text
        uploaders.join()
    assert collector.process.pid == serve_pid and collector.process.poll() is None
    assert set(uploaders.statuses) == {200, 503}, _log(collector)
    assert all(value and value.isdigit() for value in uploaders.retry_after)
    sent = [r for batch in [*batches, probe] for r in batch["reports"]]
    assert len(uploaders.acked) == len(sent) - len(probe["reports"])
    assert requests.get(collector.url + "/readyz", timeout=30).status_code == 200
    assert_stored_once(postgres_url, wire, sent)
