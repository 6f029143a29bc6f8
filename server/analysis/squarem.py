"""SQUAREM's extrapolation (Varadhan and Roland, Scand. J. Stat. 2008, scheme S3) for the
EM fits on the probability simplex: IBU's shares (:mod:`veil.server.analysis.ibu`) and the
association EM's joint table (:mod:`veil.server.analysis.assoc_em`).

From a point ``x0`` and two EM steps ``x1``, ``x2`` the proposal is
``x0 - 2 a r + a^2 v`` with ``r = x1 - x0``, ``v = x2 - 2 x1 + x0`` and the step length
``a = min(-|r| / |v|, -1)`` (``a = -1`` gives ``x2``). Far from the optimum the proposal
can leave the simplex; clipping it back would set a component to exactly 0, where no EM
step can ever lift it again, and a fit would then "converge" on a point that is not its
maximum. So the step length is halved towards -1 until every component that the EM keeps
positive stays positive (Varadhan and Roland's backtracking), and is -1 at worst.
"""

from __future__ import annotations

import numpy as np

#: halvings of the step length towards -1 before the plain second EM step is taken
MAX_HALVINGS = 30


def extrapolate(start: np.ndarray, once: np.ndarray, twice: np.ndarray) -> np.ndarray:
    """The SQUAREM proposal from each row of ``start`` (one fit per row, its components
    summing to 1) along its EM steps ``once`` and ``twice``: normalized to sum to 1, and
    positive wherever ``twice`` is."""
    x0, x1, x2 = (np.asarray(a, dtype=float) for a in (start, once, twice))
    r = x1 - x0
    v = x2 - 2.0 * x1 + x0
    norm_v = np.linalg.norm(v, axis=1)
    alpha = np.minimum(-np.linalg.norm(r, axis=1) / np.where(norm_v > 0, norm_v, 1.0), -1.0)
    kept = x2 > 0
    proposal = x2
    for _ in range(MAX_HALVINGS + 1):
        proposal = x0 - 2.0 * alpha[:, None] * r + alpha[:, None] ** 2 * v
        outside = np.any(kept & (proposal <= 0), axis=1)
        if not outside.any():
            break
        alpha = np.where(outside, (alpha - 1.0) / 2.0, alpha)
    else:
        proposal[outside] = x2[outside]
    proposal = np.where(kept, proposal, 0.0)
    out: np.ndarray = proposal / proposal.sum(axis=1, keepdims=True)
    return out
