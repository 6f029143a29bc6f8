"""Decoders of the frequency oracles for categories: GRR, OUE, OLH and Hadamard response.

Every oracle's decoder reads a *support count* ``S_x`` per category ``x`` (how many
reports are consistent with it, :mod:`veil.shared.kinds.oracles.base`) and then
the same estimator. A report of category ``x`` supports ``x`` with probability
``p`` and any other category with probability ``q`` (``params.support_probs``).

The estimand is the population share ``s_x`` (docs/analysis.md, "What the error
bars mean"): each installation's value is a draw from the population, its permanent
response a randomization of that value and its one report a fresh randomization of
the permanent response, independently across installations. So each report supports
``x`` with probability ``rho_x = s_x p + (1 - s_x) q``, independently of the others,
``S_x`` is ``Binomial(N, rho_x)`` and

* ``share_x = (S_x / N - q) / (p - q)`` is unbiased for ``s_x``;
* its variance is ``rho_x (1 - rho_x) / (N (p - q)^2)``, stated with the observed
  support rate ``S_x / N`` clipped to ``[q, p]`` (where ``rho_x`` lies) for ``rho_x``.
  It exceeds the variance given the realized composition,
  :meth:`~veil.shared.kinds.oracles.base.OracleParams.share_variance`, by
  ``s_x (1 - s_x) / N``: the sampling of the installations themselves.
* The shares' sum (``allocated_proportion``, truth 1) is ``(sum_i K_i / N - d q) / (p - q)``
  with ``K_i`` the number of categories report ``i`` supports; reports are independent,
  so its variance is ``Var(K) / (N (p - q)^2)``, covariances between the shares
  included. ``E[K | x] = p + (d - 1) q`` whatever ``x``, so ``Var(K) = E[Var(K | x)]``:
  0 for GRR (every report supports exactly one category, the sum is identically 1),
  ``p (1 - p) + (d - 1) q (1 - q)`` for OUE (the bits are independent given the value);
  for OLH and Hadamard ``K`` is a function of the payload (:func:`olh_support_sizes`,
  :func:`hadamard_support_sizes`) and ``Var(K)`` is its variance over the reports,
  read from the response counts.

The support counts, from the statistic's counts vector:

* GRR (``responses``): ``S_x`` is the count of payload ``x``.
* OUE (``bits``): ``S_x`` is the count of reports with bit ``x`` set.
* OLH (``responses``, payload ``a * g + b``): ``S_x = sum_a T[a, h_a(x)]`` with
  ``T`` the counts as a (function, bucket) table. From
  ``1[b = a.x] = (1/g) sum_t w^(t (b - a.x))`` (``w = e^(2 pi i / g)``, digits of
  ``a.x`` mod ``g``), ``S_x = (1/g) Re sum_t W[t x mod g, -t mod g]`` where ``W`` is
  the ``(r + 1)``-dimensional DFT of ``T`` over GF(g) digit axes and ``t x`` is
  taken digit by digit: one FFT of ``g^(r+1)`` counters serves every category, in
  ``O(g^(r+1) log)`` time whatever ``N``.
* Hadamard (``responses``, payload ``y`` in ``[0, K)``): ``x`` owns
  ``{y : popcount((x + 1) & y) even}``, so ``S_x = (N + H[x + 1]) / 2`` with ``H``
  the Walsh-Hadamard transform of the response counts (the DFT over ``(2,) * log2 K``).

Both transforms are exact integer sums computed in floating point; they are
rounded to the nearest integer (the error is far below 1/2 for any realistic N).

Every estimate is unbiased, so a share near 0 or 1 can read outside [0, 1] by
sampling noise; as for the other closed-form decoders the table keeps such shares
unbiased (intervals clipped to [0, 1]) and the summary's ``note`` names them. The
``ibu`` estimator (``options.estimator``) instead reads the same support counts with
iterative Bayesian update (:mod:`veil.server.analysis.ibu`): shares on the simplex, with
parametric-bootstrap intervals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from veil.server.analysis.closed_form import (
    base_summary,
    category_shares_result,
    require_reports,
    start_decode,
)
from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.ibu import AffineChannel, estimate
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import walsh_hadamard
from veil.server.counts import CountsArrays
from veil.shared.errors import ParameterError
from veil.shared.kinds import GrrParams, HadamardParams, OlhParams, OracleParams, OueParams
from veil.shared.statistics import statistic_for

# ---------------------------------------------------------------- support counts


def grr_support(params: GrrParams, counts: np.ndarray) -> np.ndarray:
    """``S_x``: the reports naming category ``x``."""
    return np.asarray(counts, dtype=np.int64).reshape(-1)[: params.d].copy()


def oue_support(params: OueParams, ones: np.ndarray) -> np.ndarray:
    """``S_x``: the reports with bit ``x`` set."""
    return np.asarray(ones, dtype=np.int64).reshape(-1)[: params.d].copy()


def scaled_digits(count: int, g: int, r: int) -> np.ndarray:
    """``F[x, t] = sum_i (t x_i mod g) g^i`` for ``x < count`` and ``t < g``: the flat index,
    over ``r`` GF(g) digit axes, of ``t x`` taken digit by digit."""
    t = np.arange(g, dtype=np.int64)
    rest = np.arange(count, dtype=np.int64)
    scaled = np.zeros((count, g), dtype=np.int64)
    weight = 1
    for _ in range(r):
        scaled += (np.outer(rest % g, t) % g) * weight
        rest //= g
        weight *= g
    return scaled


def olh_support(params: OlhParams, counts: np.ndarray) -> np.ndarray:
    """``S_x = sum_a T[a, h_a(x)]`` for every category at once, with one FFT.

    Payload ``a * g + b`` with ``a = sum_i a_i g^i`` is the flat index
    ``b + sum_i a_i g^(i+1)``; reshaped C-order to ``(g,) * (r + 1)`` the last axis
    is the bucket ``b`` and axis ``r - 1 - i`` is digit ``a_i``. ``np.fft.fftn``
    computes ``W[k] = sum_n T[n] w^(-k . n)``, so the frequency that picks
    ``w^(t b - t a.x)`` has bucket digit ``-t mod g`` and ``a_i`` digit ``t x_i mod g``:
    laid out the same way, its flat index is ``f_t(x) * g + (-t mod g)`` with
    ``f_t(x) = sum_i (t x_i mod g) g^i``, the function that reads ``t x`` digit by digit.
    """
    g, r = params.buckets, params.digits
    table = np.asarray(counts, dtype=np.float64).reshape((g,) * (r + 1))
    spectrum = np.fft.fftn(table).reshape(-1)
    t = np.arange(g, dtype=np.int64)
    frequency = scaled_digits(params.d, g, r) * g + (-t) % g
    support = spectrum[frequency].real.sum(axis=1) / g
    out: np.ndarray = np.rint(support).astype(np.int64)
    return out


def hadamard_support(params: HadamardParams, counts: np.ndarray) -> np.ndarray:
    """``S_x = (N + H[x + 1]) / 2`` with ``H`` the Walsh-Hadamard transform of the counts
    (:func:`~veil.server.analysis.stats.walsh_hadamard`, in float64)."""
    flat = np.asarray(counts, dtype=np.float64).reshape(-1)
    transform = walsh_hadamard(flat, np.float64)
    support = (flat.sum() + transform[1 : params.d + 1]) / 2
    out: np.ndarray = np.rint(support).astype(np.int64)
    return out


# ---------------------------------------------------------------- categories per report


def olh_support_sizes(params: OlhParams) -> np.ndarray:
    """``K[a * g + b] = #{x < d : h_a(x) = b}``: how many categories each payload supports.

    With ``F[u] = sum_{x < d} w^(-u.x)`` the ``r``-dimensional DFT of the categories'
    indicator over GF(g) digit axes, ``sum_{x < d} w^(-t a.x) = F[t a]`` (``t a`` digit by
    digit), and ``K[a, b] = (1/g) sum_t w^(t b) F[t a]`` is an inverse DFT over ``t``:
    ``O(g^(r+1) log g)`` for the whole table, whatever ``d``.
    """
    g, r = params.buckets, params.digits
    indicator = np.zeros(params.functions)
    indicator[: params.d] = 1.0
    spectrum = np.fft.fftn(indicator.reshape((g,) * r)).reshape(-1)
    scaled = scaled_digits(params.functions, g, r)
    sizes: np.ndarray = np.rint(np.fft.ifft(spectrum[scaled], axis=1).real).astype(np.int64)
    return sizes.reshape(-1)


def hadamard_support_sizes(params: HadamardParams) -> np.ndarray:
    """``K[y] = #{x < d : popcount((x + 1) & y) even} = (d + H[y]) / 2``: how many categories
    each response supports, with ``H`` the Walsh-Hadamard transform of the indicator of
    the rows ``1 .. d``."""
    rows = np.zeros(params.size)
    rows[1 : params.d + 1] = 1.0
    sizes: np.ndarray = np.rint((params.d + walsh_hadamard(rows, np.float64)) / 2).astype(np.int64)
    return sizes


def support_size_variance(sizes: np.ndarray, counts: np.ndarray) -> float:
    """``Var(K)`` over the reports when payload ``y`` supports ``sizes[y]`` categories and
    ``counts[y]`` reports carried it (OLH, Hadamard; see the module docstring)."""
    weights = np.asarray(counts, dtype=np.float64).reshape(-1)
    total = float(weights.sum())
    mean = float(weights @ sizes) / total
    return float(weights @ (sizes - mean) ** 2) / total


def oue_support_variance(params: OueParams, counts: np.ndarray) -> float:
    """``Var(K) = p (1 - p) + (d - 1) q (1 - q)``: OUE's bits are independent given the
    value."""
    p, q = params.support_probs
    return float(p * (1 - p) + (params.d - 1) * q * (1 - q))


# ---------------------------------------------------------------- the estimator


def _decode_oracle(
    counts: CountsArrays,
    options: DecodeOptions,
    params_type: type[OracleParams],
    support_of: Callable[[Any, np.ndarray], np.ndarray],
    support_variance: Callable[[Any, np.ndarray], float],
    extra: Callable[[Any], dict[str, Any]] = lambda params: {},
    multinomial: bool = False,
) -> DecodeResult:
    """The shared estimator: support counts -> unbiased shares, errors, intervals, summary.
    ``support_variance`` is ``Var(K)`` from the counts vector (module docstring);
    ``multinomial`` says the support counts are one multinomial (GRR), which IBU reads
    exactly."""
    started, confidence, params = start_decode(counts, options, params_type,
                                         f"decode_{params_type.oracle}")
    total = require_reports(counts)
    p, q = params.support_probs
    if not p > q:
        raise ParameterError(
            "report_epsilon",
            f"{params.mechanism_name} with epsilon={params.epsilon!r}, report_epsilon="
            f"{params.report_epsilon!r}: a report supports its own category no more often than "
            f"another (p = {p:.6g}, q = {q:.6g}), so the reports carry no information",
        )
    # the statistic's one counts vector (``responses``, or ``ones`` for OUE), over cohorts
    field = np.asarray(counts.fields[statistic_for(params).fields[0].name]).sum(axis=0)
    support = support_of(params, field)
    share = (support / total - q) / (p - q)
    # population shares: S_x ~ Binomial(N, rho_x), rho_x in [q, p] (module docstring)
    rate = np.clip(support / total, q, p)
    se = np.sqrt(rate * (1 - rate) / total) / (p - q)
    allocated_variance = support_variance(params, field) / (total * (p - q) ** 2)
    summary = base_summary(counts, started, confidence)
    details = {"oracle": params.oracle, "support_probs": [p, q],
               "share_variance_per_report": params.share_variance(), **extra(params)}
    found = None
    if options.estimator == "ibu":
        # GRR's payload counts are one multinomial (exact IBU); the others' support counts
        # are binomial each (IBU on their composite likelihood, veil.server.analysis.ibu)
        channel = AffineChannel.identity(share.size, q, p, total, multinomial=multinomial)
        found = estimate(channel, support, share, se, confidence)
    return category_shares_result(counts, list(params.categories), share, se, confidence,
                                  summary, details, f"category shares ({params.oracle})",
                                  allocated_variance, found)


@decodes(GrrParams)
def decode_grr(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from generalized randomized response (payload counts)."""
    # every payload names one category: K = 1, and the shares sum to 1 identically
    return _decode_oracle(counts, options, GrrParams, grr_support, lambda params, field: 0.0,
                          multinomial=True)


@decodes(OueParams)
def decode_oue(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from optimized unary encoding (set-bit counts)."""
    return _decode_oracle(counts, options, OueParams, oue_support, oue_support_variance)


@decodes(OlhParams)
def decode_olh(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from optimized local hashing ((function, bucket) counts, one FFT)."""
    return _decode_oracle(
        counts, options, OlhParams, olh_support,
        lambda params, field: support_size_variance(olh_support_sizes(params), field),
        lambda params: {"buckets": params.buckets, "digits": params.digits})


@decodes(HadamardParams)
def decode_hadamard(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS,
                    ) -> DecodeResult:
    """Category shares from Hadamard response (response counts, one Walsh-Hadamard transform)."""
    return _decode_oracle(
        counts, options, HadamardParams, hadamard_support,
        lambda params, field: support_size_variance(hadamard_support_sizes(params), field),
        lambda params: {"size": params.size})
