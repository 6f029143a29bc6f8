"""The SDK's joint encoder: a tuple as one cell of the product domain, then the cell oracle.

* **Privacy, exactly.** A joint report of tuple ``t`` is the cell oracle's report of
  ``cell_of(t)``, so the worst case over pairs of tuples is the worst case over pairs of
  cells. For every oracle ``auto`` may choose and boundary domains and epsilons, the stated
  ``epsilon_inf`` and ``epsilon_1`` equal the exact largest log-ratio of the laws
  (built with fractions from the realized numerators, as the oracles' own test does):
  never below it and at most ``1e-9`` (relative) above, so a claim just below fails.
* **Law.** The SDK's reports of the worst-case pair of tuples (two tuples that differ in
  one variable) follow those laws over seeded installations.
* **Memoization** keyed by the joint fingerprint, and **bad tuples** refused naming the
  variable.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tests.client.test_oracle_encoders import (
    assert_law,
    assert_stated,
    exact_epsilon,
    exact_law,
    fresh,
    secrets,
)
from veil.client.encoders import JointEncoder, make_encoder
from veil.client.randomness import HmacStream
from veil.shared.errors import ParameterError
from veil.shared.kinds import JointParams
from veil.shared.registry import Metric, Registry

BROWSERS = ("chrome", "firefox", "safari")


def joint(encoding: str = "auto", epsilon: float = 2.0, report_epsilon: float | None = None,
          domains: tuple = (BROWSERS, "boolean")) -> JointParams:
    names = tuple(f"v{i}" for i in range(len(domains)))
    return JointParams(of=names, domains=domains, epsilon=epsilon, report_epsilon=report_epsilon,
                       encoding=encoding)


PRIVACY_CASES = [
    (encoding, domains, epsilon, report)
    for encoding in ("grr", "oue", "olh", "hadamard")
    for domains in ((("a", "b"), "boolean"), (BROWSERS, "boolean", (0.0, 1.0, 10.0)))
    for epsilon in (0.5, 4.0, 20.0)
    for report in ("equal", "small")
]


@pytest.mark.parametrize(
    ("encoding", "domains", "epsilon", "report"), PRIVACY_CASES,
    ids=[f"{e}-cells{len(d)}-eps{eps:g}-{r}" for e, d, eps, r in PRIVACY_CASES])
def test_stated_epsilons_are_the_exact_worst_case_over_pairs_of_tuples(
        encoding: str, domains: tuple, epsilon: float, report: str) -> None:
    """report "equal": report_epsilon = epsilon; "small": report_epsilon = 0.05."""
    report_epsilon = epsilon if report == "equal" else 0.05
    params = joint(encoding, epsilon, report_epsilon, domains)
    oracle = params.cell_oracle
    assert oracle.d == params.cells == math.prod(params.shape)
    assert_stated(params.epsilon_inf, exact_epsilon(oracle, report=False), epsilon, "epsilon_inf")
    assert_stated(params.epsilon_1, exact_epsilon(oracle, report=True), report_epsilon,
                  "epsilon_1")


def test_auto_chooses_the_lowest_variance_oracle_for_the_product_domain() -> None:
    """GRR while cells < 3 e^eps + 2 (Wang et al.), a hashing or unary oracle beyond."""
    small = joint(epsilon=4.0)  # 6 cells
    large = JointParams(of=("x", "y"), domains=(tuple(f"x{i}" for i in range(30)),
                                                tuple(f"y{i}" for i in range(30))), epsilon=1.0)
    assert small.encoding == "grr"
    assert large.encoding in ("olh", "oue")
    assert "auto chose" in small.choice_note and "6 cells" in small.choice_note


@pytest.mark.parametrize("encoding", ["grr", "oue", "olh", "hadamard"])
def test_reports_of_the_worst_case_pair_follow_the_exact_law(encoding: str) -> None:
    params = joint(encoding, epsilon=1.0)
    metric = Metric("crash_by_browser", params)
    n = 12000
    for value in (("firefox", True), ("firefox", False)):
        cell = params.cell_of(value)
        counts = Counter()
        for i, secret in enumerate(secrets(3, n)):
            encoder = make_encoder(metric, secret, random_bytes=fresh(i))
            counts[params.parse_payload(encoder.encode(dict(zip(params.of, value,
                                                                strict=True))))] += 1
        assert_law(counts, n, exact_law(params.cell_oracle, cell, report=True), f"{value}")


def test_the_permanent_response_is_keyed_by_the_joint_fingerprint() -> None:
    params = joint("grr", epsilon=1.0)
    renamed = JointParams(of=("browser", "crashed"), domains=params.domains, epsilon=1.0,
                          encoding="grr")
    assert renamed.cell_oracle == params.cell_oracle and renamed.fingerprint != params.fingerprint
    secret = b"s" * 32
    encoder = make_encoder(Metric("m", params), secret)
    assert isinstance(encoder, JointEncoder)
    key = encoder.memo_key(("safari", True))
    assert key == b"5"
    # the documented stream: purpose prr, the metric, the joint fingerprint, the cell
    stream = HmacStream(secret, b"prr", "m", params.fingerprint.encode() + b"\0" + key)
    assert encoder.cells.prr_stream(key).read(32) == stream.read(32)
    # memoized: one installation reports one tuple's permanent response every time
    assert len({encoder.memoized(key) for _ in range(5)}) == 1
    # other parameters under the same name draw independent responses: over installations
    # the two permanent responses agree only as often as independent draws would
    same = sum(make_encoder(Metric("m", params), s).memoized(key)
               == make_encoder(Metric("m", renamed), s).memoized(key) for s in secrets(9, 4000))
    own = params.cell_oracle.prr_numerator / 2**32
    # two independent GRR permanent responses of one cell agree w.p. a^2 + (1-a)^2/(d-1);
    # within 5 binomial standard errors over the 4000 installations
    agree = own**2 + (1 - own) ** 2 / (params.cells - 1)
    assert abs(same / 4000 - agree) <= 5 * math.sqrt(agree * (1 - agree) / 4000), (same, agree)


@pytest.mark.parametrize(("value", "field", "message"), [
    ({"v0": "opera", "v1": True}, "value.v0",
     r"^v0 is not one of its 3 values \('chrome', 'firefox', 'safari'\)$"),
    ({"v0": 3, "v1": True}, "value.v0", r"^v0 must be a str, one of its 3 values .*; got int$"),
    ({"v0": "chrome", "v1": 1}, "value.v1", r"^v1 must be True or False; got int$"),
    ({"v0": "chrome"}, "value.v1", "misses 'v1'"),
    ({"v0": "chrome", "v1": True, "v9": 3}, "value", "^has 1 key that names no variable: "),
    ("chrome", "value", "must be a dict of 'v0', 'v1' .*; got str$"),
    (("chrome", True, 3), "value", "must be a dict .*; got tuple of 3 values$"),
])
def test_a_bad_tuple_is_refused_naming_the_variable(value, field, message) -> None:
    encoder = make_encoder(Metric("m", joint()), b"s" * 32)
    with pytest.raises(ParameterError, match=message) as caught:
        encoder.memo_key(value)
    assert caught.value.field == field


def test_a_bucketed_number_clips_and_refuses_non_finite_values() -> None:
    params = joint(domains=(BROWSERS, (0.0, 1.0, 2.5, 10.0)))
    assert [params.cell_of(("chrome", x)) for x in (-5, 0.0, 0.99, 1.0, 2.5, 10.0, 99)] == [
        0, 0, 0, 1, 2, 2, 2]
    assert params.variables[1].labels == ("[0, 1)", "[1, 2.5)", "[2.5, 10]")
    with pytest.raises(ParameterError, match="must be a finite number"):
        params.cell_of(("chrome", float("nan")))


@pytest.mark.parametrize(("table", "field", "message"), [
    ('of = ["a", "b"]\ndomains = [["x", "y"], "string"]', "metrics.j.domains[1]",
     "string over an open dictionary"),
    ('of = ["a"]\ndomains = [["x", "y"]]', "metrics.j.of", "2 to 8 distinct"),
    ('of = ["a", "b"]\ndomains = [["x", "y"]]', "metrics.j.domains", "one domain per variable"),
    ('of = ["a", "b"]\ndomains = [["x", "x"], "boolean"]', "metrics.j.domains[0]", "distinct"),
    ('of = ["a", "b"]\ndomains = [[3, 1], "boolean"]', "metrics.j.domains[0]", "increasing"),
    ('of = ["nope", "crashed"]', "metrics.j.of[0]", "names no metric"),
    ('of = ["load", "crashed"]', "metrics.j.of[0]", "number metric"),
    ('of = ["a", "b"]\ndomains = [["x", "y"], "boolean"]\nencoding = "rappor"',
     "metrics.j.encoding", "must be one of"),
    ('of = ["a", "b"]\ndomains = [["x", "y"], "boolean"]\nencoding = "grr"\ng = 5',
     "metrics.j.g", "'olh' only"),
])
def test_a_bad_declaration_is_refused_naming_the_field(table: str, field: str,
                                                       message: str) -> None:
    toml = ('[metrics.crashed]\nkind = "boolean"\n[metrics.load]\nkind = "number"\n'
            f'[metrics.j]\nkind = "joint"\n{table}\n')
    with pytest.raises(ParameterError, match=message) as caught:
        Registry.from_toml(toml)
    assert caught.value.field == field


def test_of_names_metrics_whose_domains_the_registry_fills_in() -> None:
    registry = Registry.from_toml(
        '[metrics.browser]\nkind = "category"\ncategories = ["chrome", "firefox"]\n'
        '[metrics.crashed]\nkind = "boolean"\n'
        '[metrics.crash_by_browser]\nkind = "joint"\nof = ["browser", "crashed"]\n'
        'epsilon = 4.0\n')
    params = registry["crash_by_browser"].params
    assert isinstance(params, JointParams)
    assert params.domains == (("chrome", "firefox"), "boolean")
    assert Registry.from_toml(registry.to_toml()) == registry
    assert Registry.from_dict(registry.to_dict(), lenient=True) == registry
    # a joint metric is a mechanism of its own: sequential composition with the others
    total = sum(metric.params.epsilon_inf for metric in registry.values())
    assert registry.epsilon_total() == pytest.approx(total)
