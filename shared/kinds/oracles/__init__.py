"""Frequency oracles for category metrics, one module each; :data:`ORACLES` maps a name
to its parameter class.

A category metric names its ``oracle``: ``rappor`` (the default, one-hot basic
RAPPOR, :class:`~veil.shared.kinds.category.CategoryParams`), ``grr``, ``oue``,
``olh``, ``hadamard``, or ``auto`` to have the lowest-variance one chosen
(:func:`choose_oracle`). See :mod:`veil.shared.kinds.oracles.base` for what
they share. Each oracle's class registers itself in :data:`ORACLES` where it is
defined; this package imports the built-in ones.
"""

from veil.shared.kinds.oracles.base import MAX_ORACLE_CATEGORIES, ORACLES, OracleParams
from veil.shared.kinds.oracles.choice import check_report_cap, choose_oracle

# the order of definition is the order in which ``auto`` weighs the oracles
# isort: off
from veil.shared.kinds.oracles.grr import GrrParams
from veil.shared.kinds.oracles.oue import OueParams
from veil.shared.kinds.oracles.olh import OlhParams
from veil.shared.kinds.oracles.hadamard import HadamardParams
# isort: on

__all__ = [
    "MAX_ORACLE_CATEGORIES",
    "ORACLES",
    "GrrParams",
    "HadamardParams",
    "OlhParams",
    "OracleParams",
    "OueParams",
    "check_report_cap",
    "choose_oracle",
]
