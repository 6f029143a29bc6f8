"""Decoders of the hashed string oracles, FLH and HCMS (:mod:`veil.shared.kinds.string_oracles`).

Both reduce the statistic to **cell counts**: for each hash function ``j`` (the cohort)
and bucket ``b``, an unbiased estimate ``t[j, b]`` of how many of cohort ``j``'s reports
carry a value that ``h_j`` sends to ``b``:

* FLH, from the counts ``T[j, b]`` of reported buckets, with ``P1``/``P0`` the
  probabilities that a report names its value's bucket / one given other bucket:
  ``t[j, b] = (T[j, b] - N_j P0) / (P1 - P0)``;
* HCMS, from the counts of (coefficient ``l``, bit) per row: with ``D_j[l]`` the reports
  of bit 0 less those of bit 1 and ``P`` the probability that the bit is the value's
  Hadamard sign, ``t[j, .] = WHT(D_j) / (2P - 1)`` (each report contributes
  ``+-H[l, b] / (2P - 1)``, whose mean over the uniform ``l`` is ``1[h_j(x) = b]``).

Each report contributes to ``t[j, h_j(x)]`` a term ``X_r(x)`` whose mean is the share of
values it hashes together with ``x``. The estimate of a candidate ``x`` is

``s'_x = (sum_j t[j, h_j(x)] / N - 1/B) / (1 - 1/B)``

with ``B`` the buckets; over the hash functions ``E[s'_x] = s_x + sum_{y != x} s_y
e_xy / (1 - 1/B)`` where ``e_xy = c_xy - 1/B`` and ``c_xy`` is the share of reports
whose function puts ``x`` and ``y`` in one bucket. For a pool of hash functions ``e``
is not 0 (it is of order ``1/sqrt(B x functions)``), and a common value would bias every
other candidate's estimate by far more than the sampling noise at large ``N``. So the
decoder solves ``(C - 11'/B) s = (1 - 1/B) s'`` over the candidates, ``C`` their
collision matrix with the cohorts' report shares as weights (positive definite: its
quadratic form is ``sum_j w_j sum_b (sum_{h_j(x) = b} v_x)^2 - (sum v)^2 / B >= 0`` by
Cauchy-Schwarz), by conjugate gradients: each product costs one scatter and one gather
over (candidates x functions), never a report. Values missing from the list still add
noise of mean 0 and variance ``sum_missing s_y^2 / (B x functions)`` per candidate.

The estimand is the population share (docs/analysis.md, "What the error bars mean"):
reports are independent given their cohorts' sizes, so ``Var(sum_r X_r) = sum_j N_j
Var_j(X)``, estimated per cohort with the unbiased sample variance from ``sum X`` (the
cell count) and ``sum X^2`` (FLH: from ``T[j, h_j(x)]``; HCMS: ``N_j / (2P - 1)^2``).
A cohort of one report has no sample variance (its term would be 0, and with a pool of
2^16 cells and a thousand reports nearly every report is alone in its cohort: the stated
errors were a fifth of the spread): each such report adds the pooled sample variance of
all reports instead (:func:`cohort_variance`), which exceeds the within-cohort variance by
the spread of the cohorts' means only (the collisions' share, a few percent).
The stated standard error is that of ``s'`` times the solve's inflation
:func:`solve_inflation`, ``1 / (1 - candidates / (B x functions (1 - 1/B)))`` (least
squares over a random design); docs/strings.md measures where it holds.
The missing share, 1 less the detected strings' sum, has the variance of the sum of
their terms, ``Z_r = sum_{x in D} X_r(x)``, a function of the payload computed per
cohort from the counts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from veil.server.analysis.closed_form import sample_summary
from veil.server.analysis.cost import privacy_cost
from veil.server.analysis.decoders import (
    DEFAULT_OPTIONS,
    DecodeOptions,
    check_estimator,
    decodes,
)
from veil.server.analysis.ibu import rows_with_ibu
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import (
    adjust_p_values,
    check_correction,
    check_level,
    flat_cells,
    one_sided_p_values,
    walsh_hadamard_rows,
)
from veil.server.analysis.string_oracle_ibu import oracle_ibu
from veil.server.analysis.string_summary import (
    allocated_fields,
    description,
    detection_fields,
    missing_fields,
)
from veil.server.analysis.tables import (
    RANKED_COLUMNS,
    STRING_COLUMNS,
    detected_table,
    ranked_table,
)
from veil.server.counts import CountsArrays
from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.hashing import value_bytes
from veil.shared.kinds import FlhParams, HcmsParams, StringOracleParams
from veil.shared.kinds.string_oracles import value_key

#: (candidate, function) pairs hashed at once (bounds the temporary arrays to some tens of MB)
CHUNK_PAIRS = 1 << 22
#: the conjugate-gradient solve stops when the residual's norm falls below this share of
#: the right-hand side's (far below the sampling noise of any estimate)
SOLVE_TOLERANCE = 1e-6
MAX_SOLVE_ITERATIONS = 200
#: most (candidate, function) pairs solved jointly: a longer list solves its largest raw
#: estimates and corrects the rest in one pass (:meth:`StringOracleDecoder._solve`)
MAX_SOLVED_PAIRS = 1 << 24
_M1, _M2, _GOLDEN = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB),
                     np.uint64(0x9E3779B97F4A7C15))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """:func:`~veil.shared.kinds.string_oracles.splitmix64`, element-wise on uint64."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def function_keys(functions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a_j, b_j)`` of hash functions ``0 .. functions - 1`` as uint64 arrays."""
    j = np.arange(functions, dtype=np.uint64)
    return _splitmix64(2 * j) | np.uint64(1), _splitmix64(2 * j + np.uint64(1))


def candidate_keys(candidates: Sequence[str]) -> np.ndarray:
    """Each candidate's 64-bit key (:func:`~veil.shared.kinds.string_oracles.value_key`)."""
    return np.fromiter((value_key(value_bytes(c)) for c in candidates), dtype=np.uint64,
                       count=len(candidates))


def candidate_buckets(params: StringOracleParams, keys: np.ndarray) -> np.ndarray:
    """``h_j(x)`` for every candidate key (rows) and function (columns), as uint16."""
    a, b = function_keys(params.hash_functions)
    n = np.uint64(params.buckets)
    out = np.empty((keys.size, a.size), dtype=np.uint16)
    step = max(1, CHUNK_PAIRS // max(a.size, 1))
    with np.errstate(over="ignore"):
        for start in range(0, keys.size, step):
            work = keys[start:start + step, None] * a[None, :]  # in place from here on
            work += b[None, :]
            work >>= np.uint64(32)
            work *= n
            work >>= np.uint64(32)
            out[start:start + step] = work
    return out


class CellModel:
    """One statistic read as cell counts ``t`` (functions x buckets) with each cohort's
    reports ``sizes``, and what the variances need (see the module docstring).

    A candidate's terms in cohort ``j`` are functions of its cell ``(j, h_j(x))`` alone, so
    each per-candidate sum over the functions is a gather from a per-cell table:
    ``cells`` (``sum X``), ``squares`` (``sum X^2``) and ``cell_variances`` (``N_j
    Var_j(X)`` of cohorts of two reports or more, :func:`within_variance`); ``singles``
    counts the cohorts of one report. Each oracle's subclass reads its payloads as cells
    (:meth:`read`); setting ``params_type`` registers it in :data:`CELL_MODELS`, and
    :meth:`of` makes the one a statistic's parameters need."""

    params_type: ClassVar[type[StringOracleParams]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "params_type" in cls.__dict__:
            CELL_MODELS.add(cls.params_type.mechanism_name, cls)

    @staticmethod
    def of(params: StringOracleParams, responses: np.ndarray) -> CellModel:
        """The cell model of ``params``'s oracle over the ``responses`` counts."""
        return CELL_MODELS.lookup(params.mechanism_name)(params, responses)

    def __init__(self, params: StringOracleParams, responses: np.ndarray) -> None:
        self.params = params
        counts = np.asarray(responses, dtype=np.float64).reshape(params.hash_functions, -1)
        self.sizes = counts.sum(axis=1)
        self.counts = counts
        self.cells = self.read(counts)
        self.squares = self.cell_squares()
        self.cell_variances = within_variance(self.cells, self.squares, self.sizes[:, None])
        self.singles = int(np.count_nonzero(self.sizes == 1))

    def read(self, counts: np.ndarray) -> np.ndarray:
        """``sum X`` of each cell (functions x buckets) from the payload counts."""
        raise NotImplementedError

    def cell_squares(self) -> np.ndarray:
        """``sum X_r^2`` of each cell's reports (functions x buckets)."""
        raise NotImplementedError

    def sum_squares(self, members: np.ndarray) -> np.ndarray:
        """``sum_r Z_r^2`` per cohort, ``Z_r`` the sum of report ``r``'s terms over the
        candidates whose buckets are the rows of ``members``."""
        functions, width = self.cells.shape
        held = np.zeros((functions, width))
        np.add.at(held, (np.broadcast_to(np.arange(functions), members.shape), members), 1.0)
        return self.held_squares(held, members.shape[0])

    def held_squares(self, held: np.ndarray, members: int) -> np.ndarray:
        """:meth:`sum_squares` from ``held[j, b]``, how many of the ``members`` candidates
        function ``j`` sends to bucket ``b``."""
        raise NotImplementedError


#: the cell model of each string oracle, by its parameters' ``mechanism_name``
CELL_MODELS: FaceRegistry[type[CellModel]] = FaceRegistry("string oracle cell model")


class FlhCells(CellModel):
    """FLH: a report in bucket ``b`` of function ``j`` adds ``(1[b = h_j(x)] - P0) /
    (P1 - P0)`` to candidate ``x``."""

    params_type = FlhParams

    def read(self, counts: np.ndarray) -> np.ndarray:
        p1, p0 = self.params.bucket_probs  # type: ignore[attr-defined]
        if not p1 > p0:
            raise _no_information(self.params)
        self.spread, self.p0 = p1 - p0, p0
        cells: np.ndarray = (counts - self.sizes[:, None] * p0) / self.spread
        return cells

    def cell_squares(self) -> np.ndarray:
        out: np.ndarray = ((self.counts * (1 - self.p0) ** 2
                            + (self.sizes[:, None] - self.counts) * self.p0**2) / self.spread**2)
        return out

    def held_squares(self, held: np.ndarray, members: int) -> np.ndarray:
        terms = (held - members * self.p0) / self.spread
        out: np.ndarray = (self.counts * terms**2).sum(axis=1)
        return out


class HcmsCells(CellModel):
    """HCMS: a report ``2 l + bit`` of row ``j`` adds ``+-H[l, h_j(x)] / (2P - 1)``, read for
    every column at once by the rows' Walsh-Hadamard transform."""

    params_type = HcmsParams

    def read(self, counts: np.ndarray) -> np.ndarray:
        self.scale = 2 * self.params.bit_kept - 1  # type: ignore[attr-defined]
        if not self.scale > 0:
            raise _no_information(self.params)
        signed = counts[:, 0::2] - counts[:, 1::2]  # D_j[l]: bit 0 is +1, bit 1 is -1
        self.signed_counts = signed
        self.by_coefficient = counts[:, 0::2] + counts[:, 1::2]
        cells: np.ndarray = walsh_hadamard_rows(signed) / self.scale
        return cells

    def cell_squares(self) -> np.ndarray:
        return np.broadcast_to((self.sizes / self.scale**2)[:, None], self.cells.shape)

    def held_squares(self, held: np.ndarray, members: int) -> np.ndarray:
        spectrum = walsh_hadamard_rows(held) / self.scale
        out: np.ndarray = (self.by_coefficient * spectrum**2).sum(axis=1)
        return out


def gather(table: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """``table[j, buckets[x, j]]`` for every candidate ``x`` (rows) and function ``j``."""
    gathered: np.ndarray = np.take(table.reshape(-1), flat_cells(buckets, table.shape[1]))
    return gathered


def _no_information(params: StringOracleParams) -> ParameterError:
    return ParameterError(
        "report_epsilon", f"{params.mechanism_name} with epsilon={params.epsilon!r}, "
                          f"report_epsilon={params.report_epsilon!r}: a report carries no "
                          "information about its value")


def within_variance(total: np.ndarray, squares: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``N_j Var_j(X)`` element-wise from a cohort's ``sum X``, ``sum X^2`` and reports, with
    the unbiased sample variance; 0 for a cohort of fewer than two reports (none defined)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = squares - total**2 / np.maximum(sizes, 1)
        out: np.ndarray = np.where(sizes > 1, np.clip(spread, 0.0, None) * sizes
                                   / np.maximum(sizes - 1, 1), 0.0)
    return out


def pooled_variance(total: np.ndarray | float, squares: np.ndarray | float, reports: float,
                    ) -> np.ndarray:
    """The sample variance of one report's term over all ``reports`` reports, from their
    ``sum X`` and ``sum X^2`` (the second moment itself for a single report)."""
    if reports <= 1:
        return np.asarray(squares, dtype=float)
    spread = np.asarray(squares, dtype=float) - np.asarray(total, dtype=float) ** 2 / reports
    out: np.ndarray = np.clip(spread, 0.0, None) / (reports - 1)
    return out


def cohort_variance(total: np.ndarray, squares: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``sum_j N_j Var_j(X)`` from each cohort's ``sum X`` and ``sum X^2`` (the last axis):
    the unbiased sample variance within each cohort of two reports or more, and for each
    cohort of one report the :func:`pooled_variance` of all reports (module docstring)."""
    out: np.ndarray = within_variance(total, squares, sizes).sum(axis=-1)
    singles = int(np.count_nonzero(sizes == 1))
    if singles:
        out = out + singles * pooled_variance(total.sum(axis=-1), squares.sum(axis=-1),
                                              float(sizes.sum()))
    return out


class CollisionSystem:
    """``(C - 11'/B) / (1 - 1/B)`` over the candidates as an operator (module docstring).

    Each product is one scatter of the candidates' values over the cells and one gather,
    through the (candidate, function) cells' flat indices: computed once for at most
    :data:`MAX_SOLVED_PAIRS` pairs (the joint solve's, reused by every iteration), per chunk
    of candidates beyond, so that memory stays bounded."""

    def __init__(self, buckets: np.ndarray, weights: np.ndarray, width: int) -> None:
        self.buckets = buckets
        self.weights = weights
        self.width = width
        self.functions = buckets.shape[1]
        self._step = max(1, CHUNK_PAIRS // max(self.functions, 1))
        self._flat = flat_cells(buckets, width) if buckets.size <= MAX_SOLVED_PAIRS else None

    def _chunks(self) -> list[slice]:
        return [slice(start, start + self._step)
                for start in range(0, self.buckets.shape[0], self._step)]

    def _cells(self, rows: slice) -> np.ndarray:
        if self._flat is not None:
            return self._flat[rows]
        return flat_cells(self.buckets[rows], self.width)

    def weighted_cells(self, v: np.ndarray) -> np.ndarray:
        """``w_j sum_{x: h_j(x) = b} v_x`` of every cell, flat (the scatter)."""
        cells = np.zeros(self.functions * self.width)
        for rows in self._chunks():
            cells += np.bincount(self._cells(rows).reshape(-1),
                                 weights=np.repeat(v[rows], self.functions),
                                 minlength=cells.size)
        weighted: np.ndarray = (cells.reshape(-1, self.width) * self.weights[:, None]).reshape(-1)
        return weighted

    def collisions(self, weighted: np.ndarray, total: float) -> np.ndarray:
        """The operator's rows applied to a vector whose cells are ``weighted`` and whose sum
        is ``total`` (the gather)."""
        collided = np.concatenate([np.take(weighted, self._cells(rows)).sum(axis=1)
                                   for rows in self._chunks()] or [np.zeros(0)])
        share = 1 / self.width
        out: np.ndarray = (collided - share * total) / (1 - share)
        return out

    def apply(self, v: np.ndarray) -> np.ndarray:
        """The operator times ``v``: one scatter over the cells, one gather."""
        return self.collisions(self.weighted_cells(v), float(v.sum()))

    def solve(self, rhs: np.ndarray) -> tuple[np.ndarray, int]:
        """Conjugate gradients from ``rhs`` (the system is near the identity)."""
        x = rhs.copy()
        r = rhs - self.apply(x)
        p = r.copy()
        rr = float(r @ r)
        goal = SOLVE_TOLERANCE**2 * max(float(rhs @ rhs), 1e-300)
        for iteration in range(MAX_SOLVE_ITERATIONS):
            if rr <= goal:
                return x, iteration
            q = self.apply(p)
            step = rr / float(p @ q)
            x += step * p
            r -= step * q
            new = float(r @ r)
            p = r + (new / rr) * p
            rr = new
        return x, MAX_SOLVE_ITERATIONS


def solve_inflation(params: StringOracleParams, candidates: int) -> float:
    """The factor by which the collision solve raises a candidate's variance, ``1 / (1 - c)``
    with ``c = (candidates - 1) / (cells (1 - 1/B))``: least squares over a random design of
    that many columns per independent equation (docs/strings.md gives where it holds);
    infinite when the candidates outnumber the cells."""
    c = max(candidates - 1, 0) / (params.hash_functions * params.buckets * (1 - 1 / params.buckets))
    return 1 / (1 - c) if c < 1 else float("inf")


def check_candidates(candidates: Sequence[str] | None, metric: str) -> list[str]:
    """The candidate strings, or a :class:`ParameterError` saying what to give."""
    if candidates is None:
        raise ParameterError(
            "candidates", f"metric {metric or '(unnamed)'} holds strings: give the candidate "
                          "strings to look for (a file with one per line)")
    if isinstance(candidates, str | bytes):
        raise ParameterError("candidates", "give a list of candidate strings, not one string")
    names = [str(c) for c in candidates]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ParameterError("candidates", f"candidate {name!r} is listed twice; list "
                                               "each string once")
        seen.add(name)
    if not names:
        raise ParameterError("candidates", "the candidate list is empty; give at least one")
    return names


class StringOracleDecoder:
    """Decode an FLH or HCMS string metric's counts over a candidate list.

    Configuration in the constructor, work in :meth:`fit` (scikit-learn's convention).
    After :meth:`fit`: ``result_`` (a :class:`DecodeResult` of the detected strings, the
    string decoder's shape), ``summary_``, and per candidate ``candidates_``,
    ``proportions_`` (unbiased shares, collisions removed), ``uncorrected_`` (before the
    collision solve), ``std_errors_`` (shares), ``p_values_``, ``adjusted_p_values_`` and
    ``detected_``; ``solved_`` (the candidates solved jointly) and ``solve_iterations_``.
    ``all_candidates`` makes the table list every candidate, ranked by its z (estimate
    over standard error), with ``rank`` and ``detected`` (as the Bloom decoder's ``--all``).
    ``estimator="ibu"`` shows the detected strings' shares from IBU
    (:mod:`veil.server.analysis.string_oracle_ibu`) instead of the unbiased ones.
    """

    def __init__(self, params: StringOracleParams, *,
                 correction: str = DEFAULT_OPTIONS.correction,
                 alpha: float = DEFAULT_OPTIONS.alpha,
                 confidence: float = DEFAULT_OPTIONS.confidence,
                 all_candidates: bool = DEFAULT_OPTIONS.all_candidates,
                 estimator: str = DEFAULT_OPTIONS.estimator) -> None:
        self.params = params
        self.estimator = estimator
        self.correction = correction
        self.alpha = alpha
        self.confidence = confidence
        self.all_candidates = all_candidates

    def fit(self, responses: Any, candidates: Sequence[str] | None, *,
            metric: str = "") -> StringOracleDecoder:
        """Decode the ``responses`` counts (cohorts x payloads) over ``candidates``."""
        started = time.perf_counter()
        correction = check_correction(self.correction)
        alpha = check_level(self.alpha, "alpha")
        confidence = check_level(self.confidence, "confidence")
        check_estimator(self.estimator)
        names = check_candidates(candidates, metric)
        params = self.params
        model = CellModel.of(params, responses)
        total = float(model.sizes.sum())
        if total <= 0:
            raise ParameterError("reports", f"metric {metric or '(unnamed)'} has no reports "
                                            "to decode")
        buckets = candidate_buckets(params, candidate_keys(names))
        width = params.buckets
        raw, variance = self._shares(model, buckets, total)
        estimates = self._solve(raw, buckets, model.sizes / total)
        std_errors = np.sqrt(variance)
        p_values = one_sided_p_values(estimates, std_errors)
        adjusted = adjust_p_values(p_values, correction, len(names))
        detected = adjusted < alpha
        self.candidates_, self.uncorrected_ = names, raw
        self.proportions_, self.std_errors_ = estimates, std_errors
        self.p_values_, self.adjusted_p_values_, self.detected_ = p_values, adjusted, detected
        missing_variance = (cohort_variance(
            gather(model.cells, buckets[detected]).sum(axis=0),
            model.sum_squares(buckets[detected]), model.sizes)
            / (total * (1 - 1 / width)) ** 2) if detected.any() else 0.0
        allocated = float(estimates[detected].sum())
        shown = float(np.clip(allocated, 0.0, 1.0))
        self.summary_ = {
            "kind": params.kind, "oracle": params.oracle, "reports": int(total),
            "cohorts": params.cohorts,
            "cohorts_with_reports": int(np.count_nonzero(model.sizes)),
            "buckets": width, "candidates": len(names), "detected": int(detected.sum()),
            "fit": "collision solve", "solved_jointly": int(self.solved_.size),
            "solve_iterations": self.solve_iterations_,
            "correction": correction, "alpha": alpha, "confidence": confidence,
            **allocated_fields(allocated, int(total)),
            **missing_fields(1.0 - allocated, float(np.sqrt(missing_variance)), shown,
                             confidence),
            **detection_fields(float(np.median(std_errors)), int(total), alpha, correction,
                               len(names)),
            "params": params.to_dict(), "epsilon_1": params.epsilon_1,
            "epsilon_inf": params.epsilon_inf,
            "privacy": privacy_cost(params, *params.possible_values),
            "elapsed_seconds": time.perf_counter() - started,
        }
        if self.all_candidates:  # every candidate, ranked by its evidence (z)
            columns: tuple[str, ...] = RANKED_COLUMNS
            rows = ranked_table(metric, names, estimates, std_errors, detected, int(total),
                                confidence)
        else:
            columns = STRING_COLUMNS
            rows = detected_table(metric, names, estimates, std_errors, detected, int(total),
                                  confidence)
        if self.estimator == "ibu" and detected.any():
            found = oracle_ibu(params, responses, buckets[detected], estimates[detected],
                               std_errors[detected], confidence)
            rows = rows_with_ibu(rows, found, np.flatnonzero(detected), names, int(total))
            self.summary_.update(found.summary_fields())
            self.summary_["ibu_background_share"] = float(found.fit.shares[-1])
        self.result_ = DecodeResult("string", columns, rows, self.summary_,
                                    description(self.summary_))
        return self

    def _solve(self, raw: np.ndarray, buckets: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The estimates with collisions removed: the joint solve over every candidate, or
        for a list longer than :data:`MAX_SOLVED_PAIRS` allows, over the largest raw
        estimates (``solved_``) with the rest corrected for their collisions with those in
        one pass (among the rest, collisions stay as noise, as for unlisted values)."""
        width = self.params.buckets
        solved = np.argsort(-raw, kind="stable")[: max(1, MAX_SOLVED_PAIRS // buckets.shape[1])]
        solved.sort()
        self.solved_ = solved
        estimates = raw.copy()
        system = CollisionSystem(buckets[solved], weights, width)
        estimates[solved], self.solve_iterations_ = system.solve(raw[solved])
        if solved.size < raw.size:
            rest = np.ones(raw.size, dtype=bool)
            rest[solved] = False
            weighted = system.weighted_cells(estimates[solved])
            estimates[rest] -= CollisionSystem(buckets, weights, width).collisions(
                weighted, float(estimates[solved].sum()))[rest]
        return estimates

    def _shares(self, model: CellModel, buckets: np.ndarray, total: float,
                ) -> tuple[np.ndarray, np.ndarray]:
        """``s'`` of every candidate and its variance (module docstring), in chunks."""
        width = self.params.buckets
        step = max(1, CHUNK_PAIRS // max(buckets.shape[1], 1))
        raw, variance = np.empty(buckets.shape[0]), np.empty(buckets.shape[0])
        cells, variances = model.cells.reshape(-1), model.cell_variances.reshape(-1)
        squares = np.asarray(model.squares).reshape(-1) if model.singles else None
        for start in range(0, buckets.shape[0], step):
            rows = slice(start, start + step)
            flat = flat_cells(buckets[rows], width)
            sums = np.take(cells, flat).sum(axis=1)
            raw[rows] = sums / total
            variance[rows] = np.take(variances, flat).sum(axis=1)
            if squares is not None:
                variance[rows] += model.singles * pooled_variance(
                    sums, np.take(squares, flat).sum(axis=1), total)
        shares = (raw - 1 / width) / (1 - 1 / width)
        solved = min(buckets.shape[0], max(1, MAX_SOLVED_PAIRS // buckets.shape[1]))
        inflation = solve_inflation(self.params, solved)
        return shares, inflation * variance / (total * (1 - 1 / width)) ** 2


def _decode(counts: CountsArrays, options: DecodeOptions) -> DecodeResult:
    """The decoder of FLH and HCMS string metrics over ``options.candidates``."""
    if options.candidate_map is not None:
        raise ParameterError("map", "a candidate map (map.csv) is for Bloom-filter RAPPOR "
                                    f"strings; {counts.params.mechanism_name} hashes the "
                                    "candidates itself: give the candidate strings")
    params = counts.params
    if not isinstance(params, StringOracleParams):
        raise ParameterError("params", "the string oracle decoder needs FlhParams or HcmsParams")
    decoder = StringOracleDecoder(params, correction=options.correction, alpha=options.alpha,
                                  confidence=options.confidence,
                                  all_candidates=options.all_candidates,
                                  estimator=options.estimator)
    decoder.fit(np.asarray(counts.fields["responses"]), options.candidates, metric=counts.metric)
    result = decoder.result_
    result.summary.update(sample_summary(counts))
    return result


@decodes(FlhParams)
def decode_flh(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """String shares from fast local hashing (bucket counts per hash function)."""
    return _decode(counts, options)


@decodes(HcmsParams)
def decode_hcms(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS) -> DecodeResult:
    """String shares from the Hadamard count-mean sketch ((coefficient, bit) counts per row)."""
    return _decode(counts, options)
