"""Issue 16, D6: losing the client's state database while its secret stays.

Before the fix a new ``veil.db`` beside the old ``secret`` drew a new random
cohort seed, so a value reported again got a new, independent permanent
response, and the ledger started again from zero: with ``budget=6`` the true
worst case reached ``2 * 4.39 = 8.79`` while the ledger showed 4.39. Now the
cohort derives from the secret, and a lost ledger is accounted conservatively:
the unknown spend before the loss counts as the whole budget (``inf`` without
one), and each value's first report after it costs ``epsilon_inf``.

The *true* worst case is computed from what left the device, observed through
a transport: reports of one value in one cohort under one parameter set share
one permanent response (the PRR stream is keyed by the secret, the cohort and
the value), so each such group costs ``epsilon_1`` if it holds one report and
``epsilon_inf`` otherwise, and groups add up (the accounting rule of
``docs/privacy.md``, applied to the reports themselves rather than to the ledger).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from veil.client import BudgetExceededError, Client
from veil.client.state_dir import DATABASE_FILE, SECRET_FILE
from veil.shared.registry import Registry

#: RAPPOR's default string parameters: epsilon_1 = 1.0743, epsilon_inf = 4 ln 3 = 4.3944
REGISTRY = Registry.from_dict({"metrics": {"homepage": {"kind": "string"}}})
HOME = REGISTRY["homepage"].params
BUDGET = 6.0


def true_worst_case(sent: list[tuple[str, dict[str, Any]]]) -> float:
    """Worst-case epsilon of the reports that left the device, from their permanent responses.

    ``sent`` pairs each report with the raw value the test reported; one
    permanent response per (metric, parameters, cohort, value).
    """
    groups = Counter(
        (report["metric"], report["params"], report.get("cohort"), value) for value, report in sent
    )
    params = {m.params.fingerprint: m.params for m in REGISTRY.values()}
    return sum(
        params[fp].epsilon_inf if n > 1 else params[fp].epsilon_1
        for (_, fp, _, _), n in groups.items()
    )


def lose_database(state: Path) -> None:
    """Delete the state database (WAL and index too); the secret stays."""
    for suffix in ("", "-wal", "-shm"):
        (state / f"{DATABASE_FILE}{suffix}").unlink(missing_ok=True)
    assert (state / SECRET_FILE).exists()


def report_twice(client: Client, value: str, transport: Any,
                 sent: list[tuple[str, dict[str, Any]]]) -> None:
    """Report ``value`` twice (a refusal by the budget is allowed), upload, note what left."""
    for _ in range(2):
        with contextlib.suppress(BudgetExceededError):
            client.report("homepage", value)
    before = len(transport.reports)
    assert client.flush().ok
    sent.extend((value, report) for report in transport.reports[before:])


@pytest.mark.parametrize("value_after", ["example.com", "other.org"])
def test_losing_the_database_never_lets_the_true_spend_exceed_the_ledger_or_budget(
    tmp_path, offline_url, recording_transport, value_after
):
    """The issue's case (the same value again) and the one a per-value rule alone misses
    (another value: its spend adds to the forgotten one)."""
    state, transport = tmp_path / "state", recording_transport
    sent: list[tuple[str, dict[str, Any]]] = []
    with Client(offline_url, state, registry=REGISTRY, budget=BUDGET, transport=transport) as first:
        report_twice(first, "example.com", transport, sent)
        seed = first.cohort_seed
        assert math.isclose(first.privacy_spent().total, HOME.epsilon_inf, rel_tol=1e-9)
    lose_database(state)
    with Client(offline_url, state, registry=REGISTRY, budget=BUDGET, transport=transport) as again:
        report_twice(again, value_after, transport, sent)
        spent = again.privacy_spent()
    truth = true_worst_case(sent)
    assert spent.total >= truth, f"ledger states {spent.total:.4f}, true worst case {truth:.4f}"
    assert truth <= BUDGET, f"true worst case {truth:.4f} exceeds the budget {BUDGET}"
    assert spent.lost == BUDGET and spent.remaining == 0.0
    assert again.cohort_seed == seed  # the same cohort: the same permanent responses


def test_without_a_budget_the_lost_spend_is_unbounded_and_first_reports_cost_epsilon_inf(
    tmp_path, offline_url, recording_transport
):
    state, transport = tmp_path / "state", recording_transport
    sent: list[tuple[str, dict[str, Any]]] = []
    with Client(offline_url, state, registry=REGISTRY, transport=transport) as first:
        first.report("homepage", "example.com")  # once: epsilon_1 before the loss
        assert first.flush().ok
        sent.extend(("example.com", report) for report in transport.reports)
    lose_database(state)
    with Client(offline_url, state, registry=REGISTRY, transport=transport) as again:
        again.report("homepage", "example.com")  # once more: two reports of one response
        assert again.flush().ok
        sent.append(("example.com", transport.reports[-1]))
        spent = again.privacy_spent()
        assert spent.lost == math.inf and spent.total == math.inf
        # the value's lifetime cost is epsilon_inf, and the ledger charged exactly that
        assert true_worst_case(sent) == HOME.epsilon_inf
        assert spent.per_metric["homepage"] >= HOME.epsilon_inf
        again.report("homepage", "example.com")  # saturated: costs nothing more
        assert again.privacy_spent().per_metric == spent.per_metric


def test_the_loss_is_logged_once_and_remembered(tmp_path, offline_url, caplog):
    state = tmp_path / "state"
    Client(offline_url, state, registry=REGISTRY).close(timeout=1)
    lose_database(state)
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        Client(offline_url, state, registry=REGISTRY).close(timeout=1)
        Client(offline_url, state, registry=REGISTRY).close(timeout=1)
    lost = [r for r in caplog.records if "ledger of earlier reports was lost" in r.getMessage()]
    assert len(lost) == 1
    with Client(offline_url, state, registry=REGISTRY, budget=BUDGET, strict=True) as client:
        assert client.privacy_spent().lost == BUDGET
        with pytest.raises(BudgetExceededError, match="ledger was lost"):
            client.report("homepage", "example.com")
        assert client.pending == 0


def test_a_new_installation_and_a_lost_secret_are_not_a_lost_ledger(tmp_path, offline_url):
    """A database created before its secret (a fresh start, or a crash between the two) has
    seen every report; a database whose secret was lost keeps its spend (new secret, new
    independent responses: the old spend still counts)."""
    state = tmp_path / "state"
    with Client(offline_url, state, registry=REGISTRY) as client:
        client.report("homepage", "example.com")
        spent = client.privacy_spent()
        assert spent.lost == 0.0
    (state / SECRET_FILE).unlink()
    with Client(offline_url, state, registry=REGISTRY) as client:
        assert client.privacy_spent() == spent


def protocol_cohort_seed(secret: bytes) -> int:
    """docs/protocol.md section 5: the first 8 bytes of the HMAC stream (block 1), purpose
    ``cohort``, empty metric and context, read big-endian."""
    block = hmac.new(secret, (1).to_bytes(4, "big") + b"veil-v1\0cohort\0\0", hashlib.sha256)
    return int.from_bytes(block.digest()[:8], "big")


def test_the_cohort_derives_from_the_secret(tmp_path, offline_url):
    secret = bytes(range(32))
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / SECRET_FILE).write_bytes(secret)
    # a secret without a database looks like a lost ledger; the seed is the same either way
    one = Client(offline_url, tmp_path / "one", registry=REGISTRY)
    two = Client(offline_url, tmp_path / "two", registry=REGISTRY)
    other = Client(offline_url, tmp_path / "three", registry=REGISTRY)
    assert one.cohort_seed == two.cohort_seed == protocol_cohort_seed(secret)
    assert other.cohort_seed == protocol_cohort_seed((tmp_path / "three" / SECRET_FILE).read_bytes())
    assert other.cohort_seed != one.cohort_seed
    for client in (one, two, other):
        client.close(timeout=1)


def test_a_database_from_an_older_sdk_keeps_its_cohort_ledger_and_queue(tmp_path, offline_url):
    """An older SDK stored a random cohort seed and had no ledger record, no row counter and
    no triggers: its installation keeps that cohort (a new one would give every value it
    reported a new, independent permanent response) and its ledger is complete."""
    state = tmp_path / "state"
    with Client(offline_url, state, registry=REGISTRY) as client:
        for value in ("a.example", "b.example", "b.example"):
            client.report("homepage", value)
        spent = client.privacy_spent()
    database = sqlite3.connect(state / DATABASE_FILE)
    with database:
        database.execute("DELETE FROM meta WHERE key = 'ledger'")
        database.execute("UPDATE meta SET value = '1234567' WHERE key = 'cohort_seed'")
        database.execute("DROP TRIGGER outbox_queued")
        database.execute("DROP TRIGGER outbox_unqueued")
        database.execute("DELETE FROM counters WHERE name = 'queued'")
    database.close()
    with Client(offline_url, state, registry=REGISTRY) as client:
        assert client.cohort_seed == 1234567
        assert client.privacy_spent() == spent and spent.lost == 0.0
        assert client.pending == 3
        client.report("homepage", "c.example")
        assert client.pending == 4
