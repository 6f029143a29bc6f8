"""Calibration cells of the string decoder: do its standard errors, intervals, missing
share and false-discovery rate mean what they say, on a given population shape?

A :class:`StringCase` is a population (the true values' shares), which of its values the
candidate list leaves out, how many decoys (listed values nobody holds) it adds, the
mechanism's parameters and the number of reports. :func:`draw_strings` decodes ``runs``
collections of it, drawn exactly from the RAPPOR model
(:func:`~veil.server.analysis.synthetic.simulate_string_counts`), and keeps each run's
figures (:class:`StringDraws`): the grid of ``veil experiment calibration``
(:mod:`veil.simulations.calibration`) turns them into its cells, and
:func:`string_calibration` into one :class:`StringCell`. :data:`STRING_CASES` holds the
shapes of the google/rappor-format cases (demo3, r-zipf1, chrome-zipf1.5) and of the
discovery channel's string parameters, with and without mass on unlisted values, each
naming the quantities that docs/analysis.md says leave their band on it. Randomness is
NumPy's seeded generator: these are simulations, never production noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from veil.server.analysis.candidate_map import build_map
from veil.server.analysis.strings import StringDecoder
from veil.server.analysis.synthetic import simulate_string_counts
from veil.shared.kinds import StringParams
from veil.simulations.discovery_experiment import string_channel_params
from veil.simulations.populations import distribution_weights

#: two-sided 95% normal quantile
_Z95 = 1.959963984540054
#: the names of a case's quantities that may leave their band (:attr:`StringCase.departs`)
MISSING_SHARE = "missing share"
FDR = "false discovery rate"


@dataclasses.dataclass(frozen=True)
class StringCase:
    """One population shape: ``shares`` of the true values ``v1 ..`` (largest first, sum
    1), the indices of those ``unlisted`` (not in the candidate list), ``decoys`` listed
    values that nobody holds, and the decoder's ``correction``. ``description`` says
    so in words; ``departs`` names the quantities (:data:`MISSING_SHARE`, :data:`FDR`)
    that docs/analysis.md says leave their band on this shape, so that a table shows them
    as documented departures rather than as failures."""

    name: str
    params: StringParams
    reports: int
    shares: tuple[float, ...]
    unlisted: tuple[int, ...] = ()
    decoys: int = 0
    correction: str = "storey"
    description: str = ""
    departs: tuple[str, ...] = ()

    @classmethod
    def from_shape(
        cls, name: str, params: StringParams, reports: int, distribution: str, values: int, *,
        unlisted: Sequence[int] = (), decoys: int = 0, correction: str = "storey",
        description: str = "", departs: Sequence[str] = (),
    ) -> StringCase:
        """A case over ``values`` values with one of the regression-test distributions
        (:func:`~veil.simulations.populations.distribution_weights`)."""
        shares = distribution_weights(distribution, values)
        return cls(name, params, reports, tuple(float(s) for s in shares), tuple(unlisted),
                   decoys, correction, description, tuple(departs))

    @property
    def listed(self) -> np.ndarray:
        """Indices of the true values that are in the candidate list."""
        return np.setdiff1d(np.arange(len(self.shares)), np.asarray(self.unlisted, dtype=int))


@dataclasses.dataclass(frozen=True)
class StringDraws:
    """``runs`` decoded collections of a :class:`StringCase`, run by run.

    ``truth`` holds the true shares of the ``top`` most common listed values, whose
    estimates and stated standard errors are ``estimates`` and ``std_errors`` (``runs x
    top``). Per run: ``missing`` and ``missing_std_error``, the unbiased missing share and
    its standard error, and ``missing_truth``, 1 less the true shares of the strings that
    run detected (so it varies with the detections); ``false_share``, the share of the
    detected strings that are decoys (0 when none is detected); ``shown_total``, the shown
    allocated plus shown missing share (truth 1). ``alpha`` is the decoder's level.
    """

    truth: np.ndarray
    estimates: np.ndarray
    std_errors: np.ndarray
    missing: np.ndarray
    missing_std_error: np.ndarray
    missing_truth: np.ndarray
    false_share: np.ndarray
    shown_total: np.ndarray
    alpha: float


def draw_strings(case: StringCase, runs: int, rng: np.random.Generator, *,
                 reports: int | None = None, top: int = 3) -> StringDraws:
    """Decode ``runs`` collections of ``case`` (``reports`` reports each, the case's
    number by default), drawn with ``rng``, and keep what each run says about the ``top``
    most common listed values, the missing share and the false discoveries."""
    reports = case.reports if reports is None else reports
    shares = np.asarray(case.shares, dtype=float)
    values = [f"v{i + 1}" for i in range(shares.size)]
    listed = case.listed
    candidates = [values[i] for i in listed] + [f"decoy-{i}" for i in range(case.decoys)]
    params = case.params
    candidate_map = build_map(params, candidates)
    true_map = build_map(params, values)
    truth = np.concatenate([shares[listed], np.zeros(case.decoys)])
    ranks = np.argsort(-truth, kind="stable")[:top]
    estimates = np.zeros((runs, ranks.size))
    std_errors = np.zeros_like(estimates)
    missing = np.zeros((runs, 3))  # estimate, standard error, truth
    false_share = np.zeros(runs)
    shown = np.zeros(runs)
    alpha = math.nan
    for run in range(runs):
        counts = simulate_string_counts(params, true_map, shares, reports, rng)
        decoder = StringDecoder(params, correction=case.correction).fit(
            *counts, candidates, candidate_map
        )
        alpha = decoder.alpha
        estimates[run] = decoder.proportions_[ranks]
        std_errors[run] = decoder.std_errors_[ranks] / reports
        summary = decoder.summary_
        detected = decoder.detected_
        missing[run] = (summary["missing_proportion_unbiased"],
                        summary["missing_proportion_std_error"],
                        1.0 - float(truth[detected].sum()))
        found = int(detected.sum())
        false_share[run] = int(detected[truth == 0].sum()) / found if found else 0.0
        shown[run] = summary["allocated_proportion"] + summary["missing_proportion"]
    return StringDraws(truth[ranks], estimates, std_errors, missing[:, 0], missing[:, 1],
                       missing[:, 2], false_share, shown, alpha)


@dataclasses.dataclass(frozen=True)
class StringCell:
    """The calibration of one :class:`StringCase` over ``runs`` collections.

    Per rank of the ``top`` most common listed values: ``se_ratio`` (root mean square
    stated standard error over the observed standard deviation of the estimates; 1 is
    right) and ``coverage`` (share of 95% intervals that hold the true share).
    The missing share against its truth, 1 less the true shares of the detected strings:
    ``missing_bias`` (mean of the unbiased estimate less that truth) with its Monte Carlo
    standard error, ``missing_coverage`` (95% intervals). ``fdr`` is the mean share of
    detected strings that are decoys (0 when none is detected) with its Monte Carlo
    standard error; ``shown_total`` the mean of the shown allocated plus shown missing
    share, whose truth is 1.
    """

    case: str
    runs: int
    se_ratio: tuple[float, ...]
    coverage: tuple[float, ...]
    missing_bias: float
    missing_bias_se: float
    missing_coverage: float
    fdr: float
    fdr_se: float
    shown_total: float

    @classmethod
    def of(cls, case: str, draws: StringDraws) -> StringCell:
        """The cell that ``draws`` of the case named ``case`` make."""
        runs = draws.estimates.shape[0]
        spread = draws.estimates.std(axis=0, ddof=1)
        stated = np.sqrt(np.mean(draws.std_errors**2, axis=0))
        ratio = np.where(spread > 0, stated / np.where(spread > 0, spread, 1), math.nan)
        covered = np.abs(draws.estimates - draws.truth) <= _Z95 * draws.std_errors
        error = draws.missing - draws.missing_truth
        return cls(
            case, runs, tuple(float(r) for r in ratio),
            tuple(float(c) for c in covered.mean(axis=0)),
            float(error.mean()), float(error.std(ddof=1) / math.sqrt(runs)),
            float(np.mean(np.abs(error) <= _Z95 * draws.missing_std_error)),
            float(draws.false_share.mean()),
            float(draws.false_share.std(ddof=1) / math.sqrt(runs)),
            float(draws.shown_total.mean()),
        )


def string_calibration(case: StringCase, runs: int, seed: int, *, top: int = 3) -> StringCell:
    """Decode ``runs`` collections of ``case`` (generator seeded with ``seed``) and measure
    its calibration (:class:`StringCell`) for the ``top`` most common listed values."""
    return StringCell.of(case.name, draw_strings(case, runs, np.random.default_rng(seed),
                                                 top=top))


def _every_tenth(values: int) -> tuple[int, ...]:
    """Indices of ``v9, v19, ...``: the values google/rappor's regression test leaves out
    of the candidates (``--removed-regex v[0-9]*9$``)."""
    return tuple(i for i in range(values) if (i + 1) % 10 == 9)


def _one_unlisted_holding(distribution: str, values: int, share: float) -> tuple[float, ...]:
    """``distribution`` over ``values - 1`` values scaled to ``1 - share``, with the second
    value set to hold ``share`` (the mid-share unlisted value of the FDR cell)."""
    rest = distribution_weights(distribution, values - 1) * (1.0 - share)
    return tuple(float(s) for s in np.insert(rest, 1, share))


_DEMO3 = StringParams(k=32, h=1, m=64, p=0.25, q=0.75, f=0.5)

#: the population shapes of the calibration grid: the google/rappor-format cases' shapes
#: and parameters at 1,000,000 reports, the defaults and the discovery channel's string
#: parameters at 100,000. Every shape has strings near the detection limit, where the
#: missing share reads low (docs/analysis.md, *The missing share and selection*); Storey's
#: false-discovery rate exceeds its level with a mid-share unlisted value
#:
#: :meta hide-value:
STRING_CASES: tuple[StringCase, ...] = (
    StringCase.from_shape(
        "strings: defaults", StringParams(), 100_000, "zipf1.5", 100, decoys=50,
        description="defaults, Zipf(1.5) over 100, all listed, 50 decoys",
        departs=(MISSING_SHARE,)),
    StringCase.from_shape(
        "strings: channel eps 4", string_channel_params(4.0), 100_000, "zipf1.5", 100,
        decoys=50,
        description="discovery channel's string parameters at epsilon 4 (h=1, p=0, q=1), "
                    "Zipf(1.5) over 100, all listed, 50 decoys",
        departs=(MISSING_SHARE,)),
    StringCase.from_shape(
        "strings: demo3", _DEMO3, 1_000_000, "exp", 100, unlisted=_every_tenth(100),
        decoys=100, description="demo3 shape: exponential over 100, every tenth unlisted, "
                                "100 decoys",
        departs=(MISSING_SHARE,)),
    StringCase.from_shape(
        "strings: demo3 all listed", _DEMO3, 1_000_000, "exp", 100, decoys=100,
        description="demo3 shape, all listed, 100 decoys", departs=(MISSING_SHARE,)),
    StringCase(
        "strings: demo3 10% unlisted", _DEMO3, 1_000_000,
        _one_unlisted_holding("exp", 100, 0.10), unlisted=(1,), decoys=100,
        description="demo3 shape, one unlisted value (the second) holding 10%, 100 decoys",
        departs=(MISSING_SHARE, FDR)),
    StringCase.from_shape(
        "strings: r-zipf1", StringParams(k=8, h=2, m=128, p=0.39, q=0.61, f=0.45),
        1_000_000, "zipf1", 100, unlisted=_every_tenth(100), decoys=20,
        description="r-zipf1 shape: Zipf(1) over 100, every tenth unlisted, 20 decoys",
        departs=(MISSING_SHARE,)),
    StringCase.from_shape(
        "strings: chrome-1k", StringParams(k=128, h=2, m=64, p=0.25, q=0.75, f=0.5),
        1_000_000, "zipf1.5", 1000,
        description="chrome shape: Zipf(1.5) over 1,000, all listed",
        departs=(MISSING_SHARE,)),
)
