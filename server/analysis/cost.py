"""The worst-case privacy cost per installation that a decode states (``summary["privacy"]``).

It follows the client's ledger (:mod:`veil.client.accounting`): every encoder memoizes
its randomized response per value (for numbers, per grid point), so one value costs
``epsilon_1`` if reported once and ``epsilon_inf`` however often it is reported, and
the distinct values one installation reports add up (sequential composition). A metric
with at most ``n`` possible values therefore costs an installation at most
``n * epsilon_inf``; a string metric has no such bound.
"""

from __future__ import annotations

import itertools
from typing import Any

from veil.shared.kinds import MechanismParams
from veil.shared.privacy import format_epsilon, sequential


def privacy_cost(params: MechanismParams, distinct_values: int | None, values: str) -> dict[str, Any]:
    """The cost statement of a metric with ``params``: per value, and per installation when
    the metric has at most ``distinct_values`` possible values (``values`` names them, e.g.
    "categories"; ``None`` for an open set such as strings)."""
    once = min(params.epsilon_1, params.epsilon_inf)
    per_value = params.epsilon_inf
    bound = (None if distinct_values is None
             else sequential(itertools.repeat(per_value, distinct_values)))
    symbol = "\u03b5" if once == per_value else "\u03b5\u221e"
    statement = f"each installation spent at most {symbol} = {format_epsilon(per_value)} per distinct value"
    if once != per_value:
        statement += f" however often reported (\u03b5\u2081 = {format_epsilon(once)} for one reported once)"
    statement += "; the client's ledger charges every distinct value, "
    if bound is None:
        statement += (f"so n distinct {values} cost up to n \u00d7 {format_epsilon(per_value)}, with no upper "
                      "limit on n")
    else:
        statement += (f"and there are {distinct_values:,} possible {values}, so at most "
                      f"{format_epsilon(bound, 4)} per installation")
    return {
        "epsilon_once": once,
        "epsilon_per_value": per_value,
        "distinct_values": distinct_values,
        "epsilon_per_installation": bound,
        "statement": statement,
    }
