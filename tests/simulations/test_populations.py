"""Synthetic populations follow google/rappor's regression distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from veil.shared.errors import ParameterError
from veil.simulations.populations import DISTRIBUTIONS, Population, distribution_weights


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_weights_are_probabilities(name: str) -> None:
    weights = distribution_weights(name, 100)
    assert weights.shape == (100,)
    assert (weights > 0).all()
    assert math.isclose(weights.sum(), 1.0)


def test_shapes_follow_their_formulas() -> None:
    n = 100
    exp = distribution_weights("exp", n)
    assert math.isclose(exp[1] / exp[0], math.exp(-5 / n))  # dexp(1:n, rate = 5/n)
    gauss = distribution_weights("gauss", n)
    # dnorm((-n/2 + 1):(n/2), sd = n/6): the peak is at x = 0, i.e. value n/2 (index n/2 - 1)
    assert int(np.argmax(gauss)) == n // 2 - 1
    assert math.isclose(gauss[n // 2 - 1 + 10] / gauss[n // 2 - 1], math.exp(-0.5 * (10 / (n / 6)) ** 2))
    zipf = distribution_weights("zipf1.5", n)
    assert math.isclose(zipf[0] / zipf[3], 4**1.5)
    assert math.isclose(distribution_weights("zipf1", n)[0] / distribution_weights("zipf1", n)[9], 10)
    assert np.allclose(distribution_weights("uniform", n), 1 / n)


def test_unknown_distribution_names_the_choices() -> None:
    with pytest.raises(ParameterError, match=r"zipf1\.5"):
        distribution_weights("pareto", 10)


def test_population_from_csv(tmp_path) -> None:
    path = tmp_path / "pop.csv"
    path.write_text("value,count\nhome,30\nnews,10\n")
    population = Population.from_csv(path)
    assert population.values == ("home", "news")
    assert np.allclose(population.probs, [0.75, 0.25])
    path.write_text("home,x\n")
    with pytest.raises(ParameterError, match="not an integer"):
        Population.from_csv(path)


@pytest.mark.parametrize(("content", "message"), [
    (b"caf\xe9,3\n", r"not UTF-8 text \(byte 3\); save it as UTF-8"),
    (b'"home,3\nnews,1\n', "line 1: a quote is never closed"),
    (b"home,3,4\n", "expected 'value,count', got 3 columns"),
])
def test_a_population_file_veil_cannot_read_is_named(tmp_path, content, message) -> None:
    path = tmp_path / "pop.csv"
    path.write_bytes(content)
    with pytest.raises(ParameterError, match=message) as refused:
        Population.from_csv(path)
    assert refused.value.field == "population"
    with pytest.raises(ParameterError, match="cannot read"):
        Population.from_csv(tmp_path / "missing.csv")


def test_a_byte_order_mark_is_not_part_of_the_first_value(tmp_path) -> None:
    path = tmp_path / "pop.csv"
    path.write_bytes("\ufeffvalue,count\nhome,3\n".encode())
    assert Population.from_csv(path).values == ("home",)


def test_sampling_is_seeded_and_multinomial() -> None:
    """Counts of value v1 are Binomial(n, p1): within 4.5 sds sqrt(n p1 (1 - p1))."""
    population = Population.named("zipf1", 50)
    a = population.sample(100000, np.random.default_rng(3))
    b = population.sample(100000, np.random.default_rng(3))
    assert (a == b).all()
    p1 = population.probs[0]
    assert abs((a == 0).sum() - 100000 * p1) <= 4.5 * math.sqrt(100000 * p1 * (1 - p1))
    hist = population.cohort_histogram(100000, 8, np.random.default_rng(4))
    assert hist.shape == (8, 50) and hist.sum() == 100000
