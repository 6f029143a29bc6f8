"""Calibration cells of the string decoder: do its standard errors, intervals, missing
share and false-discovery rate mean what they say, on a given population shape?

A :class:`StringCase` is a population (the true values' shares), which of its values the
candidate list leaves out, how many decoys (listed values nobody holds) it adds, the
mechanism's parameters and the number of reports. :func:`string_calibration` decodes
``runs`` seeded collections of it, drawn exactly from the RAPPOR model
(:func:`~veil.server.analysis.synthetic.simulate_string_counts`), and returns a
:class:`StringCell`. :data:`STRING_CASES` holds the shapes of the google/rappor-format
cases (demo3, r-zipf1, chrome-zipf1.5) and of the discovery channel's string parameters,
with and without mass on unlisted values. Randomness is NumPy's seeded generator: these
are simulations, never production noise.
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


@dataclasses.dataclass(frozen=True)
class StringCase:
    """One population shape: ``shares`` of the true values ``v1 ..`` (largest first, sum
    1), the indices of those ``unlisted`` (not in the candidate list), ``decoys`` listed
    values that nobody holds, and the decoder's ``correction``."""

    name: str
    params: StringParams
    reports: int
    shares: tuple[float, ...]
    unlisted: tuple[int, ...] = ()
    decoys: int = 0
    correction: str = "storey"

    @classmethod
    def from_shape(
        cls, name: str, params: StringParams, reports: int, distribution: str, values: int, *,
        unlisted: Sequence[int] = (), decoys: int = 0, correction: str = "storey",
    ) -> StringCase:
        """A case over ``values`` values with one of the regression-test distributions
        (:func:`~veil.simulations.populations.distribution_weights`)."""
        shares = distribution_weights(distribution, values)
        return cls(name, params, reports, tuple(float(s) for s in shares), tuple(unlisted),
                   decoys, correction)

    @property
    def listed(self) -> np.ndarray:
        """Indices of the true values that are in the candidate list."""
        return np.setdiff1d(np.arange(len(self.shares)), np.asarray(self.unlisted, dtype=int))


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

    def as_row(self) -> dict[str, object]:
        """The cell as a flat row (one column per rank) for a table."""
        row: dict[str, object] = {"case": self.case, "runs": self.runs}
        for rank, (ratio, cover) in enumerate(zip(self.se_ratio, self.coverage, strict=True), 1):
            row[f"se_ratio_{rank}"] = ratio
            row[f"coverage_{rank}"] = cover
        row.update(missing_bias=self.missing_bias, missing_bias_se=self.missing_bias_se,
                   missing_coverage=self.missing_coverage, fdr=self.fdr, fdr_se=self.fdr_se,
                   shown_total=self.shown_total)
        return row


def string_calibration(case: StringCase, runs: int, seed: int, *, top: int = 3) -> StringCell:
    """Decode ``runs`` collections of ``case`` (generator seeded with ``seed``) and measure
    its calibration (:class:`StringCell`) for the ``top`` most common listed values."""
    shares = np.asarray(case.shares, dtype=float)
    values = [f"v{i + 1}" for i in range(shares.size)]
    listed = case.listed
    candidates = [values[i] for i in listed] + [f"decoy-{i}" for i in range(case.decoys)]
    params = case.params
    candidate_map = build_map(params, candidates)
    true_map = build_map(params, values)
    truth = np.concatenate([shares[listed], np.zeros(case.decoys)])
    ranks = np.argsort(-truth, kind="stable")[:top]
    rng = np.random.default_rng(seed)
    estimates = np.zeros((runs, ranks.size))
    std_errors = np.zeros_like(estimates)
    missing = np.zeros((runs, 3))  # estimate, standard error, truth
    false_share = np.zeros(runs)
    shown = np.zeros(runs)
    for run in range(runs):
        counts = simulate_string_counts(params, true_map, shares, case.reports, rng)
        decoder = StringDecoder(params, correction=case.correction).fit(
            *counts, candidates, candidate_map
        )
        estimates[run] = decoder.proportions_[ranks]
        std_errors[run] = decoder.std_errors_[ranks] / case.reports
        summary = decoder.summary_
        detected = decoder.detected_
        missing[run] = (summary["missing_proportion_unbiased"],
                        summary["missing_proportion_std_error"],
                        1.0 - float(truth[detected].sum()))
        found = int(detected.sum())
        false_share[run] = int(detected[truth == 0].sum()) / found if found else 0.0
        shown[run] = summary["allocated_proportion"] + summary["missing_proportion"]
    spread = estimates.std(axis=0, ddof=1)
    stated = np.sqrt(np.mean(std_errors**2, axis=0))
    covered = np.abs(estimates - truth[ranks]) <= _Z95 * std_errors
    error = missing[:, 0] - missing[:, 2]
    return StringCell(
        case.name, runs,
        tuple(float(r) for r in np.where(spread > 0, stated / np.where(spread > 0, spread, 1), math.nan)),
        tuple(float(c) for c in covered.mean(axis=0)),
        float(error.mean()), float(error.std(ddof=1) / math.sqrt(runs)),
        float(np.mean(np.abs(error) <= _Z95 * missing[:, 1])),
        float(false_share.mean()), float(false_share.std(ddof=1) / math.sqrt(runs)),
        float(shown.mean()),
    )


def _every_tenth(values: int) -> tuple[int, ...]:
    """Indices of ``v9, v19, ...``: the values google/rappor's regression test leaves out
    of the candidates (``--removed-regex v[0-9]*9$``)."""
    return tuple(i for i in range(values) if (i + 1) % 10 == 9)


def _one_unlisted_holding(distribution: str, values: int, share: float) -> tuple[float, ...]:
    """``distribution`` over ``values - 1`` values scaled to ``1 - share``, with the second
    value set to hold ``share`` (the mid-share unlisted value of the FDR cell)."""
    rest = distribution_weights(distribution, values - 1) * (1.0 - share)
    return tuple(float(s) for s in np.insert(rest, 1, share))


#: the population shapes of the calibration grid: the google/rappor-format cases' shapes,
#: parameters and 1,000,000 reports, the defaults and the discovery channel's string
#: parameters at 100,000
STRING_CASES: tuple[StringCase, ...] = (
    StringCase.from_shape("defaults, zipf1.5 over 100, all listed, 50 decoys",
                          StringParams(), 100_000, "zipf1.5", 100, decoys=50),
    StringCase.from_shape("channel eps 4, zipf1.5 over 100, all listed, 50 decoys",
                          string_channel_params(4.0), 100_000, "zipf1.5", 100, decoys=50),
    StringCase.from_shape("demo3: exp over 100, every tenth unlisted, 100 decoys",
                          StringParams(k=32, h=1, m=64, p=0.25, q=0.75, f=0.5), 1_000_000, "exp",
                          100, unlisted=_every_tenth(100), decoys=100),
    StringCase.from_shape("demo3 shape, all listed, 100 decoys",
                          StringParams(k=32, h=1, m=64, p=0.25, q=0.75, f=0.5), 1_000_000, "exp",
                          100, decoys=100),
    StringCase("demo3 shape, one unlisted value holding 10%, 100 decoys",
               StringParams(k=32, h=1, m=64, p=0.25, q=0.75, f=0.5), 1_000_000,
               _one_unlisted_holding("exp", 100, 0.10), unlisted=(1,), decoys=100),
    StringCase.from_shape("r-zipf1: zipf1 over 100, every tenth unlisted, 20 decoys",
                          StringParams(k=8, h=2, m=128, p=0.39, q=0.61, f=0.45), 1_000_000,
                          "zipf1", 100, unlisted=_every_tenth(100), decoys=20),
    StringCase.from_shape("chrome: zipf1.5 over 1,000, all listed",
                          StringParams(k=128, h=2, m=64, p=0.25, q=0.75, f=0.5), 1_000_000,
                          "zipf1.5", 1000),
)


def string_calibration_grid(
    runs: int = 100, seed: int = 2026, cases: Sequence[StringCase] = STRING_CASES
) -> list[StringCell]:
    """:func:`string_calibration` of every case, case ``i`` seeded with ``seed + i``."""
    return [string_calibration(case, runs, seed + i) for i, case in enumerate(cases)]
