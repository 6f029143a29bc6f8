"""Issue 25, item 1: two parameter sets under one metric name must not leak the value.

A collector may declare a metric anew with other parameters (a hostile one at
will; an honest one by moving to a new store with an edited registry). Before
the fix, strings, RAPPOR categories, booleans and numbers keyed their memoized
responses by the metric name alone, so one installation's answers under the two
parameter sets came from one stream and were correlated: booleans at alpha 0.5
and then 0.6 never answered (0, 1) for False, Laplace noise at epsilon 1 and
then 2 was exactly halved (the value is ``2 r2 - r1``), and RAPPOR bits under
``f`` 0.5 and then 0.75 never went from 1 to 0. The ledger added the two epsilons
up, a bound that only holds for independent responses.

The attacker's view: one secret per installation (seeded), each installation
encodes one value under parameter set A and then B of one metric name through the
SDK's own encoders, and the collector tabulates the pairs of what it received.
Independent responses make the joint distribution the product of the two
marginals, which the parameters give exactly (realized probabilities
``N / 2**32``). Each cell's count of ``n`` installations is Binomial(``n``, ``pi``)
under independence, so it must lie within ``Z`` standard deviations
``sqrt(n pi (1 - pi))`` of ``n pi`` (Z = 4.5: about 7e-6 two-sided false alarms per
cell). Before the fix every kind has a cell of expected count 270 or more that
held none.

The last test runs the boolean case end to end: real ``veil serve`` processes
declaring the metric with each parameter set, real clients with their own state
directories, and the collectors' SQLite files read as the attacker would.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import sqlite3
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import pytest

from veil.client import Client
from veil.client.encoders import make_encoder
from veil.client.encoders.base import Encoder
from veil.client.state_dir import derived_cohort_seed
from veil.shared.bits import PROB_ONE, realized
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    MechanismParams,
    NumberParams,
    StringParams,
)
from veil.shared.registry import Metric, Registry

Z = 4.5
INSTALLATIONS = 3000
METRIC = "signal"

Marginal = dict[Hashable, float]


@dataclasses.dataclass(frozen=True)
class Case:
    """One kind: two parameter sets, the value, what the attacker reads off a payload, and
    the exact distribution of that reading under one parameter set."""

    a: MechanismParams
    b: MechanismParams
    value: Any
    reading: Callable[[Encoder[Any], Any], Hashable]
    marginal: Callable[[Any], Marginal]


def boolean_marginal(params: BooleanParams, value: bool) -> Marginal:
    alpha, beta = realized(params.alpha), realized(params.beta)
    yes = (1 - alpha) * beta + (alpha if value else 0.0)
    return {0: 1 - yes, 1: yes}


def one_bit_marginal(params: NumberParams) -> Marginal:
    one = params.one_bit_numerator(0) / PROB_ONE  # the value is low: grid point 0
    return {0: 1 - one, 1: one}


def laplace_sign_marginal(params: NumberParams) -> Marginal:
    """Sign of discrete Laplace noise, P(z) = (1 - r)/(1 + r) r^|z|, r = exp(-epsilon/res)."""
    r = math.exp(-params.epsilon / params.resolution)
    return {-1: r / (1 + r), 0: (1 - r) / (1 + r), 1: r / (1 + r)}


def laplace_sign(encoder: Encoder[Any], payload: float) -> int:
    params = encoder.params
    noise = round((payload - 2.0) / params.step)  # the value 2.0 is grid point 2 exactly
    return (noise > 0) - (noise < 0)


def rappor_marginal(params: StringParams | CategoryParams) -> Marginal:
    """(a bit set before the PRR, a bit clear before it): 1 w.p. 1 - f/2 and f/2, apart."""
    half = realized(params.f) / 2
    own, other = {1: 1 - half, 0: half}, {1: half, 0: 1 - half}
    return {(x, y): own[x] * other[y] for x in (0, 1) for y in (0, 1)}


def rappor_bits(payload: str, own: int, other: int) -> tuple[int, int]:
    bits = int.from_bytes(bytes.fromhex(payload), "little")
    return (bits >> own) & 1, (bits >> other) & 1


def string_bits(encoder: Encoder[Any], payload: str) -> tuple[int, int]:
    bloom = encoder.bloom(b"example.com")  # type: ignore[attr-defined]
    own = (bloom & -bloom).bit_length() - 1
    other = (~bloom & (bloom + 1)).bit_length() - 1  # the lowest clear bit
    return rappor_bits(payload, own, other)


COLOURS = ["red", "green", "blue", "cyan"]
# q = 1, p = 0: the report is the permanent response (what a hostile collector may ask for)
RAPPOR = {"p": 0.0, "q": 1.0}
CASES = {
    "boolean-true": Case(BooleanParams(alpha=0.5), BooleanParams(alpha=0.6), True,
                         lambda e, payload: payload,
                         lambda params: boolean_marginal(params, True)),
    "boolean-false": Case(BooleanParams(alpha=0.5), BooleanParams(alpha=0.6), False,
                          lambda e, payload: payload,
                          lambda params: boolean_marginal(params, False)),
    "laplace": Case(NumberParams(low=0.0, high=4.0, resolution=4, epsilon=1.0),
                    NumberParams(low=0.0, high=4.0, resolution=4, epsilon=2.0), 2.0,
                    laplace_sign, laplace_sign_marginal),
    "1bitmean": Case(NumberParams(low=0.0, high=4.0, mechanism="1bitmean", epsilon=1.0),
                     NumberParams(low=0.0, high=4.0, mechanism="1bitmean", epsilon=2.0), 0.0,
                     lambda e, payload: payload, one_bit_marginal),
    "rappor-category": Case(CategoryParams(categories=COLOURS, f=0.5, **RAPPOR),
                            CategoryParams(categories=COLOURS, f=0.75, **RAPPOR), "green",
                            lambda e, payload: rappor_bits(payload, 1, 0), rappor_marginal),
    "string": Case(StringParams(k=32, h=2, m=8, f=0.5, **RAPPOR),
                   StringParams(k=32, h=2, m=8, f=0.75, **RAPPOR), "example.com",
                   string_bits, rappor_marginal),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_installations_answers_under_two_parameter_sets_are_independent(name: str) -> None:
    case = CASES[name]
    assert case.a.fingerprint != case.b.fingerprint
    rnd = random.Random(f"parameter sets {name}")
    pairs: Counter[tuple[Hashable, Hashable]] = Counter()
    for _ in range(INSTALLATIONS):
        secret = rnd.randbytes(32)
        cohort_seed = derived_cohort_seed(secret)
        readings = []
        for params in (case.a, case.b):
            encoder = make_encoder(Metric(METRIC, params), secret, cohort_seed, rnd.randbytes)
            readings.append(case.reading(encoder, encoder.encode(case.value)))
        pairs[readings[0], readings[1]] += 1
    first, second = case.marginal(case.a), case.marginal(case.b)
    assert set(pairs) <= set(itertools.product(first, second)), f"{name}: impossible readings"
    for (x, px), (y, py) in itertools.product(first.items(), second.items()):
        pi = px * py
        expected, sd = INSTALLATIONS * pi, math.sqrt(INSTALLATIONS * pi * (1 - pi))
        got = pairs[x, y]
        assert abs(got - expected) <= Z * sd, (
            f"{name}: P(A -> {x!r}, B -> {y!r}) is {got / INSTALLATIONS:.4f} over "
            f"{INSTALLATIONS} installations; independent answers give {pi:.4f}")


def test_a_collector_redeclaring_a_boolean_learns_nothing_from_the_pair(
    collector_factory, tmp_path
) -> None:
    """Two collectors declare ``flag`` with alpha 0.5 and 0.6; each installation reports
    False to both. Before the fix the pair (0, 1) was impossible for False (it needs the
    first answer untruthful and the second truthful, from one uniform word) and common
    for True: the pair alone revealed the value. Independent answers give (0, 1) with
    probability 0.75 * 0.2 = 0.15, so among 100 installations none shows it with
    probability 0.85^100 < 1e-7 (the secrets come from the OS: the bound is the test's
    false-alarm rate)."""
    installations = 100
    collectors = [
        collector_factory(registry=Registry.from_dict({"metrics": {
            "flag": {"kind": "boolean", "alpha": alpha, "min_reports": 1}}}))
        for alpha in (0.5, 0.6)
    ]
    for i in range(installations):
        for collector in collectors:
            with Client(collector.url, tmp_path / f"installation{i}", strict=True) as client:
                client.report("flag", False)
                assert client.flush(timeout=30).remaining == 0
    answers = []
    for collector in collectors:
        with sqlite3.connect(collector.db_path) as db:
            answers.append([payload for (payload,) in db.execute(
                "SELECT payload FROM reports WHERE metric = 'flag' ORDER BY rowid")])
    pairs = Counter(zip(*answers, strict=True))
    assert sum(pairs.values()) == installations
    assert pairs[0, 1] > 0, f"no installation answered (0, 1) for False: {dict(pairs)}"
