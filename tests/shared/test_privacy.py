"""Privacy math: hand-computed values, and the stated epsilons checked from both sides
against the exact output distributions of the mechanisms."""

import itertools
import math
import random
from decimal import Decimal, localcontext

import pytest

from veil.shared import BooleanParams, CategoryParams, NumberParams, StringParams
from veil.shared.bits import realized
from veil.shared.errors import ParameterError
from veil.shared.hashing import bloom_bits
from veil.shared.privacy import (
    classic_gaussian_sigma,
    f_for_epsilon_inf,
    group_privacy,
    parallel,
    q_for_epsilon_1,
    rappor_effective_probs,
    rappor_epsilon_1,
    rappor_epsilon_inf,
    round_up,
    sequential,
    zcdp_gaussian_sigma,
)


def test_rappor_hand_computed_values():
    params = StringParams(k=16, h=2, p=0.5, q=0.75, f=0.5)
    assert params.epsilon_inf == pytest.approx(4 * math.log(3), rel=1e-11)
    # p* = 0.5*1.25/2 + 0.5*0.5 = 0.5625, q* = 0.3125 + 0.375 = 0.6875
    assert params.effective_probs == (0.5625, 0.6875)
    expected = 2 * math.log(0.6875 * 0.4375 / (0.5625 * 0.3125))
    assert params.epsilon_1 == pytest.approx(expected, rel=1e-11)


def test_epsilons_are_never_understated():
    assert rappor_epsilon_inf(2, 0.5) >= 4 * math.log(3)
    assert BooleanParams().epsilon_1 >= math.log(3)


def test_no_prr_means_no_longitudinal_bound():
    assert rappor_epsilon_inf(2, 0.0) == math.inf
    assert rappor_epsilon_1(2, 0.0, 0.5, 0.0) == math.inf


def test_no_information_costs_nothing():
    assert rappor_epsilon_inf(2, 1.0) == pytest.approx(0.0, abs=1e-300)
    assert rappor_epsilon_1(2, 0.25, 0.75, 1.0) == pytest.approx(0.0, abs=1e-300)


def test_parameter_helpers_invert_the_formulas():
    f = f_for_epsilon_inf(3.0, 2)
    assert rappor_epsilon_inf(2, f) == pytest.approx(3.0, rel=1e-11)
    q = q_for_epsilon_1(1.0, 2, 0.5, f)
    assert rappor_epsilon_1(2, 0.5, q, f) == pytest.approx(1.0, rel=1e-9)
    params = StringParams.for_epsilon(2.0, 0.5, k=64)
    assert params.epsilon_inf == pytest.approx(2.0, rel=1e-6)
    assert params.epsilon_1 == pytest.approx(0.5, rel=1e-6)
    assert BooleanParams.for_epsilon(1.0).epsilon_1 == pytest.approx(1.0, rel=1e-6)
    assert CategoryParams.for_epsilon(["a", "b"], 2.0).epsilon_inf == pytest.approx(2.0, rel=1e-6)


def test_a_boolean_picked_for_a_target_never_exceeds_it():
    """``BooleanParams.for_epsilon`` rounds alpha down on the grid of N / 2**32, as the other
    pickers round towards more privacy: rounded to the nearest, it exceeded 1,500 of 3,000
    targets. It stays within one grid step of the target, gives a target beyond the grid its
    largest alpha and refuses one below the grid's least."""
    rng = random.Random(5)
    for target in [rng.uniform(1e-6, 22.0) for _ in range(3000)] + [0.0051971249, 1.0]:
        params = BooleanParams.for_epsilon(target)
        assert params.epsilon_1 <= round_up(target), target
        above = BooleanParams(alpha=params.alpha + 2.0**-32, beta=0.5)
        assert above.epsilon_1 > target, target  # the largest alpha of the grid below
    assert BooleanParams.for_epsilon(40.0).alpha == 1 - 2.0**-32
    with pytest.raises(ParameterError, match=r"at least 0\.0000000004657, the least"):
        BooleanParams.for_epsilon(1e-12)


@pytest.mark.parametrize(("epsilon_inf", "epsilon_1"), [
    (0.5, None), (2.0, None), (10.0, None), (0.5, 0.1), (2.0, 0.5), (4.0, 0.3), (4.0, 1.0),
    (10.0, 1.0),
])
def test_parameters_for_a_target_never_state_more_than_the_target(epsilon_inf, epsilon_1):
    """The encoders realize f and q on a grid of 2**-32: rounding to the nearest point
    stated 0.5000000001 for a target epsilon_1 of 0.5; the picker rounds towards privacy."""
    params = StringParams.for_epsilon(epsilon_inf, epsilon_1)
    assert params.epsilon_inf <= epsilon_inf
    assert params.epsilon_inf == pytest.approx(epsilon_inf, rel=1e-8)
    if epsilon_1 is not None:
        assert params.epsilon_1 <= epsilon_1
        assert params.epsilon_1 == pytest.approx(epsilon_1, rel=1e-8)


def test_composition():
    assert sequential([1.0, 0.5, 0.25]) == pytest.approx(1.75)
    assert sequential([1.0, 0.5]) >= 1.5
    assert parallel([1.0, 0.5, 0.25]) == 1.0
    assert parallel([]) == 0.0
    assert group_privacy(0.5, 3) == pytest.approx(1.5)
    assert group_privacy(0.5, 0) == 0.0
    assert StringParams().privacy_map(2) == pytest.approx(2 * StringParams().epsilon_inf)


def test_gaussian_calibration_is_close_to_the_classic_formula():
    # zCDP calibration is valid for the discrete Gaussian at every epsilon and
    # within a few percent of the textbook sigma where that one applies.
    classic = classic_gaussian_sigma(1.0, 1.0, 1e-6)
    ours = zcdp_gaussian_sigma(1.0, 1.0, 1e-6)
    assert 0.95 < classic / ours < 1.05
    # rho-zCDP => (rho + 2 sqrt(rho ln 1/delta), delta)-DP recovers epsilon exactly
    rho = 1 / (2 * ours**2)
    assert rho + 2 * math.sqrt(rho * math.log(1e6)) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("epsilon", [1e-3, 1e-8, 1e-14, 1e-20, 1e-300])
def test_gaussian_calibration_keeps_its_digits_at_small_epsilons(epsilon):
    """sqrt(L + epsilon) - sqrt(L) cancels when epsilon is small next to L = ln(1/delta): at
    1e-20 it was 0 (sigma divided by it), at 1e-14 off by a third. Checked against the same
    formula in 700-digit decimals."""
    with localcontext() as context:
        context.prec = 700  # enough for the difference of square roots at 1e-300
        log_inv_delta = Decimal(math.log(1 / 1e-6))
        exact = (log_inv_delta + Decimal(epsilon)).sqrt() - log_inv_delta.sqrt()
        expected = 64 / (Decimal(2).sqrt() * exact)
    assert zcdp_gaussian_sigma(64, epsilon, 1e-6) == pytest.approx(float(expected), rel=1e-14)
    assert zcdp_gaussian_sigma(64, 5e-324, 1e-6) == math.inf  # nothing left to divide by


def test_f_for_a_huge_epsilon_inf_is_tiny_not_an_overflow():
    assert f_for_epsilon_inf(1e5, 2) == 0.0  # 2 e^-25000 is below the least double
    # epsilon_inf / (2h) = 720 passes exp's overflow at 709.8: the tail form, 2 e^-720
    assert f_for_epsilon_inf(1440.0, 1) == pytest.approx(2 * math.exp(-720), rel=1e-9)
    assert f_for_epsilon_inf(10**400, 2) == 0.0
    # the picker still realizes f >= 2**-32, so epsilon_inf stays finite and within the target
    params = StringParams.for_epsilon(1e5)
    assert params.f == 2**-32
    assert params.epsilon_inf <= 1e5
    # and so does the category picker: its f of 1.9e-13 at 60 was realized as 0, epsilon_inf
    # infinite for a target of 60
    for epsilon_inf in (60.0, 2.0, 0.5):
        category = CategoryParams.for_epsilon(["a", "b"], epsilon_inf)
        assert category.f >= 2**-32 and category.epsilon_inf <= epsilon_inf


def _max_log_ratio(dist_a, dist_b):
    return max(abs(math.log(a / b)) for a, b in zip(dist_a, dist_b, strict=True))


def _report_distribution(bloom, k, one_prob, zero_prob):
    """Exact distribution of a k-bit report given per-bit P(1) for set and unset bits."""
    out = []
    for report in itertools.product((0, 1), repeat=k):
        prob = 1.0
        for i, bit in enumerate(report):
            p1 = one_prob if (bloom >> i) & 1 else zero_prob
            prob *= p1 if bit else 1 - p1
        out.append(prob)
    return out


def _disjoint_values(k, h, cohort=0):
    seen = {}
    for i in range(10_000):
        bits = bloom_bits(f"v{i}", cohort, k, h)
        if bin(bits).count("1") != h:
            continue
        for other_bits in seen.values():
            if not bits & other_bits:
                return other_bits, bits
        seen[f"v{i}"] = bits
    raise AssertionError("no disjoint pair")


@pytest.mark.parametrize(("p", "q", "f"), [(0.5, 0.75, 0.5), (0.39, 0.61, 0.45), (0.25, 0.75, 0.2)])
def test_string_epsilons_hold_exactly_at_the_worst_case(p, q, f):
    # Both sides: the claimed epsilon bounds the true worst-case log-likelihood
    # ratio, and is tight (not more than 1e-9 above it) for two values whose
    # Bloom filters share no bit, the worst case RAPPOR's bound is stated for.
    params = StringParams(k=8, h=2, m=1, p=p, q=q, f=f)
    a, b = _disjoint_values(8, 2)
    p_star, q_star = params.effective_probs
    true_eps1 = _max_log_ratio(
        _report_distribution(a, 8, q_star, p_star), _report_distribution(b, 8, q_star, p_star)
    )
    assert params.epsilon_1 >= true_eps1
    assert params.epsilon_1 - true_eps1 < 1e-9
    fr = realized(f)
    true_inf = _max_log_ratio(
        _report_distribution(a, 8, 1 - fr / 2, fr / 2), _report_distribution(b, 8, 1 - fr / 2, fr / 2)
    )
    assert params.epsilon_inf >= true_inf
    assert params.epsilon_inf - true_inf < 1e-9


def test_category_epsilon_holds_exactly():
    params = CategoryParams(categories=("a", "b", "c"), p=0.3, q=0.8, f=0.3)
    p_star, q_star = params.effective_probs
    dists = [_report_distribution(1 << i, 3, q_star, p_star) for i in range(3)]
    true_eps = max(_max_log_ratio(x, y) for x, y in itertools.combinations(dists, 2))
    assert params.epsilon_1 >= true_eps
    assert params.epsilon_1 - true_eps < 1e-9


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.5), (0.2, 0.3), (0.9, 0.7)])
def test_boolean_epsilon_holds_exactly(alpha, beta):
    params = BooleanParams(alpha=alpha, beta=beta)
    no, yes = params.yes_probs
    true_eps = _max_log_ratio([yes, 1 - yes], [no, 1 - no])
    assert params.epsilon_1 >= true_eps
    assert params.epsilon_1 - true_eps < 1e-9
    assert params.epsilon_inf == params.epsilon_1


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_one_bit_mean_epsilon_holds_exactly(epsilon):
    params = NumberParams(low=0, high=10, mechanism="1bitmean", epsilon=epsilon, resolution=16)
    probs = [params.one_bit_numerator(j) / 2**32 for j in range(17)]
    true_eps = max(_max_log_ratio([a, 1 - a], [b, 1 - b]) for a in probs for b in probs)
    assert params.epsilon_1 >= true_eps
    assert params.epsilon_1 - true_eps < 1e-9
    assert params.epsilon_1 == pytest.approx(epsilon, rel=1e-6)


@pytest.mark.parametrize(("epsilon", "resolution"), [(0.7, 10), (2.0, 64), (0.1, 3)])
def test_discrete_laplace_epsilon_holds_exactly(epsilon, resolution):
    # The encoder adds integer noise with P(z) ~ exp(-|z| / laplace_scale) to a grid
    # point in 0..resolution. The worst pair of inputs is the two ends of the grid;
    # both output laws have the same normalizer, so the log-likelihood ratio of an
    # output y is (|y - resolution| - |y|) / laplace_scale. Both sides, as above.
    params = NumberParams(low=0, high=1, epsilon=epsilon, resolution=resolution)
    outputs = range(-3 * resolution, 4 * resolution + 1)
    true_eps = max(
        abs(abs(y - resolution) - abs(y)) / params.laplace_scale for y in outputs
    )
    assert params.epsilon_1 >= true_eps
    assert params.epsilon_1 - true_eps < 1e-9


def test_effective_probs_formula():
    assert rappor_effective_probs(0.0, 1.0, 0.0) == (0.0, 1.0)
    p_star, q_star = rappor_effective_probs(0.25, 0.75, 1.0)
    assert p_star == q_star == 0.5


@pytest.mark.parametrize("epsilon", [5e-324, 1.2345e-310, 9.99999e-305, 3e-299])
def test_a_tiny_epsilon_is_written_rounded_up(epsilon: float) -> None:
    """A mechanism that carries (almost) nothing, e.g. a boolean with alpha = 0, has its
    epsilon rounded up to the smallest float: it is written, never an OverflowError (which
    veil metrics and every decode's privacy statement raised), and never below itself."""
    from decimal import Decimal

    from veil.shared.privacy import format_epsilon, round_up

    for digits in (3, 4):
        for value in (epsilon, round_up(epsilon)):
            assert Decimal(format_epsilon(value, digits)) >= Decimal(value)


@pytest.mark.parametrize("delta", [1e-6, 1.2345641e-6, 9.9999999e-7, 3e-9, 1e-300, 5e-324, 0.5])
def test_a_delta_is_written_rounded_up(delta: float) -> None:
    """``veil metrics`` wrote delta with ``:g``, to the nearest: 1.2345641e-6 read 1.23456e-06.
    Written as format_epsilon writes an epsilon: never below it but for the relative 1e-9
    that keeps a declared 1e-6 from reading 1.01e-6."""
    from decimal import Decimal

    from veil.shared.privacy import format_delta

    written = Decimal(format_delta(delta))
    assert written >= Decimal(delta) * Decimal(1 - 1e-9)
    assert written <= Decimal(delta) * Decimal("1.01")  # three significant digits
