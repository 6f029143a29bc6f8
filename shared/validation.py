"""Declarative checks for constructor arguments, in scikit-learn's manner.

A parameter class lists a constraint per field; :func:`check_fields` runs the
table and raises :class:`~veil.shared.errors.ParameterError` with a message of
the form "The 'f' parameter of StringParams must be in [0, 1]. Got 1.5 instead."
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from veil.shared.errors import ParameterError


@dataclass(frozen=True)
class Interval:
    """A numeric range; ``kind`` is ``int`` or ``float``."""

    kind: type
    low: float | None
    high: float | None
    closed: str = "both"  # "both", "left", "right" or "neither"

    def __str__(self) -> str:
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        low = "-inf" if self.low is None else _fmt(self.low)
        high = "inf" if self.high is None else _fmt(self.high)
        what = "an integer" if self.kind is int else "a number"
        return f"{what} in {left}{low}, {high}{right}"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if self.kind is float and not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (
            value < self.low or (value == self.low and self.closed in ("right", "neither"))
        ):
            return False
        return self.high is None or not (
            value > self.high or (value == self.high and self.closed in ("left", "neither"))
        )


@dataclass(frozen=True)
class OneOf:
    """A value from a fixed set of strings."""

    options: tuple[str, ...]

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options


def shown_number(value: Any) -> str:
    """``value`` for a message: its ``repr``, cut short, or for an integer too long to
    write out (TOML's are unbounded), how many digits it has."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return f"{value!r:.100}"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def check_fields(owner: str, values: Mapping[str, Any], constraints: Mapping[str, Any]) -> None:
    """Raise :class:`ParameterError` for the first value that breaks its constraint."""
    for name, constraint in constraints.items():
        value = values[name]
        if not constraint.accepts(value):
            raise ParameterError(
                name,
                f"The {name!r} parameter of {owner} must be {constraint}. Got "
                f"{shown_number(value)} instead.",
            )


def reject_unknown(owner: str, given: Mapping[str, Any], known: set[str]) -> None:
    """Raise :class:`ParameterError` naming keys that ``owner`` does not take."""
    unknown = sorted(set(given) - known)
    if unknown:
        raise ParameterError(
            unknown[0],
            f"{owner} does not take {', '.join(repr(u) for u in unknown)}; "
            f"known fields are {', '.join(sorted(known))}.",
        )
