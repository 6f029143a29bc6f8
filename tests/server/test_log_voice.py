"""The collector's log speaks with one voice: one line per event, under Veil's loggers.

A PostgreSQL outage used to be two psycopg WARNING lines per connection attempt (libpq's
reason, then its tab-indented hint), several a second, and nothing from Veil, while
``/readyz`` took 5 s to answer and named the database twice. Now it is one line when the
outage starts and one when it ends, and the readiness probe answers 503 within a second.
"""

from __future__ import annotations

import io
import logging
import time

import requests

from veil.server.collector.logs import configure_logging, one_line


def log_lines(collector) -> list[str]:
    return (collector.workdir / "serve.log").read_text(encoding="utf-8").splitlines()


def test_a_postgresql_outage_is_one_line_when_it_starts_and_one_when_it_ends(
        collector_factory, postgres_server, postgres_url) -> None:
    collector = collector_factory(db=postgres_url)
    postgres_server.stop()
    try:
        for _ in range(3):
            began = time.monotonic()
            answer = requests.get(collector.url + "/readyz", timeout=30)
            took = time.monotonic() - began
            assert answer.status_code == 503 and took < 2.5, (answer.status_code, took)
            message = answer.json()["error"]["message"]
            assert message.count("postgresql://") == 1, message
        time.sleep(2)  # the pool keeps retrying meanwhile: attempts the log only counts
    finally:
        postgres_server.start()
    deadline = time.monotonic() + 30
    while requests.get(collector.url + "/readyz", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the collector did not become ready again"
        time.sleep(0.2)
    collector.stop()
    lines = log_lines(collector)
    assert not [line for line in lines if "psycopg" in line or line.startswith(("\t", " "))], \
        lines
    down = [line for line in lines if "PostgreSQL is unreachable" in line]
    back = [line for line in lines if "PostgreSQL is reachable again" in line]
    assert len(down) == 1 and len(back) == 1, lines
    assert "WARNING veil.server.storage[" in down[0] and "(Connection refused)" in down[0]
    assert "failed connection attempt" in back[0]


def test_every_log_record_is_one_line_without_a_doubled_period() -> None:
    stream = io.StringIO()
    configure_logging("text", "info", stream)
    try:
        logging.getLogger("veil.test").warning(
            "upload refused: %s (%s).", "connection failed: refused\n\tIs the server running?",
            "database is locked.")
        logging.getLogger("veil.test").warning("cannot store: %s.", "database is locked.")
        logging.getLogger("veil.test").info("kept as written: ../path and wait...")
    finally:
        logging.getLogger().handlers.clear()
    first, locked, kept = stream.getvalue().splitlines()
    assert first.endswith("upload refused: connection failed: refused Is the server running? "
                          "(database is locked.).")
    assert locked.endswith("cannot store: database is locked.")
    assert kept.endswith("kept as written: ../path and wait...")
    assert one_line("the reason.. next") == "the reason. next"
