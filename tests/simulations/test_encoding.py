"""The vectorized encoder against the client SDK's encoder and against the exact probabilities.

Every statistical check uses a fixed seed and a tolerance of Z standard
deviations derived from the binomial variance: a frequency of n Bernoulli(pi)
draws has sd sqrt(pi (1 - pi) / n); the difference of two independent
frequencies has sd sqrt(pi (1 - pi) (1/n1 + 1/n2)).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from veil.client.encoders import make_encoder
from veil.server.analysis.candidate_map import bloom_index_array, indices_to_map
from veil.server.analysis.synthetic import string_counts_from_values
from veil.shared.bits import PROB_ONE, bit_list, realize, realized
from veil.shared.hashing import bloom_bits
from veil.shared.kinds import BooleanParams, CategoryParams, NumberParams, StringParams
from veil.shared.registry import Metric
from veil.simulations.encoding import (
    aggregate_categories,
    bloom_table,
    encode_booleans,
    encode_categories,
    encode_numbers,
    encode_strings,
)
from veil.simulations.populations import Population

Z = 4.5  # standard deviations: about 7e-6 two-sided false alarms per check
N_SDK = 6000
N_SIM = 40000


def sdk_payloads(metric: Metric, value, n: int, seed: int, cohort_seed: int = 0, repeat: int = 1):
    """``n`` installations (distinct secrets, seeded fresh noise) each reporting ``value``."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        encoder = make_encoder(metric, rnd.randbytes(32), cohort_seed, random_bytes=rnd.randbytes)
        out.append([encoder.encode(value) for _ in range(repeat)])
    return out


def assert_frequency(ones: float, n: int, pi: float, what: str) -> None:
    """A count of ones among ``n`` Bernoulli(``pi``) draws is within Z binomial sds of n pi."""
    sd = math.sqrt(n * pi * (1 - pi))
    assert abs(ones - n * pi) <= Z * sd + 1e-9, f"{what}: {ones} ones of {n}, expected {n * pi:.1f}"


def assert_same_frequency(a: float, na: int, b: float, nb: int, pi: float, what: str) -> None:
    """Two frequencies agree within Z sds of their difference."""
    sd = math.sqrt(pi * (1 - pi) * (1 / na + 1 / nb))
    assert abs(a / na - b / nb) <= Z * sd, f"{what}: {a / na:.4f} vs {b / nb:.4f}"


def test_bloom_table_matches_shared_hashing() -> None:
    params = StringParams(k=128, h=3, m=5)
    values = ["apple", "banana", "ümlaut", ""]
    table = bloom_table(params, values)
    for cohort in range(params.m):
        for v, value in enumerate(values):
            packed = int(table[v, cohort, 0]) | (int(table[v, cohort, 1]) << 64)
            assert packed == bloom_bits(value, cohort, params.k, params.h)


def test_payloads_parse_as_wire_reports() -> None:
    params = StringParams(k=20, h=2, m=2)
    table = bloom_table(params, ["a", "b"])
    reports = encode_strings(params, table, np.array([0, 1, 1]), np.array([0, 1, 0]),
                             np.random.default_rng(1))
    bits = reports.bits()
    for row, payload in zip(bits, reports.payloads(), strict=True):
        assert bit_list(params.parse_payload(payload), params.k) == list(row)


@pytest.mark.parametrize("p,q,f", [(0.39, 0.61, 0.45), (0.5, 0.75, 0.5)])
def test_string_bits_match_sdk(p: float, q: float, f: float) -> None:
    params = StringParams(k=16, h=2, m=4, p=p, q=q, f=f)
    metric = Metric("homepage", params)
    cohort = 3
    sdk = np.array(
        [bit_list(params.parse_payload(r[0]), 16) for r in sdk_payloads(metric, "apple", N_SDK, 7, cohort)]
    )
    table = bloom_table(params, ["apple"])
    sim = encode_strings(params, table, np.zeros(N_SIM, np.int64), np.full(N_SIM, cohort),
                         np.random.default_rng(7)).bits()
    p_star, q_star = params.effective_probs
    bloom = bit_list(bloom_bits("apple", cohort, 16, 2), 16)
    for i in range(16):
        pi = q_star if bloom[i] else p_star
        assert_frequency(sdk[:, i].sum(), N_SDK, pi, f"sdk bit {i}")
        assert_frequency(sim[:, i].sum(), N_SIM, pi, f"simulated bit {i}")
        assert_same_frequency(sdk[:, i].sum(), N_SDK, sim[:, i].sum(), N_SIM, pi, f"bit {i}")


def test_string_prr_is_shared_by_reports_of_one_client() -> None:
    """Two reports of one value: P(both 1) = pi q^2 + (1 - pi) p^2, pi = P(PRR bit = 1)."""
    params = StringParams(k=8, h=1, m=1, p=0.25, q=0.75, f=0.5)
    metric = Metric("homepage", params)
    sdk = np.array([
        [bit_list(params.parse_payload(x), 8) for x in r]
        for r in sdk_payloads(metric, "apple", N_SDK, 11, repeat=2)
    ])
    n = N_SIM
    clients = np.repeat(np.arange(n), 2)
    sim = encode_strings(params, bloom_table(params, ["apple"]), np.zeros(2 * n, np.int64),
                         np.zeros(2 * n, np.int64), np.random.default_rng(11), clients=clients)
    sim_bits = sim.bits().reshape(n, 2, 8)
    fr, pr, qr = realized(0.5), realized(0.25), realized(0.75)
    bloom = bit_list(bloom_bits("apple", 0, 8, 1), 8)
    for i in range(8):
        prr_one = 1 - fr / 2 if bloom[i] else fr / 2
        both = prr_one * qr**2 + (1 - prr_one) * pr**2
        assert_frequency((sdk[:, 0, i] & sdk[:, 1, i]).sum(), N_SDK, both, f"sdk bit {i}")
        assert_frequency((sim_bits[:, 0, i] & sim_bits[:, 1, i]).sum(), n, both, f"sim bit {i}")


def test_category_bits_match_sdk() -> None:
    params = CategoryParams(categories=("a", "b", "c", "d", "e"), p=0.3, q=0.8, f=0.2)
    metric = Metric("browser", params)
    sdk = np.array([bit_list(params.parse_payload(r[0]), 5) for r in sdk_payloads(metric, "c", N_SDK, 3)])
    sim = encode_categories(params, np.full(N_SIM, 2), np.random.default_rng(3)).bits()
    p_star, q_star = params.effective_probs
    for i in range(5):
        pi = q_star if i == 2 else p_star
        assert_frequency(sdk[:, i].sum(), N_SDK, pi, f"sdk bit {i}")
        assert_frequency(sim[:, i].sum(), N_SIM, pi, f"simulated bit {i}")
        assert_same_frequency(sdk[:, i].sum(), N_SDK, sim[:, i].sum(), N_SIM, pi, f"bit {i}")


@pytest.mark.parametrize("value", [True, False])
def test_boolean_answers_match_sdk(value: bool) -> None:
    params = BooleanParams(alpha=0.3, beta=0.6)
    metric = Metric("flag", params)
    sdk = np.array([r[0] for r in sdk_payloads(metric, value, N_SDK, 5)])
    sim = encode_booleans(params, np.full(N_SIM, value), np.random.default_rng(5))
    pi = params.yes_probs[int(value)]
    assert_frequency(sdk.sum(), N_SDK, pi, "sdk")
    assert_frequency(sim.sum(), N_SIM, pi, "simulated")
    assert_same_frequency(sdk.sum(), N_SDK, sim.sum(), N_SIM, pi, "yes")


def test_memoized_kinds_repeat_the_same_answer() -> None:
    rng = np.random.default_rng(9)
    clients = np.repeat(np.arange(500), 3)
    answers = encode_booleans(BooleanParams(), np.ones(1500, bool), rng, clients=clients)
    assert (answers.reshape(500, 3) == answers.reshape(500, 3)[:, :1]).all()
    numbers = encode_numbers(NumberParams(), np.full(1500, 0.5), rng, clients=clients)
    assert (numbers.reshape(500, 3) == numbers.reshape(500, 3)[:, :1]).all()


def test_one_bit_mean_matches_sdk() -> None:
    """Off the grid, so alpha-point rounding is exercised: position 6.4 rounds up w.p. 0.4."""
    params = NumberParams(low=0, high=10, mechanism="1bitmean", epsilon=1.0, resolution=16)
    metric = Metric("load", params)
    value = 4.0  # position 6.4 on the 16-step grid
    sdk = np.array([r[0] for r in sdk_payloads(metric, value, N_SDK, 13)])
    sim = encode_numbers(params, np.full(N_SIM, value), np.random.default_rng(13))
    up = 0.4
    pi = ((1 - up) * params.one_bit_numerator(6) + up * params.one_bit_numerator(7)) / PROB_ONE
    assert_frequency(sdk.sum(), N_SDK, pi, "sdk")
    assert_frequency(sim.sum(), N_SIM, pi, "simulated")
    assert_same_frequency(sdk.sum(), N_SDK, sim.sum(), N_SIM, pi, "ones")


def noise_pmf(params: NumberParams, z: np.ndarray) -> np.ndarray:
    """Exact probabilities of the integer noise values ``z`` (grid units)."""
    if params.mechanism == "laplace":
        r = math.exp(-1 / params.laplace_scale)
        return (1 - r) / (1 + r) * r ** np.abs(z)
    sigma2 = params.gaussian_sigma**2
    support = np.arange(-40 * int(math.sqrt(sigma2) + 1), 40 * int(math.sqrt(sigma2) + 1) + 1)
    return np.exp(-(z**2) / (2 * sigma2)) / np.exp(-(support**2) / (2 * sigma2)).sum()


@pytest.mark.parametrize(
    "params",
    [
        NumberParams(low=0, high=8, mechanism="laplace", epsilon=2.0, resolution=8),
        NumberParams(low=0, high=8, mechanism="gaussian", epsilon=4.0, delta=1e-3, resolution=4),
    ],
    ids=["laplace", "gaussian"],
)
def test_number_noise_matches_sdk(params: NumberParams) -> None:
    """On a grid point: the noise frequencies of values -2..2 match the exact pmf."""
    metric = Metric("load", params)
    value = params.low + 3 * params.step
    n_sdk = 3000
    sdk = np.array([r[0] for r in sdk_payloads(metric, value, n_sdk, 17)])
    sim = encode_numbers(params, np.full(N_SIM, value), np.random.default_rng(17))
    sdk_z = np.rint((sdk - params.low) / params.step - 3).astype(int)
    sim_z = np.rint((sim - params.low) / params.step - 3).astype(int)
    for z in range(-2, 3):
        pi = float(noise_pmf(params, np.array([z]))[0])
        assert_frequency((sdk_z == z).sum(), n_sdk, pi, f"sdk z={z}")
        assert_frequency((sim_z == z).sum(), N_SIM, pi, f"simulated z={z}")
        assert_same_frequency((sdk_z == z).sum(), n_sdk, (sim_z == z).sum(), N_SIM, pi, f"z={z}")


def standardized_counts(ones, mean, var) -> np.ndarray:
    return (ones - mean) / np.sqrt(var)


@pytest.mark.parametrize("reports_per_client", [1, 3])
def test_fast_path_and_report_matrix_have_the_same_law(reports_per_client: int) -> None:
    """Per (cohort, bit): E = r (A q* + (N - A) p*), and with r reports per client
    Var = sum over clients of r (pi q(1-q) + (1-pi) p(1-p)) + r^2 (q-p)^2 pi (1-pi),
    pi = 1 - f/2 or f/2. The standardized counts must have mean-square 1 within
    Z sds of the mean of m*k squared standard normals (sd sqrt(2/(m k)))."""
    r = reports_per_client
    params = StringParams(k=32, h=2, m=8, p=0.39, q=0.61, f=0.45)
    population = Population.named("zipf1", 20)
    rng = np.random.default_rng(21)
    hist = population.cohort_histogram(30000, params.m, rng)
    index = bloom_index_array(params, population.values)
    table = bloom_table(params, population.values)
    bloom_bits_set = np.zeros((len(population), params.m, params.k), dtype=np.int64)
    for j in range(params.h):
        np.put_along_axis(bloom_bits_set, index[:, :, j : j + 1], 1, axis=2)
    true_ones = np.einsum("cv,vck->ck", hist, bloom_bits_set)
    clients = hist.sum(axis=1)[:, None]
    fr, pr, qr = (realize(x) / PROB_ONE for x in (params.f, params.p, params.q))
    mean = np.zeros_like(true_ones, dtype=float)
    var = np.zeros_like(mean)
    for count, prr_one in ((true_ones, 1 - fr / 2), (clients - true_ones, fr / 2)):
        mean += count * r * (prr_one * qr + (1 - prr_one) * pr)
        var += count * (
            r * (prr_one * qr * (1 - qr) + (1 - prr_one) * pr * (1 - pr))
            + r**2 * (qr - pr) ** 2 * prr_one * (1 - prr_one)
        )
    true_map = indices_to_map(index, params.k, params.m)
    _, fast = string_counts_from_values(params, true_map, hist, rng, reports_per_client=r)
    cohorts = np.repeat(np.repeat(np.arange(params.m), len(population)), hist.ravel())
    values = np.repeat(np.tile(np.arange(len(population)), params.m), hist.ravel())
    matrix = encode_strings(params, table, np.repeat(values, r), np.repeat(cohorts, r), rng,
                            clients=np.repeat(np.arange(len(values)), r))
    reports, slow = matrix.counts(params.m)
    assert (reports == r * hist.sum(axis=1)).all()
    cells = params.m * params.k
    for name, ones in (("fast", fast), ("matrix", slow)):
        z = standardized_counts(ones, mean, var)
        assert abs(z.mean()) <= Z / math.sqrt(cells), name
        assert abs((z**2).mean() - 1) <= Z * math.sqrt(2 / cells), name


def test_category_fast_path_mean_and_variance() -> None:
    """ones_i ~ Bin(n_i, q*) + Bin(N - n_i, p*): check mean-square of the standardized counts."""
    params = CategoryParams(categories=tuple("abcdefghij"), p=0.4, q=0.7, f=0.3)
    hist = np.array([5000, 3000, 2000, 1000, 500, 400, 300, 200, 100, 0])
    p_star, q_star = params.effective_probs
    n = hist.sum()
    mean = hist * q_star + (n - hist) * p_star
    var = hist * q_star * (1 - q_star) + (n - hist) * p_star * (1 - p_star)
    rng = np.random.default_rng(4)
    z = np.concatenate([
        standardized_counts(aggregate_categories(params, hist, rng)[1], mean, var) for _ in range(200)
    ])
    assert abs((z**2).mean() - 1) <= Z * math.sqrt(2 / z.size)


def test_counts_equal_the_sum_of_report_bits_per_cohort() -> None:
    params = StringParams(k=20, h=3, m=3)
    table = bloom_table(params, ["a", "b", "c"])
    rng = np.random.default_rng(8)
    cohorts = rng.integers(0, 3, 5000)
    reports = encode_strings(params, table, rng.integers(0, 3, 5000), cohorts, rng)
    totals, ones = reports.counts(params.m)
    bits = reports.bits()
    for cohort in range(params.m):
        assert totals[cohort] == (cohorts == cohort).sum()
        assert (ones[cohort] == bits[cohorts == cohort].sum(axis=0)).all()
