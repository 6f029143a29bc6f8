"""Sufficient statistics, one module each; :data:`STATISTICS` maps a name to an instance.

Each statistic registers itself where it is defined (:class:`Statistic`'s subclass
hook); this package imports the built-in ones, in the order their aggregate columns
are laid out. A kind of metric names its statistic (``params.statistic``); storage backends,
counts documents, the API schema and simulations work through
:func:`statistic_for` and never branch on a kind's name. These modules need
NumPy (the server, analysis and simulation extras); the client never imports them.
"""

from veil.shared.kinds.base import MechanismParams
from veil.shared.statistics.base import STATISTICS, CohortCounters, Field, State, Statistic

# isort: off
from veil.shared.statistics.bits import BitCounts, bit_counts_by_group
from veil.shared.statistics.ones import OneCounts
from veil.shared.statistics.moments import Moments
from veil.shared.statistics.responses import ResponseCounts
from veil.shared.statistics.buckets import BucketCounts
# isort: on

#: every aggregate column the built-in statistics use, in the order backends lay them out
#: (the storage schema: a statistic defined later must use these columns)
COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(field.column for statistic in STATISTICS.values() for field in statistic.fields)
)
#: the field type each aggregate column holds (statistics that share a column agree on it)
COLUMN_TYPES: dict[str, str] = {field.column: field.type for statistic in STATISTICS.values()
                                for field in statistic.fields}


def statistic_for(params: MechanismParams) -> Statistic:
    """The statistic a metric with ``params`` keeps."""
    return STATISTICS.lookup(params.statistic)


__all__ = [
    "COLUMNS",
    "COLUMN_TYPES",
    "STATISTICS",
    "BitCounts",
    "BucketCounts",
    "CohortCounters",
    "Field",
    "Moments",
    "OneCounts",
    "ResponseCounts",
    "State",
    "Statistic",
    "bit_counts_by_group",
    "statistic_for",
]
