"""Small statistical helpers shared by the estimators: tests, corrections, intervals.

Normal and chi-square tails come from :mod:`scipy.special` (``ndtr``, ``log_ndtr``,
``chdtrc``): the same functions ``scipy.stats`` evaluates, at a tenth of its import time,
imported at first use. The normal quantile comes from :class:`statistics.NormalDist`, so a
chart's intervals need no SciPy at all.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np

from veil.shared.errors import ParameterError

#: multiple-testing corrections, the default first: ``storey`` is Benjamini-Hochberg
#: adapted to the estimated share of null hypotheses (Storey, Taylor and Siegmund 2004)
CORRECTIONS = ("storey", "bh", "bonferroni", "none")
#: ``storey``'s tuning constant: the null share is estimated from the p-values above it
#: (and no p-value above it is rejected), as in Storey, Taylor and Siegmund's Theorem 3
STOREY_LAMBDA = 0.5
#: the standard normal; its quantile (Wichura's AS 241) agrees with ``scipy.special.ndtri``
#: to 1e-15 from p = 1e-300 up, without importing SciPy
_NORMAL = NormalDist()
_ALIASES = {"benjamini-hochberg": "bh", "fdr": "bh", "adaptive-bh": "storey", "bh-adaptive": "storey"}


def _special() -> Any:
    """:mod:`scipy.special`, imported at first use: ``veil decode`` starts its chart helper
    before it (a fifth of a second), so the helper need not wait for it."""
    from scipy import special

    return special


def check_correction(correction: str) -> str:
    """Normalize and check a multiple-testing correction name."""
    name = _ALIASES.get(str(correction).lower(), str(correction).lower())
    if name not in CORRECTIONS:
        raise ParameterError(
            "correction",
            f"The 'correction' parameter must be one of {', '.join(CORRECTIONS)}. "
            f"Got {correction!r} instead.",
        )
    return name


def check_level(value: float, field: str) -> float:
    """A probability strictly between 0 and 1 (a test level or confidence)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ParameterError(field, f"The {field!r} parameter must be in (0, 1). Got {value!r} instead.")
    return float(value)


def one_sided_p_values(estimates: np.ndarray, std_errors: np.ndarray) -> np.ndarray:
    """P-values of z-tests of ``estimate > 0`` (1 where the standard error is not positive)."""
    estimates = np.asarray(estimates, dtype=float)
    std_errors = np.asarray(std_errors, dtype=float)
    out = np.ones_like(estimates)
    ok = std_errors > 0
    out[ok] = normal_sf(estimates[ok] / std_errors[ok])
    return out


def one_sided_log10_p_values(estimates: np.ndarray, std_errors: np.ndarray) -> np.ndarray:
    """Base-10 logarithms of :func:`one_sided_p_values`, computed in log space
    (``log_ndtr``), so they stay exact where the p-values themselves underflow to 0
    (z beyond about 38); 0 where the standard error is not positive."""
    estimates = np.asarray(estimates, dtype=float)
    std_errors = np.asarray(std_errors, dtype=float)
    out = np.zeros_like(estimates)
    ok = std_errors > 0
    out[ok] = _special().log_ndtr(-estimates[ok] / std_errors[ok]) / np.log(10.0)
    return out


def normal_sf(z: np.ndarray | float) -> np.ndarray:
    """The standard normal upper tail ``P(Z > z)`` (accurate far into the tail)."""
    return np.asarray(_special().ndtr(-np.asarray(z, dtype=float)))


def normal_isf(p: float) -> float:
    """The standard normal quantile with upper tail ``p``: ``normal_sf(normal_isf(p)) == p``."""
    if not 0.0 < p < 1.0:
        return float(-_special().ndtri(p))  # the infinities and NaN at and beyond the ends
    return -_NORMAL.inv_cdf(p)


def chi2_sf(x: float, dof: float) -> float:
    """The chi-square upper tail ``P(X > x)`` with ``dof`` degrees of freedom."""
    return float(_special().chdtrc(dof, x))


def null_share(p_values: np.ndarray, n_tests: int) -> float:
    """Storey's estimate of the share of true null hypotheses among ``n_tests``:
    ``(1 + #{p > lambda}) / (n (1 - lambda))``, at most 1; hypotheses screened out
    before testing (p-value 1) count as p > lambda."""
    p = np.asarray(p_values, dtype=float)
    n = max(int(n_tests), p.size, 1)
    above = int(np.count_nonzero(p > STOREY_LAMBDA)) + (n - p.size)
    return min(1.0, (1 + above) / (n * (1 - STOREY_LAMBDA)))


def adjust_p_values(p_values: np.ndarray, correction: str, n_tests: int | None = None) -> np.ndarray:
    """Adjusted p-values: Bonferroni (family-wise error), Benjamini-Hochberg (false
    discovery rate) or Storey's adaptive Benjamini-Hochberg (false discovery rate, with
    the share of nulls estimated by :func:`null_share`) over ``n_tests`` hypotheses
    (default: the number of p-values). A hypothesis is rejected at level ``alpha``
    when its adjusted p-value is below ``alpha``.

    ``n_tests`` larger than ``len(p_values)`` counts the hypotheses that were
    screened out before testing, each with p-value 1.
    """
    correction = check_correction(correction)
    p = np.asarray(p_values, dtype=float)
    n = p.size if n_tests is None else max(int(n_tests), p.size)
    if correction == "none" or p.size == 0:
        return p.copy()
    if correction == "bonferroni":
        bonferroni: np.ndarray = np.minimum(p * n, 1.0)
        return bonferroni
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, p.size + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(ranked, 1.0)
    if correction == "storey":
        out = np.minimum(out * null_share(p, n), 1.0)
        out[p > STOREY_LAMBDA] = 1.0
    return out


def z_quantile(confidence: float) -> float:
    """The two-sided normal quantile for a ``confidence`` interval (1.96 for 0.95)."""
    return normal_isf((1 - confidence) / 2)


def critical_z(alpha: float, correction: str, n_tests: int) -> float:
    """The smallest z that a single test must reach to be declared at level ``alpha``.

    For Benjamini-Hochberg and Storey's adaptive version this is the Bonferroni bound
    (the case of a single discovery among nulls), so detection limits built on it are
    conservative.
    """
    correction = check_correction(correction)
    level = alpha if correction == "none" else alpha / max(n_tests, 1)
    return normal_isf(level)


def detection_z(alpha: float, correction: str, n_tests: int, power: float) -> float:
    """How many standard errors a share must be to be detected with probability ``power``
    among ``n_tests`` at level ``alpha`` under ``correction``: the test's
    :func:`critical_z` plus the normal quantile of ``power``. A decoder's detection limit
    is that times the standard error of an absent value."""
    return critical_z(alpha, correction, n_tests) + normal_isf(1 - power)


#: largest block of :func:`walsh_hadamard` done as one small dense matrix product
_BLOCK_BITS = 4


def walsh_hadamard(values: np.ndarray, dtype: type[np.floating[Any]] = np.float32) -> np.ndarray:
    """The (unnormalized) Walsh-Hadamard transform ``H[u] = sum_y v[y] (-1)^popcount(u & y)``
    of a vector of length ``2**D``, in ``dtype`` (float32 is exact for integer sums below
    2**24), in blocks of :data:`_BLOCK_BITS` bits as small dense products."""
    size = values.size
    bits = size.bit_length() - 1
    if size != 1 << bits:
        raise ParameterError("values", f"length must be a power of two; got {size}")
    shape, left = [], bits
    while left > 0:
        block = min(_BLOCK_BITS, left)
        shape.append(1 << block)
        left -= block
    x = np.asarray(values, dtype=dtype).reshape(shape or [1])
    for axis, width in enumerate(shape):
        x = np.moveaxis(np.tensordot(_hadamard(width, dtype), x, axes=([1], [axis])), 0, axis)
    return np.ascontiguousarray(x).reshape(-1)


def _hadamard(size: int, dtype: type[np.floating[Any]]) -> np.ndarray:
    """Sylvester's Hadamard matrix of order ``size`` (a power of two)."""
    matrix = np.ones((1, 1), dtype=dtype)
    while matrix.shape[0] < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix


def walsh_hadamard_rows(table: np.ndarray) -> np.ndarray:
    """The (unnormalized) Walsh-Hadamard transform of each row, ``H[u] = sum_y v[y]
    (-1)^popcount(u & y)`` as :func:`walsh_hadamard` (rows of a
    power-of-two length), in float64, by butterflies over all rows at once."""
    out = np.array(table, dtype=np.float64)
    rows, size = out.shape
    if size & (size - 1):
        raise ParameterError("columns", f"a row's length must be a power of two; got {size}")
    half = 1
    while half < size:
        pairs = out.reshape(rows, size // (2 * half), 2, half)
        low = pairs[:, :, 0, :].copy()
        pairs[:, :, 0, :] += pairs[:, :, 1, :]
        np.subtract(low, pairs[:, :, 1, :], out=pairs[:, :, 1, :])
        half *= 2
    return out


def flat_cells(buckets: np.ndarray, width: int) -> np.ndarray:
    """The flat index ``j * width + buckets[x, j]`` of each (candidate, function) cell in a
    C-ordered (functions x width) table, as ``intp`` (what :func:`numpy.take` and
    :func:`numpy.bincount` index with, unconverted)."""
    offsets = np.arange(buckets.shape[1], dtype=np.intp) * width
    out: np.ndarray = buckets.astype(np.intp)
    out += offsets
    return out
