"""Frequency oracles for category metrics, one module each; :data:`ORACLES` maps a name
to its parameter class.

A category metric names its ``oracle``: ``rappor`` (the default, one-hot basic
RAPPOR, :class:`~veil.shared.kinds.category.CategoryParams`), ``grr``, ``oue``,
``olh``, ``hadamard``, or ``auto`` to have the lowest-variance one chosen
(:func:`choose_oracle`). See :mod:`veil.shared.kinds.oracles.base` for what
they share.
"""

from veil.shared.kinds.oracles.base import MAX_ORACLE_CATEGORIES, OracleParams
from veil.shared.kinds.oracles.choice import choose_oracle
from veil.shared.kinds.oracles.grr import GrrParams
from veil.shared.kinds.oracles.hadamard import HadamardParams
from veil.shared.kinds.oracles.olh import OlhParams
from veil.shared.kinds.oracles.oue import OueParams

#: every oracle but RAPPOR, keyed by its ``oracle`` name
ORACLES: dict[str, type[OracleParams]] = {
    cls.oracle: cls for cls in (GrrParams, OueParams, OlhParams, HadamardParams)
}

__all__ = [
    "MAX_ORACLE_CATEGORIES",
    "ORACLES",
    "GrrParams",
    "HadamardParams",
    "OlhParams",
    "OracleParams",
    "OueParams",
    "choose_oracle",
]
