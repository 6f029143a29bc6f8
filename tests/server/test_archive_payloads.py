"""The archive's payload check refuses exactly the rows the wire refuses, for every mechanism.

``veil aggregate`` runs each file's payloads through the metric's own ``parse_payload``
(the collector's check of every report it receives), but once per distinct value, or,
for bytes payloads, once per bit that some row sets (:func:`check_reports`). This file
holds it to the row-by-row verdict of ``parse_payload`` for each example of
:data:`tests.test_common_checks.EXAMPLES` (every kind and oracle): genuine SDK reports,
then the same reports with rows changed at random (a flipped bit, an integer or number
out of range or off the grid, NaN, infinities, a wrong width), seeded. The check must
pass exactly the columns every row of which the wire accepts, and otherwise name the
first row it refuses.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from tests.test_common_checks import EXAMPLES, IDS, sdk_reports, stored_payloads
from veil.server.archive import ArchiveError
from veil.server.archive.bucket import check_reports
from veil.server.storage.base import payload_array
from veil.shared.errors import WireFormatError
from veil.shared.kinds import MechanismParams
from veil.shared.registry import Metric
from veil.shared.statistics import statistic_for

REPORTS = 200
#: altered copies of each example's reports
TRIALS = 150


def wire_refuses(params: MechanismParams, payload_type: str, stored: np.ndarray) -> bool:
    """The collector's verdict on one stored payload, sent back as the wire carries it."""
    if payload_type == "bytes":
        payload: Any = stored.tobytes().hex()
    else:
        payload = int(stored) if payload_type == "int" else float(stored)
    try:
        params.parse_payload(payload)
    except WireFormatError:
        return True
    return False


def altered(params: MechanismParams, payload_type: str, payloads: np.ndarray,
            rnd: random.Random) -> np.ndarray:
    """A copy of ``payloads`` with one to three rows changed as a forger might."""
    out = payloads.copy()
    for _ in range(rnd.randint(1, 3)):
        row = rnd.randrange(len(out))
        if rnd.random() < 0.4:  # another genuine payload: the wire accepts it
            out[row] = payloads[rnd.randrange(len(out))]
        elif payload_type == "bytes":
            out[row, rnd.randrange(out.shape[1])] ^= np.uint8(1 << rnd.randrange(8))
        elif payload_type == "int":
            out[row] = rnd.choice([-1, 2, 7, 10**12, -(2**63), rnd.randint(-4, 40)])
        else:
            low, high = params.payload_range  # type: ignore[attr-defined]
            out[row] = rnd.choice([float("nan"), float("inf"), -float("inf"), 1e300,
                                   high + params.step, low - params.step,  # type: ignore[attr-defined]
                                   out[row] + params.step * rnd.random()])  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_the_archive_refuses_the_rows_the_wire_refuses(params, shares, truth) -> None:
    metric = Metric("m", params)
    statistic = statistic_for(params)
    payload_type = statistic.payload_type
    values = list(shares)
    reports = sdk_reports(params, [values[i % len(values)] for i in range(REPORTS)], seed=7)
    payloads = payload_array(payload_type,
                             stored_payloads(params, [r["payload"] for r in reports]))
    cohorts = np.array([r.get("cohort", 0) for r in reports], dtype=np.int64)
    check_reports(metric, statistic, cohorts, payloads, "genuine reports")
    rnd = random.Random(11)
    outcomes = {"refused": 0, "passed": 0}
    for trial in range(TRIALS):
        changed = altered(params, payload_type, payloads, rnd)
        refused = [row for row in range(len(changed))
                   if wire_refuses(params, payload_type, changed[row])]
        if refused:
            with pytest.raises(ArchiveError, match=rf"^file {trial}, row {refused[0]} "):
                check_reports(metric, statistic, cohorts, changed, f"file {trial}")
        else:
            check_reports(metric, statistic, cohorts, changed, f"file {trial}")
        outcomes["refused" if refused else "passed"] += 1
    # every column passes or fails as a whole: both happen (a bit vector without pad bits,
    # a string's k = 32, has no bit to refuse; its width is checked below)
    assert outcomes["passed"] and (outcomes["refused"] or payload_type == "bytes"), outcomes
    if payload_type == "bytes":  # a column of another width: the wire's length check
        wider = np.concatenate([payloads, np.zeros((len(payloads), 1), np.uint8)], axis=1)
        with pytest.raises(ArchiveError, match=r"^wider, row 0 .*wrong_length"):
            check_reports(metric, statistic, cohorts, wider, "wider")
