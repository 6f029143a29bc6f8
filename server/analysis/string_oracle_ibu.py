"""IBU for the hashed string oracles, FLH and HCMS: the detected strings' shares by maximum
likelihood from the statistic, with intervals from the observed information.

Every report lands in exactly one (cohort, payload) cell, so a statistic is one
multinomial draw per cohort, and the law of a cell is affine in the shares of the
values (:mod:`veil.server.analysis.ibu`'s multinomial channel). With ``F`` functions
(cohorts, each a report's with probability ``1/F``):

* FLH, cell ``(j, b)``: ``(P0 + (P1 - P0) [h_j(x) = b]) / F``;
* HCMS, cell ``(j, 2 l + bit)``: ``((1 - P) + (2P - 1) [bit = parity(l & h_j(x))]) /
  (F m)``, ``m`` the sketch's columns.

The components are the strings the unbiased decoder detected and a background: the
reports of every other value, whose hashes are independent of the cells, so that it
lands in a cell with the law's mean over the buckets (FLH ``1/B``; HCMS ``1/2`` for the
bit, but bit 0 always at coefficient 0, whose sign is +1 for every bucket). IBU over every candidate spreads the detected strings' mass over the rest (its
total variation was worse than the table's: docs/strings.md); over the detected strings
and the background it keeps the table's selection and replaces the moment estimates by
the likelihood's.

HCMS's design has ``F m`` ones per string (half of every row's cells), too many to store
for a long list: :class:`HcmsDesign` applies it through the rows' Walsh-Hadamard
transform instead (the sign of coefficient ``l`` for bucket ``b`` is ``H[l, b]``).

Standard errors: the inverse observed information on the simplex (the delta method at
the maximum; as for the joint table, :func:`~veil.server.analysis.assoc_em.simplex_covariance`),
``I = sum_o c_o a_o a_o' / r_o^2`` with ``a_o`` the law of cell ``o`` per component and
``r_o`` its rate at the fit, formed from the design's weighted Gram matrix
``D' diag(w) D`` without the design's rows. A bootstrap refits every replicate over all
``F x B`` cells (10 to 20 s for a hundred replicates at a million reports); the information
costs one pass.
Intervals are normal, clipped to [0, 1], and reach down to 0 where the unbiased share is
not significant (as :func:`veil.server.analysis.ibu.estimate`'s).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.assoc_em import simplex_covariance
from veil.server.analysis.ibu import AffineChannel, Bootstrap, IbuEstimate, IbuFit, estimate
from veil.server.analysis.stats import flat_cells, walsh_hadamard_rows, z_quantile
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams

#: (function, string, string) triples gathered at once for HCMS's Gram matrix
CHUNK_TRIPLES = 1 << 22
#: how the intervals are made (the summary's ``interval``)
INFORMATION_INTERVAL = ("observed information at the fit (delta method), normal interval "
                        "clipped to [0, 1], down to 0 where the unbiased share is not "
                        "significant (docs/strings.md, \"IBU\")")


class HcmsDesign:
    """HCMS's 0/1 design over the cells ``(j, 2 l + bit)`` (rows, in the statistic's order)
    and the strings whose buckets are ``buckets`` (strings x functions), applied through the
    rows' Walsh-Hadamard transform: ``(D v)[j, l, bit] = (sum v +- W_j[l]) / 2``, ``W_j``
    the transform of ``v`` scattered over row ``j``'s buckets (``+`` for bit 0). ``cells``
    holds each (string, function)'s bucket as a flat index into a (functions x m) table."""

    def __init__(self, buckets: np.ndarray, columns: int) -> None:
        self.buckets = buckets
        self.columns = columns
        self.functions = buckets.shape[1]
        self.shape = (self.functions * 2 * columns, buckets.shape[0])
        self.cells = flat_cells(buckets, columns)

    def __matmul__(self, values: np.ndarray) -> np.ndarray:
        block = np.asarray(values, dtype=float).reshape(self.shape[1], -1)
        fits, m = block.shape[1], self.columns
        held = np.zeros((self.functions * m, fits))
        for fit in range(fits):
            held[:, fit] = np.bincount(self.cells.reshape(-1),
                                       weights=np.repeat(block[:, fit], self.functions),
                                       minlength=held.shape[0])
        spectrum = walsh_hadamard_rows(
            held.reshape(self.functions, m, fits).transpose(0, 2, 1).reshape(-1, m))
        spectrum = spectrum.reshape(self.functions, fits, m).transpose(0, 2, 1)
        total = block.sum(axis=0)
        out = np.stack([(total + spectrum) / 2, (total - spectrum) / 2], axis=2)
        result: np.ndarray = out.reshape(self.shape[0], fits)
        return result if np.ndim(values) == 2 else result[:, 0]

    @property
    def T(self) -> _HcmsAdjoint:
        """The adjoint: ``D' w``."""
        return _HcmsAdjoint(self)

    def transformed(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``V = w0 + w1`` and ``WHT(w0 - w1)`` per row and coefficient (functions x m)."""
        cells = np.asarray(weights, dtype=float).reshape(self.functions, self.columns, 2)
        return cells.sum(axis=2), walsh_hadamard_rows(cells[:, :, 0] - cells[:, :, 1])

    def weighted_gram(self, weights: np.ndarray) -> np.ndarray:
        """``D' diag(weights) D`` (strings x strings): with ``V = w0 + w1`` and ``U = w0 -
        w1`` per (row, coefficient), entry ``(x, y)`` is ``sum_j (sum V_j + WHT(V_j)[h_x ^
        h_y] + WHT(U_j)[h_x] + WHT(U_j)[h_y]) / 4`` (``H[l, a] H[l, b] = H[l, a ^ b]``)."""
        both, signed = self.transformed(weights)
        spectrum = walsh_hadamard_rows(both)
        strings = self.shape[1]
        gram = np.full((strings, strings), both.sum() / 4)
        own = np.take(signed.reshape(-1), self.cells).sum(axis=1) / 4
        gram += own[:, None] + own[None, :]
        step = max(1, CHUNK_TRIPLES // max(strings * strings, 1))
        for start in range(0, self.functions, step):
            part = self.buckets[:, start:start + step].astype(np.intp)  # strings x chunk
            rows = np.arange(start, start + part.shape[1], dtype=np.intp) * self.columns
            pairs = (part[:, None, :] ^ part[None, :, :]) + rows
            gram += np.take(spectrum.reshape(-1), pairs).sum(axis=2) / 4
        return gram


class _HcmsAdjoint:
    """``D' w`` of :class:`HcmsDesign`: ``sum_j (sum_l V_j[l] + WHT(U_j)[h_j(x)]) / 2``."""

    def __init__(self, design: HcmsDesign) -> None:
        self.design = design

    def __matmul__(self, weights: np.ndarray) -> np.ndarray:
        block = np.asarray(weights, dtype=float).reshape(self.design.shape[0], -1)
        out = np.empty((self.design.shape[1], block.shape[1]))
        for fit in range(block.shape[1]):
            both, signed = self.design.transformed(block[:, fit])
            out[:, fit] = (both.sum() + np.take(signed.reshape(-1), self.design.cells)
                           .sum(axis=1)) / 2
        return out if np.ndim(weights) == 2 else out[:, 0]


def flh_design(buckets: np.ndarray, width: int) -> sp.csc_matrix:
    """FLH's 0/1 design over the cells ``(j, b)``: one 1 per (string, function)."""
    strings, functions = buckets.shape
    return sp.csc_matrix((np.ones(strings * functions), (flat_cells(buckets, width).reshape(-1),
                                                         np.repeat(np.arange(strings), functions))),
                         shape=(functions * width, strings))


def weighted_gram(design: Any, weights: np.ndarray) -> np.ndarray:
    """``D' diag(weights) D`` of a design (sparse, or with its own ``weighted_gram``)."""
    if isinstance(design, HcmsDesign):
        return design.weighted_gram(weights)
    gram: np.ndarray = np.asarray((design.T @ design.multiply(weights[:, None])).todense())
    return gram


def oracle_channel(params: StringOracleParams, buckets: np.ndarray, reports: float,
                   ) -> AffineChannel:
    """The multinomial channel of ``params``'s cells over the strings whose buckets are
    ``buckets`` (strings x functions) and the background (module docstring)."""
    functions = params.hash_functions
    background: float | np.ndarray
    if isinstance(params, FlhParams):
        p1, p0 = params.bucket_probs
        design: Any = flh_design(buckets, params.buckets)
        low, high, background = p0 / functions, p1 / functions, 1 / params.buckets
    elif isinstance(params, HcmsParams):
        kept, m = params.bit_kept, params.columns
        design = HcmsDesign(buckets, m)
        low, high = (1 - kept) / (functions * m), kept / (functions * m)
        sign_mean = np.zeros((functions, m, 2))  # the signs' mean over the buckets: 1 at l = 0
        sign_mean[:, 0, 0], sign_mean[:, 0, 1] = 1.0, -1.0
        background = ((1 + sign_mean) / 2).reshape(-1)
    else:
        raise TypeError(f"no IBU channel for {type(params).__name__}")
    return AffineChannel(design, low, high, np.full(design.shape[0], float(reports)),
                         background_rate=background, multinomial=True)


def observed_information(channel: AffineChannel, counts: np.ndarray,
                         shares: np.ndarray) -> np.ndarray:
    """``sum_o c_o a_o a_o' / r_o^2`` over the components (strings, then the background):
    ``a_o = low + spread d_o`` with ``d_o`` the design's row and the background's rate
    ``beta_o``, so the sum is ``low^2 S 11' + low spread (1 g' + g 1') + spread^2 G`` with
    ``S = sum w``, ``g = d' w`` and ``G = d' diag(w) d`` for ``w = c / r^2``."""
    rates = channel.rates(shares)
    weights = np.where(counts > 0, counts / np.clip(rates, 1e-300, None) ** 2, 0.0)
    beta = np.broadcast_to(np.asarray(channel.background_rate, dtype=float), weights.shape)
    total = float(weights.sum())
    size = channel.components
    g = np.append(np.asarray(channel.design.T @ weights, dtype=float), beta @ weights)
    full = np.empty((size, size))
    full[:-1, :-1] = weighted_gram(channel.design, weights)
    full[:-1, -1] = full[-1, :-1] = np.asarray(channel.design.T @ (weights * beta), dtype=float)
    full[-1, -1] = float((beta * beta) @ weights)
    low, spread = channel.low, channel.spread
    information: np.ndarray = (low * low * total + low * spread * (g[:, None] + g[None, :])
                               + spread * spread * full)
    return information


def oracle_ibu(params: StringOracleParams, responses: np.ndarray, buckets: np.ndarray,
               unbiased: np.ndarray, unbiased_se: np.ndarray, confidence: float,
               ) -> IbuEstimate:
    """IBU over the detected strings (their ``buckets``, strings x functions, and their
    ``unbiased`` shares with standard errors ``unbiased_se``) and the background, from the
    ``responses`` counts (cohorts x payloads), with standard errors and ``confidence``
    intervals from the observed information (module docstring) through
    :func:`~veil.server.analysis.ibu.estimate`; component ``i`` is detected string ``i``,
    the last the background."""
    counts = np.asarray(responses, dtype=float).reshape(-1)
    channel = oracle_channel(params, buckets, float(counts.sum()))

    def information_spread(fit: IbuFit) -> Bootstrap:
        covariance = simplex_covariance(observed_information(channel, counts, fit.shares))
        std_errors = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
        half = z_quantile(confidence) * std_errors
        return Bootstrap(std_errors, np.clip(fit.shares - half, 0.0, 1.0),
                         np.clip(fit.shares + half, 0.0, 1.0), replicates=0)

    return estimate(channel, counts, unbiased, unbiased_se, confidence,
                    1.0 - float(unbiased.sum()), spread_of=information_spread,
                    interval=INFORMATION_INTERVAL)
