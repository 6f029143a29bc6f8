"""Small statistical helpers shared by the estimators: tests, corrections, intervals."""

from __future__ import annotations

import numpy as np
from scipy import stats

from veil.shared.errors import ParameterError

CORRECTIONS = ("bonferroni", "bh", "none")


def check_correction(correction: str) -> str:
    """Normalize and check a multiple-testing correction name."""
    name = {"benjamini-hochberg": "bh", "fdr": "bh"}.get(str(correction).lower(), str(correction).lower())
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
    out[ok] = stats.norm.sf(estimates[ok] / std_errors[ok])
    return out


def adjust_p_values(p_values: np.ndarray, correction: str, n_tests: int | None = None) -> np.ndarray:
    """Adjusted p-values: Bonferroni (family-wise error) or Benjamini-Hochberg (false
    discovery rate) over ``n_tests`` hypotheses (default: the number of p-values).

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
    return out


def z_quantile(confidence: float) -> float:
    """The two-sided normal quantile for a ``confidence`` interval (1.96 for 0.95)."""
    return float(stats.norm.isf((1 - confidence) / 2))


def critical_z(alpha: float, correction: str, n_tests: int) -> float:
    """The smallest z that a single test must reach to be declared at level ``alpha``.

    For Benjamini-Hochberg this is the Bonferroni bound (the case of a single
    discovery), so detection limits built on it are conservative.
    """
    correction = check_correction(correction)
    level = alpha if correction == "none" else alpha / max(n_tests, 1)
    return float(stats.norm.isf(level))
