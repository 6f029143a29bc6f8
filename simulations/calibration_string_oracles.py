"""The string oracles' cases of the calibration grid (:mod:`veil.simulations.calibration`):
FLH and HCMS (:mod:`veil.shared.kinds.string_oracles`) at their default pools.

A string metric of each oracle is declared at the grid's epsilon (``report_epsilon`` its
default, ``epsilon / 2``) over a population of :data:`CANDIDATES` strings with the category
cases' shares (:data:`~veil.simulations.calibration.CATEGORY_SHARES`, an absent string
last). Each installation draws its value from the population and sends one report, so a
collection's statistic is exactly ``Multinomial(N, law)`` over the (cohort, payload) cells
(:func:`~veil.simulations.string_oracles.report_law`): one draw a collection, whatever N.
Each collection is decoded over the candidates by
:class:`~veil.server.analysis.string_oracles.StringOracleDecoder`; calibrated: every
candidate's share (the collision solve and its stated inflation included) and the
missing share against 1 less the true shares of the strings each collection detects. That
truth moves with the selection: where the detected strings differ between collections (near
the detection limit) the missing share reads low, as docs/analysis.md states for every
string decoder, and its cell is flagged ``documented`` with a link there.
:data:`RUNS` collections a cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from veil.server.analysis.string_oracles import StringOracleDecoder, candidate_keys
from veil.shared.kinds import StringOracleParams
from veil.simulations.calibration_strings import MISSING_SHARE
from veil.simulations.string_oracles import draw_statistic, report_law

#: collections per cell (a decode over a pool of 2^16 cells costs some milliseconds)
RUNS = 400
#: the points of the reduced grid (the test suite's): the smallest N at the smallest epsilon,
#: where nearly every report is alone in its cohort, and 10^5 reports at epsilon 4
QUICK_POINTS = ((1_000, 0.5), (100_000, 4.0))
#: where docs/analysis.md says the missing share reads low near the detection limit
MISSING_SHARE_LIMITS = "analysis.md#what-the-string-decoder-guarantees"


def candidates(count: int) -> list[str]:
    """The population's strings, most common first."""
    return [f"https://site{i}.example/page" for i in range(count)]


def draw_string_oracle(oracle: type[StringOracleParams], shares: Sequence[float], reports: int,
                       epsilon: float, runs: int, rng: np.random.Generator) -> dict[str, Any]:
    """The fields of a :class:`~veil.simulations.calibration.Draws`: ``runs`` decoded
    collections of ``reports`` reports of ``oracle`` at ``epsilon`` over strings with
    ``shares`` (summing to 1)."""
    params = oracle(epsilon=epsilon)
    names = candidates(len(shares))
    truth = np.asarray(shares, dtype=float)
    law = report_law(params, candidate_keys(names), truth)
    labels = (*names, MISSING_SHARE)
    estimates, errors = np.zeros((runs, len(labels))), np.zeros((runs, len(labels)))
    missing_truth = np.zeros(runs)
    selections = set()
    for run in range(runs):
        decoder = StringOracleDecoder(params).fit(draw_statistic(law, reports, rng), names)
        summary = decoder.summary_
        estimates[run] = [*decoder.proportions_, summary["missing_proportion_unbiased"]]
        errors[run] = [*decoder.std_errors_, summary["missing_proportion_std_error"]]
        missing_truth[run] = 1.0 - float(truth[decoder.detected_].sum())
        selections.add(decoder.detected_.tobytes())
    truths = np.column_stack([np.broadcast_to(truth, (runs, truth.size)), missing_truth])
    documented = {MISSING_SHARE: MISSING_SHARE_LIMITS} if len(selections) > 1 else {}
    return {"labels": labels, "truth": truths, "estimates": estimates, "std_errors": errors,
            "documented": documented}
