"""Privacy accounting: RAPPOR's bounds, randomized response, and composition.

Every epsilon returned here is rounded up by a relative 1e-12, so a stated
cost is never below the true one (a few floating-point logarithms and sums can
be off by several units in the last place; 1e-12 covers that with room).
Functions return ``math.inf`` where a mechanism gives no bound (for example
RAPPOR with ``f = 0`` has no longitudinal protection).
"""

from __future__ import annotations

import decimal
import math
import sys
from collections.abc import Iterable

from veil.shared.errors import ParameterError

ROUNDING_MARGIN = 1e-12
#: the largest ``x`` whose ``math.exp(x)`` is safely below the float range (709.78)
LARGEST_EXP = 700.0


def round_up(epsilon: float) -> float:
    """``epsilon`` nudged up (relative 1e-12) so that it is never understated."""
    if math.isinf(epsilon) or math.isnan(epsilon):
        return epsilon
    return math.nextafter(max(epsilon, 0.0) * (1 + ROUNDING_MARGIN), math.inf)


def format_epsilon(epsilon: float, digits: int = 3) -> str:
    """``epsilon`` written with ``digits`` significant digits, rounded up so a stated cost is
    never below the true one (a relative 1e-9 absorbs the nudge :func:`round_up` gives)."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        return f"{epsilon:g}"
    decimals = digits - 1 - math.floor(math.log10(epsilon))
    if decimals > 300:  # 10.0**decimals would overflow: scientific, rounded up exactly
        return _scientific_up(epsilon, digits)
    scale = 10.0**decimals
    units = math.ceil(epsilon * scale * (1 - 1e-9))
    # rounding up may reach the next power of ten (9.9999 -> 10.0), a digit longer
    if units >= 10**digits:
        decimals -= 1
    return f"{units / scale:.{max(decimals, 0)}f}"


def format_delta(delta: float, digits: int = 3) -> str:
    """A ``delta`` as ``d.dde-N`` with ``digits`` significant digits, rounded up as
    :func:`format_epsilon` rounds (a relative 1e-9 absorbs the float's representation of a
    declared decimal, so 1e-6 reads 1.00e-6, not 1.01e-6)."""
    if not math.isfinite(delta) or delta <= 0:
        return f"{delta:g}"
    exponent = math.floor(math.log10(delta))
    if digits - 1 - exponent > 300:  # 10.0**(...) would overflow: rounded up exactly
        return _scientific_up(delta, digits)
    units = math.ceil(delta * 10.0 ** (digits - 1 - exponent) * (1 - 1e-9))
    if units >= 10**digits:  # rounding up reached the next power of ten (or log10 was low)
        units, exponent = math.ceil(units / 10), exponent + 1
    text = str(units)
    return f"{text[0]}.{text[1:]}e{exponent}" if digits > 1 else f"{text}e{exponent}"


def _scientific_up(epsilon: float, digits: int) -> str:
    """A tiny ``epsilon`` (below 1e-298) as ``d.dde-N`` with ``digits`` significant digits,
    rounded up in exact decimal arithmetic."""
    exact = decimal.Decimal(epsilon)
    exponent = exact.adjusted()
    units = math.ceil(exact.scaleb(digits - 1 - exponent))
    if units >= 10**digits:
        units, exponent = math.ceil(units / 10), exponent + 1
    text = str(units)
    return f"{text[0]}.{text[1:]}e{exponent}" if digits > 1 else f"{text}e{exponent}"


def _log_ratio(numerator: float, denominator: float) -> float:
    if denominator <= 0.0:
        return math.inf if numerator > 0.0 else 0.0
    return math.log(numerator / denominator)


def rappor_effective_probs(p: float, q: float, f: float) -> tuple[float, float]:
    """``(p*, q*)``: the probability a reported bit is 1 when the true bit is 0 / 1."""
    p_star = f * (p + q) / 2 + (1 - f) * p
    q_star = f * (p + q) / 2 + (1 - f) * q
    return p_star, q_star


def rappor_epsilon_inf(h: int, f: float) -> float:
    """Longitudinal bound ``2h ln((1 - f/2) / (f/2))`` for any number of reports of a value."""
    return round_up(2 * h * _log_ratio(1 - f / 2, f / 2))


def rappor_epsilon_1(h: int, p: float, q: float, f: float) -> float:
    """One-report bound ``h ln(q*(1-p*) / (p*(1-q*)))``."""
    p_star, q_star = rappor_effective_probs(p, q, f)
    return round_up(h * (_log_ratio(q_star, p_star) + _log_ratio(1 - p_star, 1 - q_star)))


def f_for_epsilon_inf(epsilon_inf: float, h: int) -> float:
    """The ``f`` that makes RAPPOR's longitudinal bound equal ``epsilon_inf``: ``2 / (1 +
    e^x)`` with ``x = epsilon_inf / (2h)``, computed as ``2 e^-x / (1 + e^-x)`` where
    ``e^x`` would overflow (it is 0 where even ``e^-x`` underflows)."""
    if not epsilon_inf > 0:
        raise ParameterError("epsilon_inf", f"must be > 0; got {epsilon_inf!r}")
    x = epsilon_inf / (2 * h) if epsilon_inf <= sys.float_info.max else math.inf
    if x <= LARGEST_EXP:
        return 2.0 / (1.0 + math.exp(x))
    tail = math.exp(-x)
    return 2.0 * tail / (1.0 + tail)


def q_for_epsilon_1(epsilon_1: float, h: int, p: float, f: float) -> float:
    """The ``q`` that makes RAPPOR's one-report bound equal ``epsilon_1`` (bisection)."""
    if not epsilon_1 > 0:
        raise ParameterError("epsilon_1", f"must be > 0; got {epsilon_1!r}")
    low, high = p, 1.0
    if rappor_epsilon_1(h, p, high, f) < epsilon_1:
        raise ParameterError(
            "epsilon_1",
            f"epsilon_1 = {epsilon_1:g} cannot be reached with h={h}, p={p:g}, f={f:.6g}: even "
            f"q=1 gives {rappor_epsilon_1(h, p, 1.0, f):.4g}; lower epsilon_1, f or p",
        )
    for _ in range(200):
        mid = (low + high) / 2
        if rappor_epsilon_1(h, p, mid, f) < epsilon_1:
            low = mid
        else:
            high = mid
    return low


def binary_rr_epsilon(yes_given_yes: float, yes_given_no: float) -> float:
    """Epsilon of a binary randomized response with the given 'yes' probabilities."""
    return round_up(
        max(
            abs(_log_ratio(yes_given_yes, yes_given_no)),
            abs(_log_ratio(1 - yes_given_no, 1 - yes_given_yes)),
        )
    )


def classic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The textbook ``sigma = sensitivity * sqrt(2 ln(1.25/delta)) / epsilon`` (valid for epsilon < 1)."""
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def zcdp_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Sigma for which a (discrete) Gaussian is (epsilon, delta)-DP via zero-concentrated DP.

    The discrete Gaussian with variance parameter ``sigma**2`` is
    ``rho = sensitivity**2 / (2 sigma**2)``-zCDP (Canonne, Kamath, Steinke 2020), and
    rho-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Bun, Steinke 2016).
    Solving for ``rho`` gives a sigma valid for every epsilon, not only epsilon < 1.
    ``sqrt(rho) = sqrt(L + epsilon) - sqrt(L)`` (``L = ln(1/delta)``) is computed as
    ``epsilon / (sqrt(L + epsilon) + sqrt(L))``, which loses no digits to cancellation when
    epsilon is small next to ``L``; ``math.inf`` when even that underflows to 0.
    """
    log_inv_delta = math.log(1 / delta)
    sqrt_rho = epsilon / (math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta))
    return sensitivity / (math.sqrt(2) * sqrt_rho) if sqrt_rho > 0 else math.inf


def group_privacy(epsilon: float, distance: int) -> float:
    """Epsilon for inputs that differ in up to ``distance`` values (group privacy)."""
    if isinstance(distance, bool) or not isinstance(distance, int) or distance < 0:
        raise ParameterError("d_in", f"must be a non-negative integer; got {distance!r}")
    return 0.0 if distance == 0 else round_up(distance * epsilon)


def sequential(epsilons: Iterable[float]) -> float:
    """Sequential composition: mechanisms on the same person's data add up.

    ``math.fsum`` is correctly rounded, so a single term is returned unchanged
    and only a sum of several is rounded up.
    """
    values = list(epsilons)
    total = math.fsum(values)
    return total if len(values) <= 1 else round_up(total)


def parallel(epsilons: Iterable[float]) -> float:
    """Parallel composition: mechanisms on disjoint data cost the largest of them."""
    return max(epsilons, default=0.0)
