"""The daily cap per upload token, from the outside: real ``veil serve`` processes over HTTP.

The cap is counted in the store, in the transaction that stores a batch, so it holds across
worker processes, restarts and collectors sharing a PostgreSQL database; a batch that would
take its token over the cap is refused whole with 429 and ``Retry-After`` until the next UTC
day, and a replayed batch costs nothing. A cap that could not hold refuses to start.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import secrets
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import TEST_REGISTRY
from veil.shared.wire import make_batch, make_report

CAP = 100
TOKEN = secrets.token_hex(32)
#: the options of every collector here: one upload token capped at CAP reports a day, batches
#: of up to CAP reports (a cap may not be smaller than the largest batch)
CAPPED = {"upload_token": TOKEN, "max_reports": CAP, "serve_args": ["--token-daily-cap", str(CAP)]}


def batch(n: int) -> dict:
    """A batch of ``n`` new well-formed dark_mode reports (the cap counts reports, not values)."""
    fingerprint = TEST_REGISTRY["dark_mode"].params.fingerprint
    return make_batch(os.urandom(16).hex(), [
        make_report(os.urandom(16).hex(), "dark_mode", None, 1, fingerprint) for _ in range(n)])


def post(url: str, body: dict, token: str = TOKEN) -> requests.Response:
    """POST a batch on a new connection (so that uploads spread over the worker processes)."""
    return requests.post(url + "/v1/reports", json=body, timeout=60,
                         headers={"Authorization": f"Bearer {token}", "Connection": "close"})


def stored(collector) -> int:
    """The reports the collector's store holds, from ``GET /v1/stats``."""
    response = requests.get(collector.url + "/v1/stats", headers=collector.headers(), timeout=30)
    response.raise_for_status()
    return int(response.json()["reports"])


def seconds_to_midnight() -> float:
    """Seconds until the next UTC day."""
    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    return dt.datetime.combine(tomorrow, dt.time(), dt.UTC).timestamp() - time.time()


def assert_capped(response: requests.Response) -> None:
    """A 429 of the daily cap: nothing stored, retry at the next UTC day."""
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limited" and f"cap of {CAP} reports a day" in error["message"]
    assert int(response.headers["Retry-After"]) == pytest.approx(seconds_to_midnight(), abs=5)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request) -> str | None:
    """What ``--db`` names: the collector's own SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("postgres_url")


def test_a_cap_holds_across_worker_processes(collector_factory, database):
    """40 batches of 10 racing from 8 threads, each on its own connection, to 2 workers: the
    store takes exactly the cap's 100 reports and refuses every other batch whole."""
    collector = collector_factory(db=database, workers=2, **CAPPED)
    batches = [batch(10) for _ in range(40)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda body: post(collector.url, body), batches))
    accepted = [body for body, answer in zip(batches, answers, strict=True)
                if answer.status_code == 200]
    assert len(accepted) == CAP // 10, [answer.status_code for answer in answers]
    for answer in answers:
        if answer.status_code != 200:
            assert_capped(answer)
    assert stored(collector) == CAP
    # at the cap, a replay of a stored batch is acknowledged as duplicates, not refused
    replayed = post(collector.url, accepted[0])
    assert replayed.status_code == 200
    assert (replayed.json()["accepted"], replayed.json()["duplicates"]) == (0, 10)
    assert_capped(post(collector.url, batch(1)))
    assert stored(collector) == CAP


def test_a_cap_counts_each_stored_report_once_and_survives_a_restart(collector_factory):
    """Replays of a stored batch (an SDK retrying after a lost answer) cost nothing, and a
    restarted collector remembers what each token stored today; the file holds a hash of the
    token, never the token."""
    collector = collector_factory(**CAPPED)
    first = batch(10)
    answers = [post(collector.url, first) for _ in range(3)]
    assert [(a.json()["accepted"], a.json()["duplicates"]) for a in answers] == [
        (10, 0), (0, 10), (0, 10)]
    assert [post(collector.url, batch(10)).status_code for _ in range(9)] == [200] * 9
    assert_capped(post(collector.url, batch(1)))
    collector.restart()
    assert_capped(post(collector.url, batch(1)))
    assert stored(collector) == CAP
    collector.stop()
    with sqlite3.connect(collector.db_path) as conn:
        counts = conn.execute("SELECT key, day, reports FROM cap_counts").fetchall()
    key = hashlib.sha256(b"veil upload token daily cap\0" + TOKEN.encode()).digest()
    assert counts == [(key, dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"), CAP)]
    files = collector.db_path.parent.glob(collector.db_path.name + "*")
    assert not any(TOKEN.encode() in path.read_bytes() for path in files)


def test_collectors_sharing_a_postgresql_database_share_the_cap(collector_factory, postgres_url):
    """Two collectors on one database, batches racing to both: 100 reports in all, not 100
    each."""
    collectors = [collector_factory(db=postgres_url, **CAPPED) for _ in range(2)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: post(collectors[i % 2].url, batch(10)), range(30)))
    assert sum(answer.status_code == 200 for answer in answers) == CAP // 10
    for answer in answers:
        if answer.status_code != 200:
            assert_capped(answer)
    assert stored(collectors[0]) == stored(collectors[1]) == CAP


@pytest.mark.parametrize(("options", "message"), [
    ({"upload_token": TOKEN, "max_reports": 500},
     "--token-daily-cap 100 is smaller than --max-reports 500"),
    ({}, "--token-daily-cap 100 caps each upload token, but uploads are open"),
])
def test_a_cap_that_could_not_hold_refuses_to_start(collector_factory, tmp_path, options,
                                                     message):
    """A cap below one batch (a batch is stored or refused whole, and the SDK splits batches on
    413, not 429) or without upload tokens is refused at start, saying why."""
    with pytest.raises(RuntimeError, match="did not start"):
        collector_factory(serve_args=["--token-daily-cap", str(CAP)], **options)
    assert message in (tmp_path / "collector0" / "serve.log").read_text()
