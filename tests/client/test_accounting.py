"""privacy_spent() and the budget: the worst-case epsilon of what this installation reported.

Expected values are built from the parameters' own epsilon_1 / epsilon_inf with
the accounting rule: per metric, the sum over distinct memo keys of epsilon_1
(reported once) or epsilon_inf (reported more than once); in total, the
sequential composition (sum) over metrics.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from fractions import Fraction

import pytest

from veil.client import BudgetExceededError, Client, accounting
from veil.client.accounting import PrivacyLedger, worst_cost
from veil.client.encoders import make_encoder
from veil.client.randomness import STREAM_LAYOUT, HmacStream
from veil.client.state_dir import DATABASE_FILE, open_state, transaction
from veil.shared.bits import realize
from veil.shared.registry import Registry

REGISTRY = Registry.from_dict({"metrics": {
    "homepage": {"kind": "string", "k": 32, "h": 2, "m": 4},
    "dark_mode": {"kind": "boolean"},
    "browser": {"kind": "category", "categories": ["firefox", "chrome", "safari"]},
    "load_time": {"kind": "number", "low": 0.0, "high": 10.0, "resolution": 10},
}})
HOME = REGISTRY["homepage"].params
DARK = REGISTRY["dark_mode"].params
LOAD = REGISTRY["load_time"].params


def close_to(got: float, want: float) -> bool:
    """Never below the expected cost, and above it only by rounding.

    Stated costs are rounded up (veil.shared.privacy.round_up: a relative 1e-12
    per composition), so a few compositions stay far within 1e-10.
    """
    return got >= want * (1 - 1e-15) and math.isclose(got, want, rel_tol=1e-10)


@pytest.fixture
def client(tmp_path, offline_url):
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY)
    yield client
    client.close(timeout=1)


def test_nothing_reported_costs_nothing(client):
    spent = client.privacy_spent()
    assert spent.per_metric == {} and spent.total == 0.0
    assert spent.budget is None and spent.remaining is None


def test_a_value_costs_epsilon_1_once_then_epsilon_inf_however_often(client):
    client.report("homepage", "example.com")
    assert close_to(client.privacy_spent().per_metric["homepage"], HOME.epsilon_1)
    for _ in range(5):
        client.report("homepage", "example.com")
        assert close_to(client.privacy_spent().per_metric["homepage"], HOME.epsilon_inf)
    client.report("homepage", "other.org")
    assert close_to(client.privacy_spent().per_metric["homepage"],
                    HOME.epsilon_inf + HOME.epsilon_1)


def test_total_is_the_sum_over_metrics_and_survives_restart(tmp_path, offline_url):
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY)
    client.report("homepage", "example.com")
    client.report("dark_mode", True)
    client.report("dark_mode", True)
    client.report("dark_mode", False)
    client.report("load_time", 3.0)  # on the grid: one key
    client.report("load_time", 3.0)
    spent = client.privacy_spent()
    client.close(timeout=1)
    expected = {
        "dark_mode": DARK.epsilon_inf + DARK.epsilon_1,
        "homepage": HOME.epsilon_1,
        "load_time": LOAD.epsilon_inf,
    }
    assert sorted(spent.per_metric) == sorted(expected)
    for name, value in expected.items():
        assert close_to(spent.per_metric[name], value)
    assert close_to(spent.total, math.fsum(expected.values()))
    with Client(offline_url, tmp_path / "state", registry=REGISTRY) as again:
        assert again.privacy_spent() == spent


def test_numbers_are_accounted_per_grid_point(client):
    """Values that round to the same grid point share a memoized response and a key."""
    client.report("load_time", 2.0)
    client.report("load_time", 2.0 + 1e-12)  # the same grid point (step 1.0): alpha rounding
    assert close_to(client.privacy_spent().per_metric["load_time"], LOAD.epsilon_inf)


def test_two_clients_on_one_state_directory_share_the_ledger(tmp_path, offline_url):
    """The ledger is read and written in the database transaction, not cached per process."""
    first = Client(offline_url, tmp_path / "state", registry=REGISTRY)
    second = Client(offline_url, tmp_path / "state", registry=REGISTRY)
    first.report("homepage", "example.com")
    second.report("homepage", "example.com")
    for client in (first, second):
        assert close_to(client.privacy_spent().per_metric["homepage"], HOME.epsilon_inf)
        client.close(timeout=1)


def test_changed_parameters_add_up(tmp_path, offline_url):
    """Reports under old and new parameters are different mechanisms: sequential composition."""
    state = tmp_path / "state"
    with Client(offline_url, state, registry=REGISTRY) as client:
        client.report("homepage", "example.com")
    changed = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": 32, "h": 2, "m": 4, "f": 0.25},
    }})
    with Client(offline_url, state, registry=changed) as client:
        client.report("homepage", "example.com")
        got = client.privacy_spent().per_metric["homepage"]
    assert close_to(got, HOME.epsilon_1 + changed["homepage"].params.epsilon_1)


def test_budget_refuses_a_report_that_would_exceed_it_and_queues_nothing(tmp_path, offline_url):
    budget = HOME.epsilon_1 + DARK.epsilon_1 * 0.5
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY, budget=budget,
                    strict=True)
    client.report("homepage", "example.com")
    before = client.privacy_spent()
    assert before.budget == budget and close_to(before.remaining, budget - HOME.epsilon_1)
    with pytest.raises(BudgetExceededError, match="budget") as raised:
        client.report("homepage", "example.com")  # would cost epsilon_inf
    assert raised.value.metric == "homepage" and raised.value.would_be > budget
    with pytest.raises(BudgetExceededError):
        client.report("dark_mode", True)
    assert client.pending == 1
    assert client.privacy_spent() == before
    client.close(timeout=1)


def test_a_mechanism_without_a_longitudinal_bound_costs_epsilon_1_once_then_inf(
    tmp_path, offline_url
):
    """f = 0 (no permanent randomization): one report is still epsilon_1, two reveal the value."""
    unbounded = Registry.from_dict({"metrics": {
        "homepage": {"kind": "string", "k": 32, "h": 2, "m": 4, "f": 0.0},
    }})
    params = unbounded["homepage"].params
    assert math.isinf(params.epsilon_inf) and math.isfinite(params.epsilon_1)
    with Client(offline_url, tmp_path / "state", registry=unbounded, budget=100.0,
                max_epsilon_per_value=None, strict=True) as client:
        client.report("homepage", "example.com")
        assert close_to(client.privacy_spent().total, params.epsilon_1)
        with pytest.raises(BudgetExceededError):
            client.report("homepage", "example.com")
        assert client.pending == 1


def test_budget_exactly_reachable(tmp_path, offline_url):
    """A budget equal to what two reports are charged (the worst case, one value twice:
    epsilon_inf) queues them, and refuses a third, which could carry a new value."""
    budget = HOME.epsilon_inf
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY, budget=budget)
    for _ in range(3):
        client.report("homepage", "example.com")
    spent = client.privacy_spent()
    assert (client.pending, client.drops["budget"]) == (2, 1)
    assert spent.total <= spent.charged <= budget
    client.close(timeout=1)


GAUSSIAN = Registry.from_dict({"metrics": {
    "latency": {"kind": "number", "low": 0.0, "high": 10.0, "resolution": 10,
                "mechanism": "gaussian", "epsilon": 1.0, "delta": 1e-6},
    "dark_mode": {"kind": "boolean"},
}})


def test_gaussian_numbers_state_their_delta_per_grid_point(tmp_path, offline_url):
    """Each grid point a Gaussian metric reports is one (epsilon, delta) release (its noise
    is memoized): 0, 5, 5 and 10 are three, so delta is 3e-6, never below; other kinds add
    none. After a lost ledger what was reported before is unknown: delta is inf."""
    state = tmp_path / "state"
    with Client(offline_url, state, registry=GAUSSIAN) as client:
        client.report("dark_mode", True)
        assert client.privacy_spent().delta == 0.0
        for value in (0.0, 5.0, 5.0, 10.0):
            client.report("latency", value)
        spent = client.privacy_spent()
    assert spent.delta >= 3e-6 and spent.delta == pytest.approx(3e-6, rel=1e-12)
    assert close_to(spent.total, 3 * GAUSSIAN["latency"].params.epsilon_inf + DARK.epsilon_1)
    for suffix in ("", "-wal", "-shm"):  # the secret stays: the ledger is lost
        (state / f"{DATABASE_FILE}{suffix}").unlink(missing_ok=True)
    with Client(offline_url, state, registry=GAUSSIAN) as client:
        client.report("dark_mode", True)
        assert client.privacy_spent().delta == 0.0
        client.report("latency", 5.0)
        assert math.isinf(client.privacy_spent().delta)


def test_after_a_lost_ledger_the_budget_is_charged_at_least_the_total(tmp_path, offline_url):
    """After the ledger is lost, each value's first report is spent at epsilon_inf (it may
    repeat one reported before); the budget's charge priced them at epsilon_1 and stated
    less than the total (13.5 against 21.2 for three strings)."""
    state = tmp_path / "state"
    with Client(offline_url, state, registry=REGISTRY) as client:
        client.report("homepage", "a.example")
    for suffix in ("", "-wal", "-shm"):  # the secret stays: the ledger is lost
        (state / f"{DATABASE_FILE}{suffix}").unlink(missing_ok=True)
    with Client(offline_url, state, registry=REGISTRY) as client:
        for value in ("b.example", "c.example", "d.example"):
            client.report("homepage", value)
    with Client(offline_url, state, registry=REGISTRY, budget=8.0) as client:
        spent = client.privacy_spent()
    assert math.isinf(spent.total) is False and spent.lost == 8.0
    assert spent.charged >= spent.total
    assert close_to(spent.charged, 8.0 + 3 * HOME.epsilon_inf)


def test_keys_reported_twice_are_remembered_in_a_bounded_cache(tmp_path, offline_url,
                                                                  monkeypatch):
    """The keys known to be reported twice are a cache of the ledger: at its size it is
    forgotten, and a forgotten key's next report is priced from the ledger, costing nothing
    more (each distinct repeated value stayed in memory for good)."""
    monkeypatch.setattr(accounting, "SATURATED_CACHE_SIZE", 8)
    with Client(offline_url, tmp_path / "state", registry=REGISTRY) as client:
        for _ in range(3):
            for index in range(20):
                client.report("homepage", f"site{index}.example")
        spent = client.privacy_spent()
        assert len(client._recorder.ledger._saturated) <= 8
        assert close_to(spent.per_metric["homepage"], 20 * HOME.epsilon_inf)
        for index in range(20):
            client.report("homepage", f"site{index}.example")
        assert client.privacy_spent().per_metric == spent.per_metric


def most_reports(budget: float, params) -> int:
    """How many reports of a string metric (no bound on its values) a budget admits, from
    the ledger's rule by hand: the worst case of n reports is floor(n/2) values twice and
    one once (epsilon_inf >= 2 epsilon_1), or n values once."""
    e1, einf = params.epsilon_1, params.epsilon_inf
    n = 0
    while (((n + 1) // 2) * einf + ((n + 1) % 2) * e1 if einf >= 2 * e1 else (n + 1) * e1) \
            <= budget:
        n += 1
    return n


def test_a_budget_queues_by_the_number_of_reports_never_by_their_values(tmp_path, offline_url):
    """The collector sees which reports arrive. Refusing by the ledger's spend made that
    depend on the values: with a budget of 5, A, B, A queued 2 reports and A, B, C 3. Every
    sequence of values now queues the same number, that of the worst case."""
    sequences = [["a", "b", "a", "a", "a", "a"], ["a", "b", "c", "d", "e", "f"], ["a"] * 6,
                 ["a", "a", "b", "b", "c", "c"]]
    outcomes = []
    for index, values in enumerate(sequences):
        with Client(offline_url, tmp_path / f"state{index}", registry=REGISTRY,
                    budget=5.0) as client:
            for value in values:
                client.report("homepage", value)
            spent = client.privacy_spent()
            outcomes.append((client.pending, client.drops["budget"]))
        assert spent.total <= spent.charged <= 5.0
    want = most_reports(5.0, HOME)
    assert 0 < want < 6
    assert outcomes == [(want, 6 - want)] * len(sequences)


def test_a_budget_charges_a_boolean_at_most_both_values_twice(tmp_path, offline_url):
    """A metric of few values costs at most epsilon_inf per value however often it is
    reported: a budget of twice that queues every report of a boolean."""
    budget = 2 * DARK.epsilon_inf * (1 + 1e-9)
    with Client(offline_url, tmp_path / "state", registry=REGISTRY, budget=budget,
                strict=True) as client:
        for index in range(40):
            client.report("dark_mode", index % 3 == 0)
        spent = client.privacy_spent()
        assert client.pending == 40
        assert close_to(spent.charged, 2 * DARK.epsilon_inf)
        assert close_to(spent.total, 2 * DARK.epsilon_inf)


@pytest.mark.parametrize(("epsilon_1", "epsilon_inf"),
                         [(1.0, 3.0), (1.0, 2.0), (1.0, 1.5), (1.0, 1.0), (0.5, math.inf),
                          (2.0, 1.0)])
def test_worst_cost_is_the_most_any_sequence_of_values_costs(epsilon_1, epsilon_inf):
    """Against every sequence of values, priced by the ledger's rule (a key reported once
    costs min(epsilon_1, epsilon_inf), more than once epsilon_inf)."""
    def price(sequence: tuple[int, ...]) -> Fraction | float:
        terms = [min(epsilon_1, epsilon_inf) if sequence.count(key) == 1 else epsilon_inf
                 for key in set(sequence)]
        return math.inf if math.inf in terms else sum(map(Fraction, terms), Fraction(0))

    for keys in (1, 2, 3, None):
        for reports in range(6):
            domain = range(reports if keys is None else keys)
            costs = [price(sequence) for sequence in itertools.product(domain, repeat=reports)]
            assert worst_cost(epsilon_1, epsilon_inf, reports, keys) == max(costs, default=0), \
                (keys, reports)
    assert worst_cost(1.0, 3.0, None, 4) == 12 and math.isinf(worst_cost(1.0, 3.0, None, None))


def test_ledger_stores_only_digests(client, tmp_path):
    client.report("homepage", "ledger-canary.example")
    database = sqlite3.connect(tmp_path / "state" / DATABASE_FILE)
    rows = database.execute("SELECT digest, metric, reports FROM ledger").fetchall()
    database.close()
    assert len(rows) == 1
    digest, metric, reports = rows[0]
    assert metric == "homepage" and reports == 1
    assert isinstance(digest, bytes) and len(digest) == 32 and b"canary" not in digest


# --- stream layouts: parameter sets reported under an SDK of layout 1 ---------------------

def flag(alpha: float) -> Registry:
    return Registry.from_dict({"metrics": {"flag": {"kind": "boolean", "alpha": alpha}}})


def colour(epsilon: float) -> Registry:
    return Registry.from_dict({"metrics": {"colour": {
        "kind": "category", "oracle": "grr", "categories": ["red", "green"],
        "epsilon": epsilon}}})


def as_layout_1_database(state) -> None:
    """Make the state database what an SDK of stream layout 1 left: schema version 1, no
    ``layout`` column (every parameter set in it was reported under layout 1)."""
    database = sqlite3.connect(state / DATABASE_FILE)
    with database:
        database.execute("ALTER TABLE mechanisms DROP COLUMN layout")
        database.execute("ALTER TABLE mechanisms DROP COLUMN reports")
        database.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    database.close()


def as_schema_2_database(state) -> None:
    """Make the state database what an SDK of schema version 2 left: no ``reports`` column
    (it did not count the reports of each parameter set)."""
    database = sqlite3.connect(state / DATABASE_FILE)
    with database:
        database.execute("ALTER TABLE mechanisms DROP COLUMN reports")
        database.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    database.close()


def test_reports_an_earlier_sdk_did_not_count_are_charged_as_any_number(tmp_path, offline_url):
    """How many reports a schema 2 database's parameter sets sent is unknown: a budget charges
    them as any number, both values of a boolean twice (so a boolean goes on reporting) and
    no bound for a string (every further report is refused); the ledger's spend stays."""
    booleans, strings = tmp_path / "booleans", tmp_path / "strings"
    report_once(booleans, offline_url, REGISTRY, "dark_mode", True)
    report_once(strings, offline_url, REGISTRY, "homepage", "example.com")
    for state in (booleans, strings):
        as_schema_2_database(state)
    budget = 2 * DARK.epsilon_inf * (1 + 1e-9)
    with Client(offline_url, booleans, registry=REGISTRY, budget=budget, strict=True) as client:
        for value in (True, False, False):
            client.report("dark_mode", value)
        spent = client.privacy_spent()
        assert close_to(spent.charged, 2 * DARK.epsilon_inf)
        assert close_to(spent.total, DARK.epsilon_inf + DARK.epsilon_inf)
    with Client(offline_url, strings, registry=REGISTRY, budget=100.0, strict=True) as client:
        assert math.isinf(client.privacy_spent().charged)
        assert close_to(client.privacy_spent().total, HOME.epsilon_1)
        with pytest.raises(BudgetExceededError):
            client.report("dark_mode", True)
    database = sqlite3.connect(strings / DATABASE_FILE)
    assert database.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
        == ("3",)
    database.close()


def report_once(state, offline_url, registry: Registry, metric: str, value) -> None:
    with Client(offline_url, state, registry=registry) as client:
        client.report(metric, value)


def test_changed_parameters_draw_new_streams_and_add_up(tmp_path, offline_url):
    """Each parameter set of a name is its own mechanism, with its own stream (layout 2)."""
    state = tmp_path / "state"
    for alpha in (0.5, 0.6):
        report_once(state, offline_url, flag(alpha), "flag", False)
    with Client(offline_url, state, registry=flag(0.6)) as client:
        spent = client.privacy_spent()
    both = flag(0.5)["flag"].params.epsilon_1 + flag(0.6)["flag"].params.epsilon_1
    assert close_to(spent.per_metric["flag"], both) and close_to(spent.total, both)
    database = sqlite3.connect(state / DATABASE_FILE)
    layouts = [layout for (layout,) in database.execute("SELECT layout FROM mechanisms")]
    database.close()
    assert layouts == [STREAM_LAYOUT, STREAM_LAYOUT]


def test_a_layout_1_database_keeps_its_parameter_sets_responses(tmp_path, offline_url):
    """After the upgrade, a parameter set reported under layout 1 keeps layout 1 (its memoized
    responses stay the same: no new draw to pay for), a new parameter set gets layout 2."""
    state = tmp_path / "state"
    report_once(state, offline_url, flag(0.5), "flag", True)
    as_layout_1_database(state)
    connection, secret = open_state(state)
    try:
        ledger = PrivacyLedger(connection, secret, None)
        old, new = flag(0.5)["flag"], flag(0.6)["flag"]
        assert ledger.stream_layout(old) == 1 and ledger.stream_layout(new) == STREAM_LAYOUT
        kept = make_encoder(old, secret, layout=ledger.stream_layout(old))
        stream = HmacStream(secret, b"rr", "flag", b"\x01")  # layout 1: no fingerprint
        truthful = stream.u32() < realize(0.5)
        assert kept.encode(True) == (1 if truthful else int(stream.u32() < realize(0.5)))
        # one layout 1 parameter set: its cost is the ledger's rule, and the new one adds up
        with transaction(connection):
            charge = ledger.charge(new, b"\x01")
            assert charge is not None
            ledger.write(charge)
        spent = ledger.spent()
    finally:
        connection.close()
    assert close_to(spent.per_metric["flag"], old.params.epsilon_1 + new.params.epsilon_1)
    with Client(offline_url, state, registry=flag(0.6)) as client:
        assert client.privacy_spent() == spent


def test_two_layout_1_parameter_sets_of_one_name_cost_inf(tmp_path, offline_url):
    """An SDK of layout 1 gave both parameter sets one stream: their joint cost has no bound,
    and a budget refuses every further report."""
    state = tmp_path / "state"
    for alpha in (0.5, 0.6):
        report_once(state, offline_url, flag(alpha), "flag", False)
    report_once(state, offline_url, REGISTRY, "dark_mode", True)
    as_layout_1_database(state)
    with Client(offline_url, state, registry=flag(0.6)) as client:
        spent = client.privacy_spent()
    assert math.isinf(spent.per_metric["flag"]) and math.isinf(spent.total)
    assert close_to(spent.per_metric["dark_mode"], DARK.epsilon_1)
    client = Client(offline_url, state, registry=REGISTRY, budget=100.0, strict=True)
    with pytest.raises(BudgetExceededError):
        client.report("dark_mode", False)
    client.close(timeout=1)


def test_two_layout_1_oracle_parameter_sets_still_add_up(tmp_path, offline_url):
    """The oracles' streams carried the fingerprint in layout 1 already: independent."""
    state = tmp_path / "state"
    for epsilon in (1.0, 2.0):
        report_once(state, offline_url, colour(epsilon), "colour", "red")
    as_layout_1_database(state)
    with Client(offline_url, state, registry=colour(2.0)) as client:
        got = client.privacy_spent().per_metric["colour"]
    assert close_to(got, colour(1.0)["colour"].params.epsilon_1
                    + colour(2.0)["colour"].params.epsilon_1)


def test_an_upgraded_client_reports_a_layout_1_parameter_set_with_its_old_responses(
        tmp_path, offline_url):
    """The client makes its encoders with the ledger's layout: after the upgrade, a parameter
    set reported under layout 1 goes out with the layout 1 response (no second draw for an
    observer to compare), a new parameter set with the layout 2 one."""
    numbers = {"metrics": {"load": {"kind": "number", "low": 0.0, "high": 10.0,
                                    "resolution": 100, "epsilon": 1.0}}}
    registry = Registry.from_dict(numbers)
    state = tmp_path / "state"
    report_once(state, offline_url, registry, "load", 5.0)
    as_layout_1_database(state)
    connection, secret = open_state(state)
    connection.close()
    spec, values = registry["load"], [1.0, 2.0, 3.0, 4.0, 5.0]
    old = [make_encoder(spec, secret, layout=1).encode(value) for value in values]
    new = [make_encoder(spec, secret, layout=STREAM_LAYOUT).encode(value) for value in values]
    # five independent discrete Laplace draws of scale 100 grid steps agree each with
    # probability under 1%: the two layouts' lists differ but for a 1e-10 chance
    assert old != new
    with Client(offline_url, state, registry=registry) as client:
        for value in values:
            client.report("load", value)
    database = sqlite3.connect(state / DATABASE_FILE)
    bodies = [json.loads(body) for (body,) in database.execute(
        "SELECT body FROM outbox ORDER BY seq")]
    database.close()
    assert [body["payload"] for body in bodies][-len(values):] == old
