"""``veil experiment calibration``: do the stated standard errors and 95% intervals mean
what docs/analysis.md says, for every closed-form decoder, over N and epsilon?

The estimand is the population's: each of ``N`` installations draws its value from a
fixed population and sends one report, so the composition of a collection is itself
random, and an interval should cover the *population* share (or mean) 95% of the time
over collections. Each :class:`CalibrationCase` draws ``runs`` such collections per
(N, epsilon) and decodes each with the project's :func:`~veil.server.analysis.decode_counts`;
:func:`calibrate` turns them into one :class:`Cell` per estimated quantity with

* ``se_ratio``: root mean square stated standard error over the observed standard
  deviation of the estimates (1 is right); its Monte Carlo error ``se_ratio_mc`` is
  ``se_ratio / sqrt(2 (runs - 1))``, the relative standard error of a sample standard
  deviation (the chi distribution, normal estimates);
* ``coverage``: share of 95% intervals holding the truth, Monte Carlo error
  ``sqrt(c (1 - c) / runs)``;
* ``bias_z``: the mean error over its standard error ``rms(se) / sqrt(runs)``.

A cell is in its band when the stated standard error is within 10% of the observed
spread and the coverage is in 93-97%; :meth:`Cell.problems` accepts a departure of up to
:data:`ALLOWANCE` Monte Carlo errors beyond the band (the binomial error at 95%,
``sqrt(0.95 * 0.05 / runs)``, for the coverage).

How each case draws its statistic (exact laws; seeded NumPy randomness, never production
noise):

* RAPPOR categories: the composition ``Multinomial(N, shares)``, then the set-bit counts
  with :func:`~veil.simulations.encoding.aggregate_categories` (binomial counts given it).
* GRR, OUE, OLH, Hadamard: the composition, then the oracle's statistic sampler
  :func:`~veil.simulations.oracle_encoding.simulate_oracle_counts` (the SDK's law of one
  report per installation: permanent then instantaneous response), for the one-shot
  design (``report_epsilon = epsilon``) and the default one (``epsilon / 2``).
* Booleans: the yes count is ``Binomial(N, rho)``, ``rho = s y1 + (1 - s) y0``: each
  report is yes with that probability, independently.
* Numbers, 1bitmean: the count of ones is ``Binomial(N, E_j[N(j)] / 2^32)`` over the
  population's grid points ``j``.
* Numbers, laplace and gaussian: a report is ``low + step (j + Z)`` with integer grid
  point ``j`` and discrete noise ``Z`` (cut at ``noise_bound``, beyond which its tail is
  below 2^-64), so the histogram of the reports is ``Multinomial(N, law of j + Z)`` (the
  convolution) and the sum and sum of squares follow from it exactly.

Further decoders join through :func:`register`: a case is a name and a ``draw`` function
returning :class:`Draws` (estimates and stated standard errors of ``runs`` collections,
and the truth) for a number of reports and an epsilon.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.counts import CountsArrays
from veil.shared.bits import PROB_ONE
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    GrrParams,
    HadamardParams,
    MechanismParams,
    NumberParams,
    OlhParams,
    OracleParams,
    OueParams,
)
from veil.shared.statistics import statistic_for
from veil.simulations.encoding import aggregate_categories
from veil.simulations.oracle_encoding import simulate_oracle_counts
from veil.simulations.report import Results, new_figure, progress

#: the grid: reports per collection and epsilon
REPORTS = (1_000, 10_000, 100_000, 1_000_000)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
#: collections per cell of the full grid
RUNS = 2_000
#: the reduced grid the test suite runs (``quick``), and its collections per cell
QUICK_REPORTS = (1_000, 100_000)
QUICK_EPSILONS = (0.5, 4.0)
QUICK_RUNS = 2_000
#: the bands: stated standard error within 10% of the observed spread, coverage 93-97%
SE_BAND = 0.10
COVERAGE_BAND = (0.93, 0.97)
#: Monte Carlo errors a cell may stray beyond its band. A calibrated cell sits at the
#: band's centre, ``0.10 / se_ratio_mc`` (6.3 at 2,000 runs) and ``0.02 / coverage_mc``
#: (4.1 at 2,000 runs) errors from its edge, so it fails only beyond 9.3 / 7.1 errors
ALLOWANCE = 3.0
#: the population: category shares (an absent category last), true share of the
#: booleans, and numbers' grid points Binomial(resolution, GRID_SHARE) over [low, high]
CATEGORY_SHARES = (0.4, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.0)
TRUE_SHARE = 0.3
GRID_SHARE = 0.3
NUMBER_RANGE = (0.0, 10.0)
#: the two-sided 95% normal quantile
Z95 = 1.959963984540054
#: the label of the shares' sum (``allocated_proportion_unbiased``, truth 1)
ALLOCATED = "sum of shares"


@dataclasses.dataclass(frozen=True)
class Draws:
    """``runs`` decoded collections: ``estimates`` and stated ``std_errors`` (``runs x
    quantities``) of the quantities ``labels``, whose true values are ``truth``."""

    labels: tuple[str, ...]
    truth: np.ndarray
    estimates: np.ndarray
    std_errors: np.ndarray


@dataclasses.dataclass(frozen=True)
class CalibrationCase:
    """A decoder in one design: ``draw(reports, epsilon, runs, rng)`` decodes ``runs``
    collections of ``reports`` reports at ``epsilon`` (:class:`Draws`)."""

    name: str
    draw: Callable[[int, float, int, np.random.Generator], Draws]


#: the cases of the grid, by name (:func:`register` adds one)
CASES: dict[str, CalibrationCase] = {}


def register(case: CalibrationCase) -> CalibrationCase:
    """Add ``case`` to :data:`CASES` (its name must be new); return it."""
    if case.name in CASES:
        raise ValueError(f"calibration case {case.name!r} is registered twice")
    CASES[case.name] = case
    return case


@dataclasses.dataclass(frozen=True)
class Cell:
    """The calibration of one quantity of one case at one (reports, epsilon) (see the
    module docstring). ``exact`` marks a quantity known without error (the stated
    standard error is 0 and every estimate equals the truth): it has no ratio."""

    case: str
    reports: int
    epsilon: float
    quantity: str
    truth: float
    runs: int
    se_ratio: float
    se_ratio_mc: float
    coverage: float
    coverage_mc: float
    bias_z: float
    exact: bool = False

    def problems(self, allowance: float = ALLOWANCE) -> list[str]:
        """Why the cell leaves its band by more than ``allowance`` Monte Carlo errors."""
        if self.exact:
            return []
        where = f"{self.case}, N={self.reports}, epsilon={self.epsilon:g}, {self.quantity}"
        out = []
        if abs(self.se_ratio - 1) > SE_BAND + allowance * self.se_ratio_mc:
            out.append(f"{where}: SE ratio {self.se_ratio:.3f} (Monte Carlo error "
                       f"{self.se_ratio_mc:.3f})")
        binomial = math.sqrt(0.95 * 0.05 / self.runs)
        low, high = COVERAGE_BAND
        if not low - allowance * binomial <= self.coverage <= high + allowance * binomial:
            out.append(f"{where}: coverage {self.coverage:.4f} (Monte Carlo error "
                       f"{binomial:.4f})")
        return out

    def as_row(self) -> dict[str, Any]:
        """The cell as a flat row (``metrics.csv``)."""
        return dataclasses.asdict(self)


def cells_of(case: str, reports: int, epsilon: float, draws: Draws) -> list[Cell]:
    """One :class:`Cell` per quantity of ``draws``."""
    runs = draws.estimates.shape[0]
    errors = draws.estimates - draws.truth
    stated = np.sqrt(np.mean(draws.std_errors**2, axis=0))
    spread = draws.estimates.std(axis=0, ddof=1)
    covered = np.abs(errors) <= Z95 * draws.std_errors + 1e-9
    cells = []
    for i, label in enumerate(draws.labels):
        exact = bool(stated[i] == 0 and np.all(np.abs(errors[:, i]) <= 1e-9))
        ratio = math.nan if exact else float(stated[i] / spread[i])
        coverage = float(covered[:, i].mean())
        bias = float(errors[:, i].mean() / (stated[i] / math.sqrt(runs))) if stated[i] else 0.0
        cells.append(Cell(case, reports, epsilon, label, float(draws.truth[i]), runs, ratio,
                          ratio / math.sqrt(2 * (runs - 1)),
                          coverage, math.sqrt(coverage * (1 - coverage) / runs), bias, exact))
    return cells


def cell_seed(seed: int, case: str, reports: int, epsilon: float) -> np.random.Generator:
    """The generator of one cell: from ``seed``, the case's name, N and epsilon, so a cell's
    draws do not depend on which other cells run."""
    return np.random.default_rng([seed, zlib.crc32(case.encode()), reports,
                                  round(epsilon * 1000)])


def calibrate(cases: Sequence[CalibrationCase] | None = None,
              reports: Sequence[int] = REPORTS, epsilons: Sequence[float] = EPSILONS,
              runs: int = RUNS, seed: int = 1) -> list[Cell]:
    """Every cell of ``cases`` (default: all registered) over ``reports x epsilons``."""
    chosen = list(CASES.values()) if cases is None else list(cases)
    grid = [(case, n, eps) for case in chosen for n in reports for eps in epsilons]
    cells: list[Cell] = []
    for case, n, eps in progress(grid, "calibration"):
        draws = case.draw(n, eps, runs, cell_seed(seed, case.name, n, eps))
        cells.extend(cells_of(case.name, n, eps, draws))
    return cells


# ---------------------------------------------------------------- the cases


def _decode(params: MechanismParams, reports: int, *counts: np.ndarray | np.number[Any]) -> Any:
    """:func:`decode_counts` of one collection (one cohort) with the statistic's fields."""
    fields = {field.name: np.asarray(value)[None, ...]
              for field, value in zip(statistic_for(params).fields, counts, strict=True)}
    return decode_counts(CountsArrays("m", params, np.array([reports]), fields,
                                      source="calibration"))


def _category_labels(d: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(d))


def _shares_draws(params: CategoryParams | OracleParams, runs: int,
                  decode_one: Callable[[], Any]) -> Draws:
    """Draws of the category shares and their sum, ``decode_one()`` decoding a collection."""
    d = len(CATEGORY_SHARES)
    estimates, std_errors = np.zeros((runs, d + 1)), np.zeros((runs, d + 1))
    for run in range(runs):
        result = decode_one()
        summary = result.summary
        estimates[run] = [*result.column("proportion"), summary["allocated_proportion_unbiased"]]
        std_errors[run] = [*result.column("prop_std_error"),
                           summary["allocated_proportion_std_error"]]
    return Draws((*params.categories, ALLOCATED), np.array([*CATEGORY_SHARES, 1.0]),
                 estimates, std_errors)


def _rappor_categories(reports: int, epsilon: float, runs: int,
                       rng: np.random.Generator) -> Draws:
    params = CategoryParams.for_epsilon(_category_labels(len(CATEGORY_SHARES)), epsilon)

    def one() -> Any:
        total, ones = aggregate_categories(params, rng.multinomial(reports, CATEGORY_SHARES), rng)
        return _decode(params, total, ones)

    return _shares_draws(params, runs, one)


def _oracle_case(oracle: type[OracleParams], one_shot: bool) -> CalibrationCase:
    """The case of ``oracle`` in one design: one-shot (``report_epsilon = epsilon``) or
    the default (``report_epsilon = epsilon / 2``)."""

    def draw(reports: int, epsilon: float, runs: int, rng: np.random.Generator) -> Draws:
        params = oracle(categories=_category_labels(len(CATEGORY_SHARES)), epsilon=epsilon,
                        report_epsilon=epsilon if one_shot else None)

        def one() -> Any:
            composition = rng.multinomial(reports, CATEGORY_SHARES)
            return _decode(params, reports, simulate_oracle_counts(params, composition, rng))

        return _shares_draws(params, runs, one)

    design = "one-shot" if one_shot else "default"
    return CalibrationCase(f"{oracle.oracle} ({design})", draw)


def _booleans(reports: int, epsilon: float, runs: int, rng: np.random.Generator) -> Draws:
    params = BooleanParams.for_epsilon(epsilon)
    yes_if_false, yes_if_true = params.yes_probs
    rate = TRUE_SHARE * yes_if_true + (1 - TRUE_SHARE) * yes_if_false
    estimates, std_errors = np.zeros((runs, 1)), np.zeros((runs, 1))
    for run, ones in enumerate(rng.binomial(reports, rate, size=runs)):
        row = _decode(params, reports, np.int64(ones)).rows[0]
        estimates[run], std_errors[run] = row["proportion"], row["prop_std_error"]
    return Draws(("true share",), np.array([TRUE_SHARE]), estimates, std_errors)


def _grid_pmf(params: NumberParams) -> np.ndarray:
    """The population's grid points: ``Binomial(resolution, GRID_SHARE)``."""
    from scipy import stats

    return np.asarray(stats.binom.pmf(np.arange(params.resolution + 1), params.resolution,
                                      GRID_SHARE))


def _report_law(params: NumberParams) -> tuple[np.ndarray, np.ndarray]:
    """Support (grid steps) and probabilities of ``j + Z``, the population's grid point plus
    the mechanism's discrete noise as the encoder draws it."""
    bound = params.noise_bound
    noise = np.arange(-bound, bound + 1).astype(float)
    if params.mechanism == "laplace":
        noise_pmf = np.exp(-np.abs(noise) / params.laplace_scale)
    else:  # the encoder draws with variance (sigma (1 + 1e-12))^2 (veil.simulations.encoding)
        sigma = params.gaussian_sigma * (1 + 1e-12)
        noise_pmf = np.exp(-(noise**2) / (2 * sigma**2))
    pmf = np.convolve(_grid_pmf(params), noise_pmf / noise_pmf.sum())
    return np.arange(-bound, bound + params.resolution + 1), pmf / pmf.sum()


def _number_case(mechanism: str) -> CalibrationCase:
    """The mean of bounded numbers with ``mechanism``."""

    def draw(reports: int, epsilon: float, runs: int, rng: np.random.Generator) -> Draws:
        low, high = NUMBER_RANGE
        params = NumberParams(low=low, high=high, mechanism=mechanism, epsilon=epsilon,
                              delta=1e-6 if mechanism == "gaussian" else None)
        collections: list[tuple[np.number[Any], ...]]
        if mechanism == "1bitmean":
            numerators = np.array([params.one_bit_numerator(j)
                                   for j in range(params.resolution + 1)], dtype=float)
            rate = float(_grid_pmf(params) @ numerators) / PROB_ONE
            collections = [(np.int64(ones),) for ones in rng.binomial(reports, rate, size=runs)]
        else:
            steps, pmf = _report_law(params)
            values = params.low + params.step * steps
            collections = [(np.float64(h @ values), np.float64(h @ values**2))
                           for h in rng.multinomial(reports, pmf, size=runs).astype(float)]
        estimates, std_errors = np.zeros((runs, 1)), np.zeros((runs, 1))
        for run, statistic in enumerate(collections):
            row = _decode(params, reports, *statistic).rows[0]
            estimates[run], std_errors[run] = row["estimate"], row["std_error"]
        return Draws(("mean",), np.array([low + (high - low) * GRID_SHARE]), estimates,
                     std_errors)

    return CalibrationCase(f"number {mechanism}", draw)


register(CalibrationCase("rappor categories", _rappor_categories))
for _oracle in (GrrParams, OueParams, OlhParams, HadamardParams):
    for _one_shot in (True, False):
        register(_oracle_case(_oracle, _one_shot))
register(CalibrationCase("boolean", _booleans))
for _mechanism in ("laplace", "gaussian", "1bitmean"):
    register(_number_case(_mechanism))


# ---------------------------------------------------------------- table, plot, experiment


def _span(values: Sequence[float], digits: int) -> str:
    """``low-high`` of ``values`` to ``digits`` decimals (one number when they agree)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def markdown_table(cells: Sequence[Cell]) -> str:
    """One row per (case, N), one column per epsilon: the SE ratios and coverages (in %)
    of the case's quantities, as the range from lowest to highest."""
    epsilons = sorted({cell.epsilon for cell in cells})
    keys = list(dict.fromkeys((cell.case, cell.reports) for cell in cells))
    lines = ["| case | N | " + " | ".join(f"ε = {eps:g}" for eps in epsilons) + " |",
             "|---|---|" + "---|" * len(epsilons)]
    for case, reports in keys:
        entries = []
        for eps in epsilons:
            chosen = [c for c in cells if (c.case, c.reports, c.epsilon) == (case, reports, eps)
                      and not c.exact]
            if not chosen:
                entries.append("")
                continue
            entries.append(f"{_span([c.se_ratio for c in chosen], 2)} / "
                           f"{_span([100 * c.coverage for c in chosen], 1)}")
        lines.append(f"| {case} | {reports:,} | " + " | ".join(entries) + " |")
    return "\n".join(lines)


def calibration_figure(cells: Sequence[Cell]) -> Any:
    """SE ratio (top) and coverage (bottom) against epsilon, one panel per N, one colour per
    case, every quantity a dot; the bands shaded."""
    import matplotlib

    reports = sorted({cell.reports for cell in cells})
    cases = list(dict.fromkeys(cell.case for cell in cells))
    colors = matplotlib.colormaps["tab20"]
    figure = new_figure(10.0, 5.8)
    axes = figure.subplots(2, len(reports), sharey="row", squeeze=False)
    for column, n in enumerate(reports):
        top, bottom = axes[0][column], axes[1][column]
        top.axhspan(1 - SE_BAND, 1 + SE_BAND, color="0.9")
        bottom.axhspan(100 * COVERAGE_BAND[0], 100 * COVERAGE_BAND[1], color="0.9")
        for i, case in enumerate(cases):
            chosen = [c for c in cells if c.case == case and c.reports == n and not c.exact]
            offset = (i - len(cases) / 2) * 0.012
            x = [c.epsilon * math.exp(offset) for c in chosen]
            top.semilogx(x, [c.se_ratio for c in chosen], "o", ms=2.5, color=colors(i),
                         label=case)
            bottom.semilogx(x, [100 * c.coverage for c in chosen], "o", ms=2.5, color=colors(i))
        top.set_title(f"N = {n:,}", fontsize=9)
        bottom.set_xlabel("ε")
        for axis in (top, bottom):
            axis.set_xticks(sorted({c.epsilon for c in cells}),
                            labels=[f"{e:g}" for e in sorted({c.epsilon for c in cells})])
            axis.minorticks_off()
    axes[0][0].set_ylabel("stated SE ÷ observed SD")
    axes[1][0].set_ylabel("95% interval coverage (%)")
    figure.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right center",
                  fontsize=7, frameon=False, markerscale=2)
    return figure


def calibration(quick: bool = False, seed: int = 1) -> Results:
    """The calibration grid (:data:`REPORTS` x :data:`EPSILONS`, :data:`RUNS` collections a
    cell; with ``quick`` the test suite's reduced grid) over every registered case."""
    runs = QUICK_RUNS if quick else RUNS
    cells = calibrate(reports=QUICK_REPORTS if quick else REPORTS,
                      epsilons=QUICK_EPSILONS if quick else EPSILONS, runs=runs, seed=seed)
    outside = [problem for cell in cells for problem in cell.problems()]
    notes = [
        f"{runs:,} collections per cell, each of N installations drawing their value from "
        "the population (category shares "
        f"{', '.join(f'{s:g}' for s in CATEGORY_SHARES)}; booleans true with {TRUE_SHARE:g}; "
        f"numbers on [{NUMBER_RANGE[0]:g}, {NUMBER_RANGE[1]:g}], grid points "
        f"Binomial(64, {GRID_SHARE:g})) and sending one report, decoded with decode_counts. "
        "se_ratio is the root mean square stated standard error over the observed standard "
        "deviation; coverage the share of 95% intervals holding the population value. "
        "'sum of shares' is allocated_proportion_unbiased (truth 1); GRR's is exactly 1 "
        "(exact = True).",
        f"Cells outside their band by more than {ALLOWANCE:g} Monte Carlo errors: "
        + ("; ".join(outside) if outside else "none") + ".",
    ]
    return Results("calibration", "Calibration of standard errors and 95% intervals",
                   [cell.as_row() for cell in cells], {"calibration": calibration_figure(cells)},
                   notes)
