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
* Joint metrics: a 4 x 3 table, cells, marginals and conditionals; assigned marginals
  (``marginals = 2`` and ``3`` over four variables), every pairwise cell and one-way share
  (:mod:`~veil.simulations.calibration_joint`).
* String oracles, FLH and HCMS: the statistic's exact multinomial law over (cohort,
  payload) cells (:mod:`~veil.simulations.calibration_string_oracles`).
* Booleans: the yes count is ``Binomial(N, rho)``, ``rho = s y1 + (1 - s) y0``: each
  report is yes with that probability, independently.
* Numbers, 1bitmean: the count of ones is ``Binomial(N, E_j[N(j)] / 2^32)`` over the
  population's grid points ``j``.
* Numbers, laplace and gaussian: a report is ``low + step (j + Z)`` with integer grid
  point ``j`` and discrete noise ``Z`` (cut at ``noise_bound``, beyond which its tail is
  below 2^-64), so the histogram of the reports is ``Multinomial(N, law of j + Z)`` (the
  convolution) and the sum and sum of squares follow from it exactly.

* Strings: the population shapes of
  :data:`~veil.simulations.calibration_strings.STRING_CASES` (the google/rappor-format
  cases' and the discovery channel's, with and without mass on unlisted values), each at
  its own parameters and number of reports (its epsilon is their ``epsilon_inf``),
  :data:`STRING_RUNS` collections a cell, counts drawn exactly from the RAPPOR model and
  decoded with the string decoder: the shares of the :data:`STRING_TOP` most common
  listed values, the missing share against 1 less the true shares of the strings each
  collection detects, and the achieved false-discovery rate (a :class:`Ceiling`: the mean
  share of detected strings that are decoys may exceed the decoder's level by at most
  :data:`ALLOWANCE` standard errors of that mean). Where docs/analysis.md states that a
  quantity leaves its band on a shape (the missing share near the detection limit;
  Storey's rate with a mid-share unlisted value) the cell is flagged ``documented``, with
  a link to that text, instead of failing.

Further decoders join through :func:`register`: a case is a name and a ``draw`` function
returning :class:`Draws` (estimates and stated standard errors of ``runs`` collections,
and the truth) for a number of reports and an epsilon.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from veil.server.analysis.decoders import decode_counts
from veil.server.counts import CountsArrays
from veil.shared.bits import PROB_ONE
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    MechanismParams,
    NumberParams,
    OracleParams,
)
from veil.shared.kinds.number import NUMBER_MECHANISMS
from veil.shared.kinds.oracles.base import ORACLES
from veil.shared.kinds.string_oracles import STRING_ORACLES
from veil.shared.statistics import statistic_for
from veil.simulations.calibration_joint import draw_joint, draw_marginals
from veil.simulations.calibration_string_oracles import QUICK_POINTS as STRING_ORACLE_QUICK
from veil.simulations.calibration_string_oracles import RUNS as STRING_ORACLE_RUNS
from veil.simulations.calibration_string_oracles import draw_string_oracle
from veil.simulations.calibration_strings import (
    FDR,
    MISSING_SHARE,
    STRING_CASES,
    StringCase,
    draw_strings,
)
from veil.simulations.encoding import aggregate_categories
from veil.simulations.oracle_encoding import simulate_oracle_counts
from veil.simulations.report import progress

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
#: string population shapes (:data:`~veil.simulations.calibration_strings.STRING_CASES`):
#: collections per cell, the most common listed values whose shares are calibrated, and
#: the shapes in the reduced grid with their (small) numbers of reports
STRING_RUNS = 200
STRING_TOP = 3
QUICK_STRING_REPORTS = {"strings: defaults": 20_000, "strings: channel eps 4": 20_000}
#: where docs/analysis.md states that a string quantity leaves its band
DOCUMENTED = {
    MISSING_SHARE: "analysis.md#what-the-string-decoder-guarantees",
    FDR: "analysis.md#what-the-string-decoder-guarantees",
}
#: the two-sided 95% normal quantile
Z95 = 1.959963984540054
#: the label of the shares' sum (``allocated_proportion_unbiased``, truth 1)
ALLOCATED = "sum of shares"


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """A rate that must stay at or below ``level``: its value in each of ``runs``
    collections (``values``), e.g. the share of detected strings that are false."""

    label: str
    values: np.ndarray
    level: float


@dataclasses.dataclass(frozen=True)
class Draws:
    """``runs`` decoded collections: ``estimates`` and stated ``std_errors`` (``runs x
    quantities``) of the quantities ``labels``, whose true values are ``truth`` (one per
    quantity, or ``runs x quantities`` when the truth depends on the collection, as the
    missing share's does on which strings it detects); ``ceilings``, rates kept below a
    level; ``documented``, for a quantity that docs/analysis.md says leaves its band in
    this case, the link to where it says so."""

    labels: tuple[str, ...]
    truth: np.ndarray
    estimates: np.ndarray
    std_errors: np.ndarray
    ceilings: tuple[Ceiling, ...] = ()
    documented: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: a point of the grid: (reports, epsilon)
Point = tuple[int, float]


@dataclasses.dataclass(frozen=True)
class CalibrationCase:
    """A decoder in one design: ``draw(reports, epsilon, runs, rng)`` decodes ``runs``
    collections of ``reports`` reports at ``epsilon`` (:class:`Draws`).

    A case whose mechanism fixes its parameters (a string population shape) runs at its
    own ``points`` instead of the grid's N x epsilon, and in the reduced grid at
    ``quick_points`` (none: it is left out there); ``runs``, when given, replaces the
    grid's number of collections a cell (a string decode costs far more than a
    closed-form one)."""

    name: str
    draw: Callable[[int, float, int, np.random.Generator], Draws]
    points: tuple[Point, ...] = ()
    quick_points: tuple[Point, ...] = ()
    runs: int | None = None

    def grid(self, reports: Sequence[int], epsilons: Sequence[float],
             quick: bool = False) -> list[Point]:
        """The points this case runs at, given the grid's ``reports x epsilons``."""
        if self.points:
            return list(self.quick_points if quick else self.points)
        return [(n, eps) for n in reports for eps in epsilons]


#: the cases of the grid, by name (:func:`register` adds one)
#:
#: :meta hide-value:
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
    standard error is 0 and every estimate equals the truth): it has no ratio.

    ``kind`` is ``interval`` for an estimate with a stated standard error (``truth`` is
    then the mean of its true values, ``mean`` the mean estimate and ``mean_mc`` the Monte
    Carlo error of the mean error) or ``ceiling`` for a rate whose level is ``truth``
    (``mean`` the achieved rate, ``mean_mc`` its Monte Carlo error; no ratio or
    coverage). ``documented`` links to where docs/analysis.md says the quantity leaves
    its band in this case."""

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
    kind: str = "interval"
    mean: float = math.nan
    mean_mc: float = math.nan
    documented: str = ""

    def problems(self, allowance: float = ALLOWANCE) -> list[str]:
        """Why the cell leaves its band by more than ``allowance`` Monte Carlo errors."""
        if self.exact:
            return []
        where = f"{self.case}, N={self.reports}, epsilon={self.epsilon:g}, {self.quantity}"
        if self.kind == "ceiling":
            if self.mean > self.truth + allowance * self.mean_mc:
                return [f"{where}: {self.mean:.4f} above its level {self.truth:g} (Monte "
                        f"Carlo error {self.mean_mc:.4f})"]
            return []
        out = []
        # written so that an undefined ratio (estimates missing in some collection) is out
        if not abs(self.se_ratio - 1) <= SE_BAND + allowance * self.se_ratio_mc:
            out.append(f"{where}: SE ratio {self.se_ratio:.3f} (Monte Carlo error "
                       f"{self.se_ratio_mc:.3f})")
        binomial = math.sqrt(0.95 * 0.05 / self.runs)
        low, high = COVERAGE_BAND
        if not low - allowance * binomial <= self.coverage <= high + allowance * binomial:
            out.append(f"{where}: coverage {self.coverage:.4f} (Monte Carlo error "
                       f"{binomial:.4f})")
        return out

    def status(self, allowance: float = ALLOWANCE) -> str:
        """``in band`` (up to ``allowance`` Monte Carlo errors), ``documented`` (out of it
        where docs/analysis.md says so) or ``out of band``."""
        if not self.problems(allowance):
            return "in band"
        return "documented" if self.documented else "out of band"

    def as_row(self) -> dict[str, Any]:
        """The cell as a flat row (``metrics.csv``)."""
        return dataclasses.asdict(self)


def cells_of(case: str, reports: int, epsilon: float, draws: Draws) -> list[Cell]:
    """One :class:`Cell` per quantity and per ceiling of ``draws``. The observed spread is
    the standard deviation of the errors (the estimates' own when the truth is fixed)."""
    runs = draws.estimates.shape[0]
    truth = np.broadcast_to(draws.truth, draws.estimates.shape)
    errors = draws.estimates - truth
    stated = np.sqrt(np.mean(draws.std_errors**2, axis=0))
    spread = errors.std(axis=0, ddof=1)
    covered = np.abs(errors) <= Z95 * draws.std_errors + 1e-9
    cells = []
    for i, label in enumerate(draws.labels):
        exact = bool(stated[i] == 0 and np.all(np.abs(errors[:, i]) <= 1e-9))
        ratio = math.nan if exact else float(stated[i] / spread[i])
        coverage = float(covered[:, i].mean())
        bias = float(errors[:, i].mean() / (stated[i] / math.sqrt(runs))) if stated[i] else 0.0
        cells.append(Cell(case, reports, epsilon, label, float(truth[:, i].mean()), runs, ratio,
                          ratio / math.sqrt(2 * (runs - 1)),
                          coverage, math.sqrt(coverage * (1 - coverage) / runs), bias, exact,
                          mean=float(draws.estimates[:, i].mean()),
                          mean_mc=float(spread[i] / math.sqrt(runs)),
                          documented=draws.documented.get(label, "")))
    for ceiling in draws.ceilings:
        cells.append(Cell(case, reports, epsilon, ceiling.label, ceiling.level, runs,
                          math.nan, math.nan, math.nan, math.nan, math.nan, kind="ceiling",
                          mean=float(ceiling.values.mean()),
                          mean_mc=float(ceiling.values.std(ddof=1) / math.sqrt(runs)),
                          documented=draws.documented.get(ceiling.label, "")))
    return cells


def cell_seed(seed: int, case: str, reports: int, epsilon: float) -> np.random.Generator:
    """The generator of one cell: from ``seed``, the case's name, N and epsilon, so a cell's
    draws do not depend on which other cells run."""
    return np.random.default_rng([seed, zlib.crc32(case.encode()), reports,
                                  round(epsilon * 1000)])


def calibrate(cases: Sequence[CalibrationCase] | None = None,
              reports: Sequence[int] = REPORTS, epsilons: Sequence[float] = EPSILONS,
              runs: int = RUNS, seed: int = 1, quick: bool = False) -> list[Cell]:
    """Every cell of ``cases`` (default: all registered) over ``reports x epsilons``, or
    over a case's own points (the reduced grid's with ``quick``)."""
    chosen = list(CASES.values()) if cases is None else list(cases)
    grid = [(case, n, eps) for case in chosen
            for n, eps in case.grid(reports, epsilons, quick)]
    cells: list[Cell] = []
    for case, n, eps in progress(grid, "calibration"):
        draws = case.draw(n, eps, case.runs or runs, cell_seed(seed, case.name, n, eps))
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
for _oracle in ORACLES.values():
    for _one_shot in (True, False):
        register(_oracle_case(_oracle, _one_shot))
def _string_case(case: StringCase, quick_reports: int | None) -> CalibrationCase:
    """The string decoder on the population shape ``case`` at its own parameters (its
    epsilon is their ``epsilon_inf``), :data:`STRING_RUNS` collections a cell: the
    :data:`STRING_TOP` most common listed values' shares, the missing share against 1 less
    the true shares of the strings each collection detects, and the share of detected
    strings that are false against the decoder's level. ``quick_reports``: its number of
    reports in the reduced grid (none: left out there)."""
    epsilon = case.params.epsilon_inf

    def draw(reports: int, eps: float, runs: int, rng: np.random.Generator) -> Draws:
        if eps != epsilon:
            raise ValueError(f"{case.name} has epsilon {epsilon:g} from its parameters, not "
                             f"{eps:g}")
        got = draw_strings(case, runs, rng, reports=reports, top=STRING_TOP)
        top = got.truth.size
        labels = (*(f"rank {rank}" for rank in range(1, top + 1)), MISSING_SHARE)
        truth = np.column_stack([np.broadcast_to(got.truth, (runs, top)), got.missing_truth])
        return Draws(labels, truth, np.column_stack([got.estimates, got.missing]),
                     np.column_stack([got.std_errors, got.missing_std_error]),
                     (Ceiling(FDR, got.false_share, got.alpha),),
                     {quantity: DOCUMENTED[quantity] for quantity in case.departs})

    return CalibrationCase(case.name, draw, ((case.reports, epsilon),),
                           ((quick_reports, epsilon),) if quick_reports else (), STRING_RUNS)


register(CalibrationCase("boolean", _booleans))
register(CalibrationCase("joint 4 x 3", lambda *args: Draws(**draw_joint(*args))))
for _string_oracle in STRING_ORACLES.values():
    register(CalibrationCase(f"strings: {_string_oracle.oracle}", lambda *args, o=_string_oracle:
                             Draws(**draw_string_oracle(o, CATEGORY_SHARES, *args)),
                             tuple((n, eps) for n in REPORTS for eps in EPSILONS),
                             STRING_ORACLE_QUICK, STRING_ORACLE_RUNS))
#: collections a cell of the assigned-marginals cases (a decode is an iterative
#: projection, not a closed form)
MARGINALS_RUNS = 400


def _marginals_case(k: int) -> CalibrationCase:
    """The assigned marginals of ``k`` variables (:func:`draw_marginals`)."""

    def draw(reports: int, epsilon: float, runs: int, rng: np.random.Generator) -> Draws:
        return Draws(**draw_marginals(reports, epsilon, runs, rng, marginals=k))

    return CalibrationCase(f"joint marginals k={k}", draw,
                           tuple((n, eps) for n in REPORTS for eps in EPSILONS),
                           STRING_ORACLE_QUICK, MARGINALS_RUNS)


for _k in (2, 3):
    register(_marginals_case(_k))
for _mechanism in NUMBER_MECHANISMS:
    register(_number_case(_mechanism))
for _case in STRING_CASES:
    register(_string_case(_case, QUICK_STRING_REPORTS.get(_case.name)))
