"""The FLH and HCMS string encoders: exact privacy, their law, stream layout and memoization.

* **Privacy, exactly.** From the realized numerators alone, the exact law of the
  permanent response and of one report is built with :class:`fractions.Fraction` for
  the worst-case pair of values (two values in different buckets of the installation's
  hash function; for HCMS, the coefficient where their Hadamard signs differ). The
  largest log-ratio must equal the stated ``epsilon_inf`` and ``epsilon_1``: never below
  them, not more than ``1e-9`` (relative) above, and a claim just below (relative
  ``1e-6``) is broken by it. Boundary parameters: ``g = 2``, ``report_epsilon ==
  epsilon`` (no instantaneous noise), ``epsilon = 20`` (nearly deterministic), a tiny
  epsilon, two columns.
* **Law.** Over seeded installations (a seeded stand-in for the CSPRNG), one report
  names its value's bucket (FLH) or carries its Hadamard sign (HCMS) with the exact
  probability, within 5 binomial standard errors ``sqrt(p (1 - p) / n)``.
* **Stream layout**, **memoization** and **bad values**.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from veil.client.encoders import ENCODERS, FlhEncoder, HcmsEncoder, make_encoder
from veil.client.randomness import HmacStream
from veil.shared.errors import ParameterError
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.shared.kinds.string_oracles import bucket, value_key
from veil.shared.registry import Metric

ONE = 1 << 32
SLACK = 1e-9
BELOW = 1e-6
SIGMAS = 5.0

FLH_CASES = [
    FlhParams(epsilon=2.0),
    FlhParams(epsilon=2.0, report_epsilon=2.0),
    FlhParams(epsilon=1.0, g=2, functions=4),
    FlhParams(epsilon=20.0, report_epsilon=20.0, functions=2),
    FlhParams(epsilon=20.0, functions=2),
    FlhParams(epsilon=0.01, report_epsilon=0.005, functions=16),
    FlhParams(epsilon=4.0, report_epsilon=1.0),
]
HCMS_CASES = [
    HcmsParams(epsilon=2.0),
    HcmsParams(epsilon=2.0, report_epsilon=2.0),
    HcmsParams(epsilon=1.0, rows=1, columns=2),
    HcmsParams(epsilon=20.0, report_epsilon=20.0, rows=2),
    HcmsParams(epsilon=0.01, report_epsilon=0.005),
    HcmsParams(epsilon=4.0, report_epsilon=1.0, columns=1024),
]


def prob(numerator: int) -> Fraction:
    return Fraction(numerator, ONE)


def log_ratio(a: Fraction, b: Fraction) -> float:
    return math.log(a) - math.log(b)


def flh_laws(params: FlhParams, own: int) -> tuple[list[Fraction], list[Fraction]]:
    """The exact law of the permanent response and of one report of a value in bucket
    ``own``: GRR over ``g`` (``a``; ``(1 - a) / (g - 1)`` each other), then kept w.p.
    ``lambda``, else uniform."""
    g, a, keep = params.buckets, prob(params.prr_numerator), prob(params.irr_numerator)
    permanent = [a if b == own else (1 - a) / (g - 1) for b in range(g)]
    report = [keep * permanent[b] + (1 - keep) / g for b in range(g)]
    return permanent, report


def hcms_laws(params: HcmsParams, column: int) -> tuple[dict[int, Fraction], dict[int, Fraction]]:
    """The exact law of the permanent response and of one report ``2 l + bit`` of a value in
    ``column``: ``l`` uniform, the sign's parity kept w.p. ``a``, then kept w.p. ``lambda``
    else a fair coin."""
    m, a, keep = params.columns, prob(params.prr_numerator), prob(params.irr_numerator)
    permanent, report = {}, {}
    for coefficient in range(m):
        sign = (coefficient & column).bit_count() & 1
        for bit in (0, 1):
            p = a if bit == sign else 1 - a
            permanent[2 * coefficient + bit] = p / m
            report[2 * coefficient + bit] = (keep * p + (1 - keep) / 2) / m
    return permanent, report


def worst(first: list[Fraction] | dict[int, Fraction],
          second: list[Fraction] | dict[int, Fraction]) -> float:
    """The largest log-ratio over outputs, both ways."""
    keys = range(len(first)) if isinstance(first, list) else first.keys()
    return max(max(log_ratio(first[z], second[z]), log_ratio(second[z], first[z])) for z in keys)


def check_stated(stated: float, exact: float, declared: float) -> None:
    assert stated >= exact, (stated, exact)
    assert stated <= exact * (1 + SLACK), (stated, exact)
    assert stated * (1 - BELOW) < exact, "a claim just below the stated epsilon must fail"
    assert stated <= declared * (1 + SLACK)


@pytest.mark.parametrize("params", FLH_CASES, ids=repr)
def test_flh_stated_epsilons_are_the_exact_worst_case(params: FlhParams) -> None:
    # two values in different buckets are the worst case: the law depends on the bucket only
    perm_a, report_a = flh_laws(params, 0)
    perm_b, report_b = flh_laws(params, 1)
    check_stated(params.epsilon_inf, worst(perm_a, perm_b), params.epsilon)
    check_stated(params.epsilon_1, worst(report_a, report_b), float(params.report_epsilon or 0))


@pytest.mark.parametrize("params", HCMS_CASES, ids=repr)
def test_hcms_stated_epsilons_are_the_exact_worst_case(params: HcmsParams) -> None:
    # columns 0 and 1 differ in sign at coefficient 1: the largest ratio any pair reaches
    perm_a, report_a = hcms_laws(params, 0)
    perm_b, report_b = hcms_laws(params, 1)
    check_stated(params.epsilon_inf, worst(perm_a, perm_b), params.epsilon)
    check_stated(params.epsilon_1, worst(report_a, report_b), float(params.report_epsilon or 0))
    # any other pair of columns reveals no more
    for column in range(min(params.columns, 8)):
        assert worst(hcms_laws(params, 0)[1], hcms_laws(params, column)[1]) <= \
            params.epsilon_1 * (1 + SLACK)


def test_the_check_sees_an_epsilon_that_is_off() -> None:
    params = FlhParams(epsilon=2.0)
    _, report_a = flh_laws(params, 0)
    _, report_b = flh_laws(params, 1)
    with pytest.raises(AssertionError):
        check_stated(params.epsilon_1 * 0.999, worst(report_a, report_b), 2.0)


def encoder_for(params: StringOracleParams, seed: int, cohort: int = 3):
    rnd = random.Random(seed)
    return make_encoder(Metric("m", params), rnd.randbytes(32), cohort, random_bytes=rnd.randbytes)


@pytest.mark.parametrize("params", [FLH_CASES[0], FLH_CASES[2], FLH_CASES[3], HCMS_CASES[0],
                                    HCMS_CASES[2], HCMS_CASES[3]], ids=repr)
def test_one_report_follows_the_exact_law_over_installations(params: StringOracleParams) -> None:
    n = 4000
    value = "news.example/today"
    hits = 0
    for seed in range(n):
        encoder = encoder_for(params, seed, cohort=seed)
        payload = encoder.encode(value)
        j = encoder.cohort
        if isinstance(params, FlhParams):
            hits += payload == bucket(j, value_key(value.encode()), params.buckets)
        else:
            column = bucket(j, value_key(value.encode()), params.columns)
            hits += (payload & 1) == (((payload >> 1) & column).bit_count() & 1)
    if isinstance(params, FlhParams):
        p = float(flh_laws(params, 0)[1][0])
    else:
        keep, a = prob(params.irr_numerator), prob(params.prr_numerator)
        p = float(keep * a + (1 - keep) / 2)
    assert abs(hits / n - p) <= SIGMAS * math.sqrt(p * (1 - p) / n), (hits / n, p)


def test_permanent_responses_are_the_documented_stream_layout() -> None:
    secret, metric, value = b"s" * 32, "m", "example.org"
    for params in (FlhParams(epsilon=2.0), HcmsParams(epsilon=2.0)):
        encoder = make_encoder(Metric(metric, params), secret, 5)
        j = encoder.cohort
        stream = HmacStream(secret, b"prr", metric,
                            params.fingerprint.encode() + b"\0" + j.to_bytes(4, "big")
                            + value.encode())
        u = value_key(value.encode())
        if isinstance(params, FlhParams):
            own = bucket(j, u, params.buckets)
            if stream.u32() < params.prr_numerator:
                expected = own
            else:
                other = stream.randbelow(params.buckets - 1)
                expected = other + (other >= own)
        else:
            coefficient = stream.randbelow(params.columns)
            sign = (coefficient & bucket(j, u, params.columns)).bit_count() & 1
            expected = 2 * coefficient + (sign if stream.u32() < params.prr_numerator
                                          else 1 - sign)
        assert encoder.memoized(value.encode()) == expected


def test_memoized_per_secret_and_value_and_reports_vary_with_instantaneous_noise() -> None:
    """Reports of one value vary below ``epsilon`` and are the permanent response at it."""
    for params in (FlhParams(epsilon=4.0, report_epsilon=1.0), HcmsParams(epsilon=4.0)):
        first = encoder_for(params, 1)
        again = encoder_for(params, 1)
        assert first.memoized(b"x") == again.memoized(b"x")
        assert len({first.encode("x") for _ in range(200)}) > 1
        still = encoder_for(type(params)(epsilon=4.0, report_epsilon=4.0), 1)
        assert len({still.encode("x") for _ in range(50)}) == 1


def test_bad_values_are_refused_naming_the_value() -> None:
    for params in (FlhParams(), HcmsParams()):
        encoder = encoder_for(params, 1)
        for bad in (3, None, b"bytes", "\ud800"):
            with pytest.raises(ParameterError) as raised:
                encoder.encode(bad)
            assert raised.value.field == "value"


def test_both_encoders_are_registered_by_mechanism_name() -> None:
    assert ENCODERS["string/flh"] is FlhEncoder
    assert ENCODERS["string/hcms"] is HcmsEncoder


@pytest.mark.parametrize("g", [2, 3, 5, 17, 256])
@pytest.mark.parametrize("epsilon", [1e-12, 1e-9, 1e-6, 0.01, 1.0])
def test_flh_never_states_more_than_the_declared_epsilon(g: int, epsilon: float) -> None:
    """With ``g`` given, below the least positive epsilon of a permanent response over ``g``
    buckets the parameters are refused by name, as the category oracles' are: never
    accepted with a stated epsilon above the declared one (epsilon 1e-9 with g = 5 stated
    1.17e-9), nor with a response that says nothing (g = 2 at 1e-12 stated 5e-324)."""
    from veil.shared.kinds.oracles.olh import bucket_prr_epsilon

    # the least positive epsilon 32-bit probabilities realize over g buckets: numerator
    # ceil(2^32 / g), or one more where that is 2^32 / g exactly (a uniform response: g a
    # power of two)
    least = bucket_prr_epsilon(g, -(-(2**32) // g)) or bucket_prr_epsilon(g, 2**32 // g + 1)
    try:
        params = FlhParams(epsilon=epsilon, g=g)
    except ParameterError as exc:
        assert epsilon < least, (epsilon, least)  # refused only below what can be realized
        assert exc.field == "epsilon" and f"g={g}" in str(exc)
        return
    assert epsilon >= least, (epsilon, least)
    assert params.epsilon_inf <= epsilon * (1 + 1e-9)
    assert params.epsilon_1 <= params.report_epsilon * (1 + 1e-9)
