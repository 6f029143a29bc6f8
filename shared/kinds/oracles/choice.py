"""``oracle = "auto"``: the oracle of lowest variance for the declared epsilon and domain.

Each oracle is built at the declared ``epsilon`` and ``report_epsilon`` and
compared by the variance of an absent category's share (the noise floor every
share estimate carries, :meth:`OracleParams.share_variance`). Oracles whose
reports exceed ``max_report_bytes`` are left out; among those within 5% of the
lowest variance the smallest report wins (OUE and OLH tie in theory; OLH's
reports are far smaller).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from veil.shared.errors import ParameterError
from veil.shared.kinds.oracles.base import ORACLES, OracleParams

#: variances within this factor of the lowest count as ties, broken by report size
TIE = 1.05


def check_report_cap(cap: Any) -> int | None:
    """``max_report_bytes`` as a registry gives it (``None``: no cap), or a
    :class:`ParameterError` naming it unless it is an integer >= 1."""
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ParameterError(
            "max_report_bytes", f"max_report_bytes must be an integer >= 1, the most bytes one "
                                f"report may take. Got {cap!r:.100} instead.")
    return cap


def choose_oracle(
    categories: Sequence[str],
    epsilon: float,
    report_epsilon: float | None = None,
    max_report_bytes: int | None = None,
) -> tuple[OracleParams, str]:
    """The chosen parameters and a sentence saying why, among every registered oracle
    (:data:`~veil.shared.kinds.oracles.base.ORACLES`)."""
    check_report_cap(max_report_bytes)
    built = [cls(categories=tuple(categories), epsilon=epsilon, report_epsilon=report_epsilon)
             for cls in ORACLES.values()]
    fitting = [p for p in built if max_report_bytes is None or p.report_bytes <= max_report_bytes]
    if not fitting:
        smallest = min(built, key=lambda p: p.report_bytes)
        raise ParameterError(
            "max_report_bytes",
            f"no oracle fits reports of {max_report_bytes} byte(s); the smallest is "
            f"{smallest.oracle} at {smallest.report_bytes}",
        )
    lowest = min(p.share_variance() for p in fitting)
    chosen = min((p for p in fitting if p.share_variance() <= lowest * TIE),
                 key=lambda p: (p.report_bytes, p.share_variance()))
    others = "; ".join(
        f"{p.oracle} {p.share_variance():.4g}"
        + ("" if p in fitting else f" (reports of {p.report_bytes} bytes, over the cap)")
        for p in built if p is not chosen
    )
    why = (
        f"auto chose {chosen.oracle}: share variance {chosen.share_variance():.4g}/N with "
        f"{chosen.report_bytes}-byte reports at epsilon {chosen.epsilon:g} (one report "
        f"{chosen.report_epsilon:g}) over {len(categories)} categories (others: {others})"
    )
    return chosen, why
