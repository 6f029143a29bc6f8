"""Iterative Bayesian update (IBU): non-negative, consistent shares from an oracle's
sufficient statistic, with parametric-bootstrap intervals.

IBU (Agrawal and Aggarwal 2001; ElSalamouny and Palamidessi 2020; Arcolezi et al. 2023)
is the expectation-maximization algorithm for the shares ``pi`` of a mixture whose
components are the oracle's law of one report given its value. It reads counts, never
reports: every decoder here keeps a statistic of *observations* ``o`` (a payload, a set
bit, a supported category, a Bloom bit of a cohort) whose success probability for a
report of value ``x`` is affine in a 0/1 design:

    ``A[o, x] = low + (high - low) * D[o, x]``

with ``D`` the identity for the category oracles (``low, high = q, p`` or ``p*, q*``) and
the candidate map for Bloom strings, plus, optionally, a *background* component (the
values missing from a candidate list) that sets each observation with probability
``low + (high - low) * background_rate``. Two ways to read the counts:

* ``multinomial`` (GRR): each report lands in exactly one observation and every column
  of ``A`` sums to 1, so the counts are one multinomial draw: exact IBU.
* binary (everything else): observation ``o`` has ``trials[o]`` reports, ``counts[o]``
  of them succeed. Each observation is a binomial count, and IBU maximizes the
  *composite* likelihood (the product of these binomials, the dependence between the
  observations of one report ignored). The counts are all the statistic keeps, so this
  is the likelihood the statistic affords; its maximizer is consistent (each margin is
  right) and, being a mixture EM over the pseudo-observations "observation ``o`` read
  1/0", each step raises it.

The estimate lies on the simplex (non-negative, summing to 1 over the columns and the
background), so the listed values' shares sum to the mass the list explains. Steps are
accelerated with SQUAREM (:mod:`veil.server.analysis.squarem`), falling back to a plain
step whenever the extrapolation lowers the likelihood, and stop when the likelihood
gains less than ``tol`` relative per step.

IBU is biased (it shrinks the noise that would push an unbiased share below 0, so small
shares read high and large ones a little low) and its error has no closed form. Its
standard errors and intervals come from a parametric bootstrap of the oracle's law at
the fitted shares (:func:`bootstrap`): the composition of the reports drawn from the fitted
shares (the sampling of the installations), then each observation's count given it, the
same way the oracle draws it, and IBU again on each replicate (FLH and HCMS strings, whose
replicates would each refit every cell, use the observed information instead:
:mod:`veil.server.analysis.string_oracle_ibu`). The interval is the
replicates' percentile interval, reaching down to 0 where the unbiased estimate cannot
tell the share from 0 (:func:`estimate`). docs/analysis.md, "Choosing an estimator",
gives its measured coverage; the basic interval ``[2 pi - q_hi, 2 pi - q_lo]`` covered
small shares far less (53-73% at N = 10,000, epsilon = 0.5).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from veil.server.analysis.squarem import extrapolate
from veil.server.analysis.stats import z_quantile
from veil.shared.errors import ParameterError

#: relative likelihood gain per step below which the fit has converged
TOLERANCE = 1e-10
#: steps (each SQUAREM step costs three updates) after which the fit stops regardless
MAX_STEPS = 5_000
#: bootstrap replicates behind the standard errors and intervals
REPLICATES = 200


class Design(Protocol):
    """A 0/1 design (``observations x values``) as IBU uses it: ``design @ values`` (a column
    per fit) and ``design.T @ weights``. A SciPy sparse matrix is one; an oracle whose design
    is too large to store gives an operator (:mod:`veil.server.analysis.string_oracle_ibu`)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def __matmul__(self, other: np.ndarray) -> Any: ...

    @property
    def T(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class AffineChannel:
    """The oracle's law over the observations of its statistic: observation ``o`` succeeds
    for a report of value ``x`` with probability ``low + (high - low) * design[o, x]``
    (``design`` 0/1, ``observations x values``), and for a report of a value missing from
    the list with probability ``low + (high - low) * background_rate`` when
    ``background_rate`` is given (one rate, or one per observation). ``trials`` are the reports behind each observation
    (binary counts); ``multinomial`` says every report lands in exactly one observation
    (then every column of the law sums to 1 and ``trials`` is unused). ``cohorts`` (one
    per observation) groups observations that share their reports, for the bootstrap's
    composition; by default all observations share one cohort."""

    design: Design
    low: float
    high: float
    trials: np.ndarray
    background_rate: float | np.ndarray | None = None
    multinomial: bool = False
    cohorts: np.ndarray | None = None

    @classmethod
    def identity(cls, size: int, low: float, high: float, reports: int,
                 multinomial: bool = False) -> AffineChannel:
        """The channel of a category oracle: observation ``x`` is "the report supports (or
        names) category ``x``", with probability ``high`` for category ``x``, ``low`` for
        any other; ``reports`` reports behind every observation."""
        return cls(sp.identity(size, format="csc", dtype=float), float(low), float(high),
                   np.full(size, float(reports)), multinomial=multinomial)

    @property
    def spread(self) -> float:
        """``high - low``: how much a value's own observations gain."""
        return self.high - self.low

    @property
    def components(self) -> int:
        """Mixture components: the listed values, and the background when there is one."""
        return int(self.design.shape[1]) + (self.background_rate is not None)

    def rates(self, shares: np.ndarray) -> np.ndarray:
        """Each observation's success probability under ``shares`` (summing to 1; a row of
        shares per fit gives a row of rates per fit)."""
        batch = np.atleast_2d(shares)
        values = batch[:, : self.design.shape[1]]
        signal = np.asarray(self.design @ values.T).T
        if self.background_rate is not None:
            signal = signal + batch[:, -1:] * self.background_rate
        out: np.ndarray = self.low + self.spread * signal
        return out if np.ndim(shares) == 2 else out[0]

    def adjoint(self, weights: np.ndarray) -> np.ndarray:
        """``sum_o weights[o] * design[o, x]`` per component (the background's rate times
        the weights' sum for the background), row by row for a batch of weights."""
        batch = np.atleast_2d(weights)
        out = np.asarray(self.design.T @ batch.T).T
        if self.background_rate is not None:
            out = np.hstack([out, (batch * self.background_rate).sum(axis=1, keepdims=True)])
        result: np.ndarray = np.asarray(out, dtype=float)
        return result if np.ndim(weights) == 2 else result[0]


@dataclasses.dataclass(frozen=True)
class IbuFit:
    """IBU's shares (one per listed value, then the background's when modelled), the steps
    it took, whether it converged, and its (composite) log-likelihood."""

    shares: np.ndarray
    steps: int
    converged: bool
    log_likelihood: float


def _check(channel: AffineChannel, counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=float)
    if counts.shape[-1] != channel.design.shape[0]:
        raise ParameterError("counts", f"IBU got {counts.shape[-1]} counts for "
                                       f"{channel.design.shape[0]} observations")
    if not 0.0 <= channel.low < channel.high <= 1.0:
        raise ParameterError("channel", f"IBU needs 0 <= low < high <= 1; got low = "
                                        f"{channel.low:.6g}, high = {channel.high:.6g}")
    if np.any(counts < 0) or (not channel.multinomial and np.any(counts > channel.trials)):
        raise ParameterError("counts", "IBU needs counts between 0 and their reports")
    return counts


def _log_likelihood(channel: AffineChannel, counts: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """The (composite) log-likelihood of each row of ``counts`` at its row of ``rates``."""
    rates = np.clip(rates, 1e-300, 1.0)
    total = np.sum(counts * np.log(rates), axis=-1)
    if not channel.multinomial:
        failures = channel.trials - counts
        total = total + np.sum(failures * np.log(np.clip(1.0 - rates, 1e-300, 1.0)), axis=-1)
    out: np.ndarray = np.asarray(total)
    return out


def _update(channel: AffineChannel, counts: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """One EM step (row by row): each component's share becomes its mean posterior
    responsibility over the (pseudo-)observations."""
    rates = channel.rates(shares)
    success = np.where(counts > 0, counts / np.clip(rates, 1e-300, None), 0.0)
    if channel.multinomial:
        gain = (channel.low * success.sum(axis=-1, keepdims=True)
                + channel.spread * channel.adjoint(success))
    else:
        failure_counts = channel.trials - counts
        failure = np.where(failure_counts > 0,
                           failure_counts / np.clip(1.0 - rates, 1e-300, None), 0.0)
        gain = (channel.low * success.sum(axis=-1, keepdims=True)
                + (1.0 - channel.low) * failure.sum(axis=-1, keepdims=True)
                + channel.spread * channel.adjoint(success - failure))
    new = shares * gain
    normalized: np.ndarray = new / new.sum(axis=-1, keepdims=True)
    return normalized


def ibu(channel: AffineChannel, counts: np.ndarray, start: np.ndarray | None = None,
        tol: float = TOLERANCE, max_steps: int = MAX_STEPS) -> IbuFit:
    """IBU's shares of ``channel``'s components from the observations' ``counts``.

    ``start`` (positive, one per component) defaults to the uniform shares; a component
    at 0 stays there, so a start must be positive wherever a share may be."""
    counts = _check(channel, np.asarray(counts, dtype=float).reshape(-1))
    fit = ibu_batch(channel, counts[None, :], None if start is None else np.atleast_2d(start),
                    tol, max_steps)
    return IbuFit(fit.shares[0], fit.steps, fit.converged, float(fit.log_likelihood))


def ibu_batch(channel: AffineChannel, counts: np.ndarray, start: np.ndarray | None = None,
              tol: float = TOLERANCE, max_steps: int = MAX_STEPS) -> IbuFit:
    """:func:`ibu` of every row of ``counts`` at once (``start``: a row per fit, or one
    for all); ``steps`` is the most any row took, ``converged`` whether every row did,
    ``log_likelihood`` their sum. Each row stops on its own."""
    counts = _check(channel, np.atleast_2d(counts))
    rows, size = counts.shape[0], channel.components
    if start is None:
        shares = np.full((rows, size), 1.0 / size)
    else:
        shares = np.clip(np.asarray(start, dtype=float), 0.0, None)
        if shares.shape[-1] != size or not np.all(shares.sum(axis=-1) > 0):
            raise ParameterError("start", f"IBU's start needs {size} non-negative shares")
        shares = np.broadcast_to(shares / shares.sum(axis=-1, keepdims=True), (rows, size)).copy()
    current = _log_likelihood(channel, counts, channel.rates(shares))
    scale = np.maximum(np.abs(current), 1.0)
    active = np.ones(rows, dtype=bool)
    step = 0
    while active.any() and step < max_steps:
        step += 1
        moved, likelihood = _squarem_step(channel, counts[active], shares[active],
                                          current[active])
        done = likelihood - current[active] <= tol * scale[active]
        shares[active], current[active] = moved, likelihood
        active[np.flatnonzero(active)[done]] = False
    return IbuFit(shares, step, not active.any(), float(current.sum()))


def _squarem_step(channel: AffineChannel, counts: np.ndarray, shares: np.ndarray,
                  current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One SQUAREM (S3) step from each row of ``shares``: two updates, an extrapolation
    along them and one update from there; the plain second update where that lowers the
    likelihood."""
    first = _update(channel, counts, shares)
    second = _update(channel, counts, first)
    plain = _log_likelihood(channel, counts, channel.rates(second))
    jump = _update(channel, counts, extrapolate(shares, first, second))
    likelihood = _log_likelihood(channel, counts, channel.rates(jump))
    curved = np.linalg.norm(second - 2 * first + shares, axis=1) > 0
    better = curved & np.isfinite(likelihood) & (likelihood >= np.maximum(plain, current))
    out = np.where(better[:, None], jump, second)
    return out, np.where(better, likelihood, plain)


def simplex_start(unbiased: np.ndarray, background: float | None = None) -> np.ndarray:
    """A positive start for :func:`ibu` near an unbiased estimate: its shares clipped at 0
    (the background's too, when given), mixed half and half with the uniform shares, so
    every component can still grow."""
    shares = np.clip(np.asarray(unbiased, dtype=float), 0.0, None)
    if background is not None:
        shares = np.append(shares, max(float(background), 0.0))
    total = float(shares.sum())
    uniform = np.full(shares.size, 1.0 / shares.size)
    if not total > 0:
        return uniform
    out: np.ndarray = 0.5 * shares / total + 0.5 * uniform
    return out


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """Bootstrap standard errors and percentile intervals of IBU's shares (one per
    component), from ``replicates`` refits."""

    std_errors: np.ndarray
    low: np.ndarray
    high: np.ndarray
    replicates: int


def bootstrap(channel: AffineChannel, fit: IbuFit, confidence: float,
              rng: np.random.Generator, replicates: int = REPLICATES,
              tol: float = TOLERANCE) -> Bootstrap:
    """Standard errors (the replicates' standard deviation) and percentile ``confidence``
    intervals of ``fit`` (see the module docstring), from ``replicates`` draws of the
    statistic under the oracle's law at the fitted shares, all refitted at once."""
    counts = np.stack([draw_counts(channel, fit.shares, rng) for _ in range(replicates)])
    estimates = ibu_batch(channel, counts, np.clip(fit.shares, 1e-6, None), tol).shares
    tail = (1 - confidence) / 2
    low, high = np.quantile(estimates, [tail, 1 - tail], axis=0)
    return Bootstrap(estimates.std(axis=0, ddof=1), low, high, replicates)


def draw_counts(channel: AffineChannel, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw of the observations' counts under the oracle's law at ``shares``.

    Each cohort's reports are split among the components (multinomial: the sampling of
    the installations); given that split, observation ``o`` counts a binomial of the
    reports whose value carries it (probability ``high``), one of the reports of the
    other listed values (``low``) and one of the background's reports. Multinomial
    counts (GRR, FLH, HCMS): every report lands in one observation, independently, with
    the probabilities :meth:`AffineChannel.rates` gives at ``shares`` (the composition
    then each report's landing, in one draw).
    """
    cohorts = channel.cohorts if channel.cohorts is not None else np.zeros(
        channel.design.shape[0], dtype=np.int64)
    shares = np.clip(shares, 0.0, None) / float(np.clip(shares, 0.0, None).sum())
    spread = channel.spread
    values = channel.design.shape[1]
    if channel.multinomial:
        landed: np.ndarray = rng.multinomial(round(float(channel.trials[0])),
                                             channel.rates(shares)).astype(float)
        return landed
    count_of = np.bincount(cohorts)
    cohort_reports = np.zeros(count_of.size)
    np.maximum.at(cohort_reports, cohorts, channel.trials)
    compositions = np.stack([rng.multinomial(round(float(n)), shares) for n in cohort_reports])
    # the design's ones per observation: reports of listed values that carry it
    carried = _cohort_products(channel.design, compositions[:, :values].T, cohorts)
    trials = channel.trials
    background = compositions[cohorts, values] if channel.background_rate is not None else 0
    others = trials - carried - background
    out = rng.binomial(carried.astype(np.int64), channel.high) + rng.binomial(
        others.astype(np.int64), channel.low)
    if channel.background_rate is not None:
        out = out + rng.binomial(np.asarray(background, dtype=np.int64),
                                 channel.low + spread * channel.background_rate)
    result: np.ndarray = out.astype(float)
    return result


def _cohort_products(design: sp.csc_matrix, composition: Any, cohorts: np.ndarray) -> np.ndarray:
    """``sum_x design[o, x] * composition[x, cohort(o)]`` for every observation ``o``."""
    products = np.asarray(design @ composition)
    out: np.ndarray = np.rint(products[np.arange(design.shape[0]), cohorts])
    return out


#: how the intervals of :func:`estimate` are made (the summary's ``interval``)
BOOTSTRAP_INTERVAL = ("parametric bootstrap, percentile interval, down to 0 where the "
                      "unbiased share is not significant (docs/analysis.md, \"Choosing an "
                      "estimator\")")


@dataclasses.dataclass(frozen=True)
class IbuEstimate:
    """IBU's fit with the spread of its shares: what a decoder's table and summary show.
    ``spread`` holds the standard errors and intervals; its ``replicates`` are 0 when they
    come from the observed information rather than a bootstrap, and ``interval`` says how
    they were made."""

    fit: IbuFit
    spread: Bootstrap
    interval: str = BOOTSTRAP_INTERVAL

    def summary_fields(self) -> dict[str, Any]:
        """The summary's account of the estimator: its name, steps, convergence and how its
        intervals were made (with the bootstrap's replicates when there was one)."""
        fields: dict[str, Any] = {
            "estimator": "ibu",
            "ibu_steps": self.fit.steps,
            "ibu_converged": self.fit.converged,
        }
        if self.spread.replicates:
            fields["bootstrap_replicates"] = self.spread.replicates
        fields["interval"] = self.interval
        return fields


def estimate(channel: AffineChannel, counts: np.ndarray, unbiased: np.ndarray,
             unbiased_se: np.ndarray, confidence: float, background: float | None = None,
             replicates: int = REPLICATES,
             spread_of: Callable[[IbuFit], Bootstrap] | None = None,
             interval: str = BOOTSTRAP_INTERVAL) -> IbuEstimate:
    """IBU from a start near the ``unbiased`` shares (and ``background`` share), with its
    intervals: by default the bootstrap's (``replicates``), or those ``spread_of`` gives for
    the fit (``interval`` says how they are made). An interval reaches down to 0 wherever
    the unbiased share (standard errors ``unbiased_se``; the background's interval is left
    as given) is not above 0 at the interval's one-sided level. IBU's shares are never 0,
    so no percentile interval would hold a share that is 0; the test says when the data
    cannot tell the share from 0. The bootstrap's generator is seeded by the counts, so
    a decode repeats."""
    counts = np.asarray(counts, dtype=float).reshape(-1)
    fit = ibu(channel, counts, start=simplex_start(unbiased, background))
    if spread_of is None:
        seed = zlib.crc32(np.ascontiguousarray(counts).tobytes())
        spread = bootstrap(channel, fit, confidence, np.random.default_rng(seed), replicates)
    else:
        spread = spread_of(fit)
    listed = np.asarray(unbiased, dtype=float)
    se = np.asarray(unbiased_se, dtype=float)
    undecided = ~(listed > z_quantile(confidence) * se)
    low = spread.low.copy()
    low[: listed.size][undecided] = 0.0
    return IbuEstimate(fit, dataclasses.replace(spread, low=low), interval)


def with_ibu_shares(rows: list[dict[str, Any]], found: IbuEstimate, total: int,
                    order: np.ndarray | None = None) -> list[dict[str, Any]]:
    """``rows`` (built from the unbiased estimate: their p-values test it) with IBU's share,
    standard error and interval in place of the unbiased ones; row ``i`` shows component
    ``order[i]`` (default: component ``i``)."""
    index = np.arange(len(rows)) if order is None else np.asarray(order)
    out = []
    for row, component in zip(rows, index, strict=True):
        share = float(found.fit.shares[component])
        se = float(found.spread.std_errors[component])
        low, high = float(found.spread.low[component]), float(found.spread.high[component])
        changed = {"proportion": share, "prop_std_error": se, "prop_low_95": low,
                   "prop_high_95": high, "estimate": share * total, "std_error": se * total,
                   "low_95": low * total, "high_95": high * total}
        out.append({name: changed.get(name, value) for name, value in row.items()})
    return out


def rows_with_ibu(rows: list[dict[str, Any]], found: IbuEstimate, components: np.ndarray,
                  candidates: list[str], total: int) -> list[dict[str, Any]]:
    """A string table's ``rows`` with IBU's shares for the candidates it covers (component
    ``i`` is candidate ``components[i]``); a candidate outside the fit keeps its row: IBU
    gives it no share."""
    position = {candidates[int(component)]: index for index, component in enumerate(components)}
    out = []
    for row in rows:
        index = position.get(row["string"])
        out.append(row if index is None
                   else with_ibu_shares([row], found, total, np.array([index]))[0])
    return out
