"""Synthetic populations: who holds which value.

The five shapes are google/rappor's regression-test distributions over the
values ``v1 .. vn`` (weights normalized to sum to one):

* ``uniform``: equal weights;
* ``exp``: the exponential density at ``1..n`` with rate ``5/n``;
* ``gauss``: the normal density at ``-n/2+1 .. n/2`` with ``sd = n/6``;
* ``zipf1``: ``1/x``; ``zipf1.5``: ``1/x**1.5``.

A population can also be read from a CSV of ``value,count`` rows. Sampling
uses a seeded :class:`numpy.random.Generator`: simulation randomness is
reproducible and is NOT suitable for producing real reports.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np

from veil.shared.errors import ParameterError

DISTRIBUTIONS = ("uniform", "exp", "gauss", "zipf1", "zipf1.5")


def distribution_weights(name: str, n: int) -> np.ndarray:
    """Normalized probabilities of ``v1 .. vn`` for the named distribution."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParameterError("n", f"the number of values must be an integer >= 1; got {n!r}")
    x = np.arange(1, n + 1, dtype=float)
    if name == "uniform":
        weights = np.ones(n)
    elif name == "exp":
        rate = 5.0 / n
        weights = rate * np.exp(-rate * x)
    elif name == "gauss":
        sd = n / 6.0
        points = np.arange(-n / 2 + 1, n / 2 + 1, dtype=float)[:n]
        weights = np.exp(-0.5 * (points / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
    elif name == "zipf1":
        weights = 1.0 / x
    elif name == "zipf1.5":
        weights = x**-1.5
    else:
        raise ParameterError(
            "distribution", f"unknown distribution {name!r}; choose one of {', '.join(DISTRIBUTIONS)}"
        )
    normalized: np.ndarray = weights / weights.sum()
    return normalized


@dataclasses.dataclass(frozen=True)
class Population:
    """Distinct ``values`` with their probabilities ``probs`` (summing to one)."""

    values: tuple[str, ...]
    probs: np.ndarray

    def __post_init__(self) -> None:
        if len(self.values) != len(self.probs) or not self.values:
            raise ParameterError(
                "values", f"need one probability per value; got {len(self.values)} values and "
                f"{len(self.probs)} probabilities"
            )
        if len(set(self.values)) != len(self.values):
            raise ParameterError("values", "values must be distinct")
        if np.any(self.probs < 0) or not math.isclose(float(self.probs.sum()), 1.0, rel_tol=1e-9):
            raise ParameterError("probs", "probabilities must be >= 0 and sum to 1")

    @classmethod
    def named(cls, name: str, n: int) -> Population:
        """google/rappor's distribution ``name`` over ``v1 .. vn``."""
        return cls(tuple(f"v{i}" for i in range(1, n + 1)), distribution_weights(name, n))

    @classmethod
    def from_counts(cls, counts: dict[str, int] | list[tuple[str, int]]) -> Population:
        """A population proportional to the given ``value -> count`` table."""
        items = list(counts.items()) if isinstance(counts, dict) else list(counts)
        total = sum(count for _, count in items)
        if not items or total <= 0:
            raise ParameterError("counts", "need at least one value with a positive count")
        return cls(
            tuple(value for value, _ in items),
            np.array([count / total for _, count in items], dtype=float),
        )

    @classmethod
    def from_csv(cls, path: str | Path) -> Population:
        """Read ``value,count`` rows of a UTF-8 CSV file (an optional ``value,count`` header
        is skipped); :class:`ParameterError` of field ``population`` naming the line."""
        from veil.server.counts import csv_rows

        rows: list[tuple[str, int]] = []
        _, records = csv_rows(path, "population")
        for line_no, row in records:
            if not row or (line_no == 1 and [c.strip().lower() for c in row] == ["value", "count"]):
                continue
            if len(row) != 2:
                raise ParameterError(
                    "population", f"{path}:{line_no}: expected 'value,count', got {len(row)} columns"
                )
            try:
                count = int(row[1])
            except ValueError:
                raise ParameterError(
                    "population", f"{path}:{line_no}: count {row[1]!r} is not an integer"
                ) from None
            if count < 0:
                raise ParameterError("population", f"{path}:{line_no}: count must be >= 0")
            rows.append((row[0], count))
        return cls.from_counts(rows)

    def __len__(self) -> int:
        return len(self.values)

    @functools.cached_property
    def shares(self) -> dict[str, float]:
        """Each value's probability, by value."""
        return dict(zip(self.values, self.probs.tolist(), strict=True))

    def sample(self, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Value indices (into :attr:`values`) of ``n_clients`` independent clients."""
        return rng.choice(len(self.values), size=n_clients, p=self.probs)

    def histogram(self, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        """How many of ``n_clients`` independent clients hold each value (multinomial)."""
        return rng.multinomial(n_clients, self.probs)

    def cohort_histogram(self, n_clients: int, cohorts: int, rng: np.random.Generator) -> np.ndarray:
        """``(cohorts, n_values)`` counts for clients with a uniformly random cohort each."""
        joint = np.outer(np.full(cohorts, 1.0 / cohorts), self.probs).ravel()
        return rng.multinomial(n_clients, joint / joint.sum()).reshape(cohorts, len(self.values))


def total_variation(estimate: np.ndarray, truth: np.ndarray) -> float:
    """``0.5 sum |estimate - truth|``: how far an estimated distribution (or table, read
    flat) is from the population's."""
    return float(np.abs(np.asarray(estimate).reshape(-1) - np.asarray(truth).reshape(-1)).sum()
                 / 2)
