"""Decoders of the frequency oracles for categories: GRR, OUE, OLH and Hadamard response.

Every oracle's decoder reads a *support count* ``S_x`` per category ``x`` (how many
reports are consistent with it, :mod:`veil.shared.kinds.oracles.base`) and then
the same estimator. A report of category ``x`` supports ``x`` with probability
``p`` and any other category with probability ``q`` (``params.support_probs``),
independently across reports, so with ``n_x`` of ``N`` reports in category ``x``,
``S_x`` is a sum of independent Bernoullis with ``E[S_x] = n_x p + (N - n_x) q`` and

* ``share_x = (S_x / N - q) / (p - q)`` is unbiased;
* its variance is ``(s p (1 - p) + (1 - s) q (1 - q)) / (N (p - q)^2)`` with
  ``s = n_x / N`` (:meth:`~veil.shared.kinds.oracles.base.OracleParams.share_variance`),
  stated with the estimate clipped to [0, 1] plugged in for ``s``.

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
unbiased (intervals clipped to [0, 1]) and the summary's ``note`` names them.
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
from veil.server.analysis.counts import CountsArrays
from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import walsh_hadamard
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
    rest = np.arange(params.d, dtype=np.int64)
    function = np.zeros((params.d, g), dtype=np.int64)
    weight = 1
    for _ in range(r):
        function += (np.outer(rest % g, t) % g) * weight
        rest //= g
        weight *= g
    frequency = function * g + (-t) % g
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


# ---------------------------------------------------------------- the estimator


def _decode_oracle(
    counts: CountsArrays,
    options: DecodeOptions,
    params_type: type[OracleParams],
    support_of: Callable[[Any, np.ndarray], np.ndarray],
    extra: Callable[[Any], dict[str, Any]] = lambda params: {},
) -> DecodeResult:
    """The shared estimator: support counts -> unbiased shares, errors, intervals, summary."""
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
    field = counts.fields[statistic_for(params).fields[0].name]
    support = support_of(params, np.asarray(field).sum(axis=0))
    share = (support / total - q) / (p - q)
    # share_variance(s, N) is linear in s: evaluate at the clipped estimates
    floor, ceiling = params.share_variance(0.0, total), params.share_variance(1.0, total)
    se = np.sqrt(floor + np.clip(share, 0.0, 1.0) * (ceiling - floor))
    summary = base_summary(counts, started, confidence, len(params.categories), "categories")
    details = {"oracle": params.oracle, "support_probs": [p, q],
               "share_variance_per_report": params.share_variance(), **extra(params)}
    return category_shares_result(counts, list(params.categories), share, se, confidence,
                                  summary, details, f"category shares ({params.oracle})")


@decodes(GrrParams)
def decode_grr(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from generalized randomized response (payload counts)."""
    return _decode_oracle(counts, options, GrrParams, grr_support)


@decodes(OueParams)
def decode_oue(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from optimized unary encoding (set-bit counts)."""
    return _decode_oracle(counts, options, OueParams, oue_support)


@decodes(OlhParams)
def decode_olh(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """Category shares from optimized local hashing ((function, bucket) counts, one FFT)."""
    return _decode_oracle(counts, options, OlhParams, olh_support,
                          lambda params: {"buckets": params.buckets, "digits": params.digits})


@decodes(HadamardParams)
def decode_hadamard(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS,
                    ) -> DecodeResult:
    """Category shares from Hadamard response (response counts, one Walsh-Hadamard transform)."""
    return _decode_oracle(counts, options, HadamardParams, hadamard_support,
                          lambda params: {"size": params.size})
