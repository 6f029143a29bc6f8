"""Categories from a known list: basic (one-hot) RAPPOR."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from veil.shared.bits import hex_to_bits
from veil.shared.errors import ParameterError
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.string import (
    RAPPOR_CONSTRAINTS,
    RapporBits,
    StringParams,
    check_rappor_probs,
)
from veil.shared.privacy import (
    f_for_epsilon_inf,
)
from veil.shared.validation import check_fields

MAX_CATEGORIES = 4096


@dataclasses.dataclass(frozen=True)
class CategoryParams(RapporBits, MechanismParams):
    """One bit per category (bit ``i`` is ``categories[i]``), then RAPPOR's PRR and IRR.

    With one bit set per value, RAPPOR's bounds apply with ``h = 1``.
    """

    kind: ClassVar[str] = "category"

    categories: tuple[str, ...] = ()
    p: float = 0.5
    q: float = 0.75
    f: float = 0.5

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if isinstance(self.categories, list):
            object.__setattr__(self, "categories", tuple(self.categories))
        cats = self.categories
        if (
            not isinstance(cats, tuple)
            or not 1 <= len(cats) <= MAX_CATEGORIES
            or not all(isinstance(c, str) and c for c in cats)
        ):
            raise ParameterError(
                "categories",
                f"The 'categories' parameter of {owner} must be a list of 1 to "
                f"{MAX_CATEGORIES} non-empty strings. Got {cats!r} instead.",
            )
        if len(set(cats)) != len(cats):
            dup = next(c for c in cats if cats.count(c) > 1)
            raise ParameterError("categories", f"{owner}: category {dup!r} is listed twice.")
        check_fields(owner, dataclasses.asdict(self), RAPPOR_CONSTRAINTS)
        check_rappor_probs(owner, self.p, self.q)

    @property
    def k(self) -> int:
        """Report length in bits: one per category."""
        return len(self.categories)

    def index(self, value: Any) -> int:
        """Position of ``value`` in the category list; :class:`ParameterError` if absent."""
        try:
            return self.categories.index(value)
        except ValueError:
            shown = ", ".join(repr(c) for c in self.categories[:10])
            more = ", ..." if len(self.categories) > 10 else ""
            raise ParameterError(
                "value", f"{value!r} is not one of the categories ({shown}{more})"
            ) from None

    @property
    def hashes(self) -> int:
        return 1

    def as_rappor(self) -> StringParams:
        """One cohort, one hash: bit ``i`` is category ``i``."""
        return StringParams(k=self.k, h=1, m=1, p=self.p, q=self.q, f=self.f)

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        return hex_to_bits(payload, self.k, field)

    @classmethod
    def for_epsilon(
        cls, categories: list[str] | tuple[str, ...], epsilon_inf: float, *, p: float = 0.5,
        q: float = 0.75,
    ) -> CategoryParams:
        """Parameters whose longitudinal bound is ``epsilon_inf``."""
        return cls(categories=tuple(categories), p=p, q=q, f=f_for_epsilon_inf(epsilon_inf, 1))
