"""Categories from a known list: basic (one-hot) RAPPOR, the default ``oracle``.

The other oracles a category metric may name (GRR, OUE, OLH, Hadamard) live in
:mod:`veil.shared.kinds.oracles`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from veil.shared.errors import ParameterError, type_name
from veil.shared.kinds.base import MechanismParams
from veil.shared.kinds.string import (
    RAPPOR_CONSTRAINTS,
    RapporBits,
    StringParams,
    check_rappor_probs,
    f_on_grid,
)
from veil.shared.validation import check_fields

MAX_CATEGORIES = 4096


def check_categories(owner: str, categories: Any, low: int, high: int) -> tuple[str, ...]:
    """``categories`` as a tuple of ``low`` to ``high`` distinct non-empty strings, or a
    :class:`ParameterError` naming the field."""
    cats = tuple(categories) if isinstance(categories, list) else categories
    if (
        not isinstance(cats, tuple)
        or not low <= len(cats) <= high
        or not all(isinstance(c, str) and c for c in cats)
    ):
        shown = repr(cats) if len(repr(cats)) < 200 else repr(cats)[:200] + "..."
        raise ParameterError(
            "categories",
            f"The 'categories' parameter of {owner} must be a list of {low} to {high} "
            f"non-empty strings. Got {shown} instead.",
        )
    if len(set(cats)) != len(cats):
        seen: set[str] = set()
        duplicate = next(c for c in cats if c in seen or seen.add(c))  # type: ignore[func-returns-value]
        raise ParameterError("categories", f"{owner}: category {duplicate!r} is listed twice.")
    return cats


def listed_choices(value: Any, choices: tuple[str, ...], what: str) -> str:
    """Why ``value`` is none of ``choices``, ``what`` they are with their number (``the 4
    categories`` of a metric, ``its 3 values`` of a joint variable), the first ten of them
    shown, and for a value that is no string its type. Never the value itself: it may be
    private, or huge."""
    shown = ", ".join(repr(choice) for choice in choices[:10])
    more = ", ..." if len(choices) > 10 else ""
    if isinstance(value, str):
        return f"is not one of {what} ({shown}{more})"
    return f"must be a str, one of {what} ({shown}{more}); got {type_name(value)}"


class CategoryList:
    """The position of a value in a category metric's ``categories``, whichever its oracle
    (:class:`CategoryParams` and :class:`~veil.shared.kinds.oracles.base.OracleParams`)."""

    categories: tuple[str, ...]

    @property
    def possible_values(self) -> tuple[int | None, str]:
        return len(self.categories), "categories"

    def index(self, value: Any) -> int:
        """Position of ``value`` in the category list; a :class:`ParameterError` (field
        ``value``) if it is not listed, naming the categories and the value's type, never
        the value (:func:`listed_choices`)."""
        position = self._positions.get(value) if isinstance(value, str) else None
        if position is None:
            raise ParameterError("value", listed_choices(
                value, self.categories, f"the {len(self.categories)} categories"))
        return position

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        """Each category's position (a dict: encoders look a value up for every report)."""
        return {category: i for i, category in enumerate(self.categories)}


@dataclasses.dataclass(frozen=True)
class CategoryParams(CategoryList, RapporBits, MechanismParams):
    """One bit per category (bit ``i`` is ``categories[i]``), then RAPPOR's PRR and IRR.

    With one bit set per value, RAPPOR's bounds apply with ``h = 1``.
    """

    kind: ClassVar[str] = "category"
    oracle: ClassVar[str] = "rappor"
    default_oracle: ClassVar[str] = "rappor"
    sized_by: ClassVar[tuple[str, ...]] = ("categories",)

    categories: tuple[str, ...] = ()
    p: float = 0.5
    q: float = 0.75
    f: float = 0.5

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "categories", check_categories(owner, self.categories, 1,
                                                                MAX_CATEGORIES))
        check_fields(owner, dataclasses.asdict(self), RAPPOR_CONSTRAINTS)
        check_rappor_probs(owner, self.p, self.q)

    @property
    def k(self) -> int:
        """Report length in bits: one per category."""
        return len(self.categories)

    @property
    def hashes(self) -> int:
        return 1

    def as_rappor(self) -> StringParams:
        """One cohort, one hash: bit ``i`` is category ``i``."""
        return StringParams(k=self.k, h=1, m=1, p=self.p, q=self.q, f=self.f)

    def parse_payload(self, payload: Any, field: str = "payload") -> int:
        return self.parse_bits(payload, self.k, field)

    @classmethod
    def for_epsilon(
        cls, categories: list[str] | tuple[str, ...], epsilon_inf: float, *, p: float = 0.5,
        q: float = 0.75,
    ) -> CategoryParams:
        """Parameters whose longitudinal bound is ``epsilon_inf``, ``f`` on the encoders'
        grid rounded towards more privacy (:func:`~veil.shared.kinds.string.f_on_grid`)."""
        return cls(categories=tuple(categories), p=p, q=q, f=f_on_grid(epsilon_inf, 1))
