"""One module per kind of metric; :data:`KINDS` maps a kind name to its parameter class.

Adding a kind means one new module here, one entry in :data:`KINDS`, and the
matching encoder, statistics and estimator on the client and server sides.
"""

from veil.shared.kinds.base import MechanismParams, implements
from veil.shared.kinds.boolean import BooleanParams
from veil.shared.kinds.category import CategoryParams
from veil.shared.kinds.number import NumberParams
from veil.shared.kinds.string import StringParams

KINDS: dict[str, type[MechanismParams]] = {
    cls.kind: cls for cls in (StringParams, CategoryParams, BooleanParams, NumberParams)
}

__all__ = [
    "KINDS",
    "BooleanParams",
    "CategoryParams",
    "MechanismParams",
    "NumberParams",
    "StringParams",
    "implements",
]
