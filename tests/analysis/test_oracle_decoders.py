"""The category frequency oracles (GRR, OUE, OLH, Hadamard): support counts, decoders and
simulation encoders, checked against exact laws with fixed seeds.

* Support counts: the FFT (OLH) and Walsh-Hadamard (Hadamard) counts, and the number of
  categories each payload supports, equal brute-force loops over the responses,
  including ``d`` not a power of ``g`` or 2, ``d = 2`` and ``g = 2``.
* Decoders: :data:`RUNS` independent collections per oracle and population size (2,000,
  20,000 and 10^6 reports), each of installations drawing their category from the
  population (the composition ``Multinomial(N, shares)`` anew every run, the estimand
  docs/analysis.md states), then the direct statistic sampler
  (:func:`~veil.simulations.oracle_encoding.simulate_oracle_counts`), in the default
  design and the one-shot one (``report_epsilon = epsilon``, where the population's
  share of the variance is largest):

  - unbiased: each category's mean estimate lies within 4 standard errors of its
    population share, the standard error of a mean of ``RUNS`` runs being the stated
    one over ``sqrt(RUNS)``;
  - honest errors: the stated standard error (root mean square over runs) of every
    share and of their sum (``allocated_proportion_std_error``) is within 10% of the
    observed spread. An estimated standard deviation from ``RUNS`` runs has a relative
    standard error of ``sqrt(1 / (2 (RUNS - 1)))`` = 2.2% at 1,000 runs, so the 10%
    band is 4.5 of those; GRR's sum is identically 1, so its stated error is 0;
  - coverage: 95% intervals cover the truth 93-97% of the time, pooled over the
    categories and runs of each (oracle, size). At the pooled 16,000 intervals the
    binomial standard error of the coverage is 0.17% (the band is 11 of them); were
    the categories of a run perfectly correlated, the 1,000 runs alone would give
    0.69% (the band still 2.9 of them).

* Simulation encoders: each oracle's per-report law (chi-square goodness of fit of the
  payloads of one category against the exact channel, rejected below 1e-4), the
  sharing of the permanent response within an installation, the direct sampler's mean
  against the exact expected counts (within 5 standard errors per cell), and the decoder
  through ``decode_counts`` on a counts document of simulated reports.
* Tiny populations (one report; a few identical ones) through ``veil decode --db``.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from veil.server.analysis.decoders import DECODERS, decode_counts
from veil.server.analysis.oracles import (
    hadamard_support,
    hadamard_support_sizes,
    olh_support,
    olh_support_sizes,
)
from veil.server.cli import main
from veil.server.counts import CountsArrays
from veil.server.storage import open_storage
from veil.shared.bits import PROB_ONE
from veil.shared.kinds import GrrParams, HadamardParams, OlhParams, OracleParams, OueParams
from veil.shared.kinds.oracles.olh import bucket_channel
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import statistic_for
from veil.shared.wire import make_batch, make_report, validate_batch
from veil.simulations.encoders import SIMULATORS
from veil.simulations.encoding import unpack_bits
from veil.simulations.oracle_encoding import (
    encode_grr,
    encode_hadamard,
    encode_olh,
    encode_oue,
    oracle_counts_document,
    oue_counts_document,
    simulate_oracle_counts,
)

RUNS = 1000
SIZES = (2_000, 20_000, 1_000_000)


def _categories(d: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(d))


#: one configuration per oracle: moderate d, epsilon from 1 to 4
ORACLES: list[OracleParams] = [
    GrrParams(categories=_categories(8), epsilon=3.0),
    OueParams(categories=_categories(16), epsilon=2.0),
    OlhParams(categories=_categories(16), epsilon=4.0),
    HadamardParams(categories=_categories(16), epsilon=1.0),
]
IDS = [params.oracle for params in ORACLES]
#: the same at epsilon 4 in the one-shot design (``report_epsilon = epsilon``)
ONE_SHOT: list[OracleParams] = [
    type(params)(categories=_categories(params.d), epsilon=4.0, report_epsilon=4.0)
    for params in ORACLES
]


def _shares(d: int) -> np.ndarray:
    """A skewed population with one empty category (the last)."""
    weights = np.r_[1.0 / np.arange(1, d), 0.0]
    return np.asarray(weights / weights.sum())


def _field(params: OracleParams) -> str:
    return statistic_for(params).fields[0].name


def _counts_arrays(params: OracleParams, reports: int, counts: np.ndarray) -> CountsArrays:
    return CountsArrays("m", params, np.array([reports]), {_field(params): counts[None, :]})


# ---------------------------------------------------------------- support counts


@pytest.mark.parametrize(("d", "g"), [(2, 2), (2, 3), (2, None), (3, 2), (5, 2), (8, 2),
                                      (10, 3), (9, 3), (26, 5), (50, 7), (7, 11), (16, None)])
def test_olh_support_counts_equal_a_brute_force_loop(d: int, g: int | None) -> None:
    params = OlhParams(categories=_categories(d), epsilon=2.0, g=g)
    counts = np.random.default_rng(d * 100 + (g or 0)).integers(0, 1000, params.responses)
    table = counts.reshape(params.functions, params.buckets)
    brute = [sum(int(table[a, params.hash(a, x)]) for a in range(params.functions))
             for x in range(d)]
    assert olh_support(params, counts).tolist() == brute
    # the categories each payload supports (the allocated share's variance reads them)
    sizes = [[sum(params.hash(a, x) == b for x in range(d)) for b in range(params.buckets)]
             for a in range(params.functions)]
    assert olh_support_sizes(params).tolist() == np.ravel(sizes).tolist()


@pytest.mark.parametrize("d", [2, 3, 4, 5, 7, 8, 9, 20, 33])
def test_hadamard_support_counts_equal_a_brute_force_loop(d: int) -> None:
    params = HadamardParams(categories=_categories(d), epsilon=2.0)
    counts = np.random.default_rng(d).integers(0, 1000, params.responses)
    brute = [sum(int(counts[y]) for y in range(params.size) if params.supports(x, y))
             for x in range(d)]
    assert hadamard_support(params, counts).tolist() == brute
    sizes = [sum(params.supports(x, y) for x in range(d)) for y in range(params.size)]
    assert hadamard_support_sizes(params).tolist() == sizes


def test_olh_support_counts_stay_exact_at_large_counts() -> None:
    # rounding the floating-point transform: counts near 10^9 per cell still come out exact
    params = OlhParams(categories=_categories(40), epsilon=3.0, g=3)
    counts = np.random.default_rng(5).integers(10**8, 10**9, params.responses)
    table = counts.reshape(params.functions, params.buckets)
    brute = [sum(int(table[a, params.hash(a, x)]) for a in range(params.functions))
             for x in range(40)]
    assert olh_support(params, counts).tolist() == brute


# ---------------------------------------------------------------- unbiasedness and coverage


@pytest.mark.parametrize("params", ORACLES + ONE_SHOT,
                         ids=IDS + [f"{name}-one-shot" for name in IDS])
def test_decoder_is_unbiased_with_honest_errors_and_coverage(params: OracleParams) -> None:
    z = stats.norm.isf(0.025)
    rng = np.random.default_rng(2024 + len(params.oracle))
    truth = _shares(params.d)
    for reports in SIZES:
        # columns: the shares, then their sum (allocated_proportion_unbiased, truth 1)
        estimates = np.zeros((RUNS, params.d + 1))
        std_errors = np.zeros((RUNS, params.d + 1))
        for run in range(RUNS):
            composition = rng.multinomial(reports, truth)
            counts = simulate_oracle_counts(params, composition, rng)
            result = decode_counts(_counts_arrays(params, reports, counts))
            summary = result.summary
            estimates[run] = [*result.column("proportion"),
                              summary["allocated_proportion_unbiased"]]
            std_errors[run] = [*result.column("prop_std_error"),
                               summary["allocated_proportion_std_error"]]
        stated = np.sqrt(np.mean(std_errors**2, axis=0))
        where = f"{params.oracle} N={reports} report_epsilon={params.report_epsilon}"
        shares, total = estimates[:, :-1], estimates[:, -1]
        # unbiased: the mean of RUNS runs has standard error stated / sqrt(RUNS); 4 of them
        bias = shares.mean(axis=0) - truth
        assert np.all(np.abs(bias) < 4 * stated[:-1] / math.sqrt(RUNS)), (where, bias / stated[:-1])
        # honest errors: 10% band, 4.5 relative standard errors of a standard deviation
        observed = estimates.std(axis=0, ddof=1)
        if isinstance(params, GrrParams):  # every report supports one category: the sum is 1
            assert np.all(std_errors[:, -1] == 0) and np.allclose(total, 1.0, atol=1e-12), where
            observed, stated = observed[:-1], stated[:-1]
        assert np.all(np.abs(observed / stated - 1) < 0.10), (where, observed / stated)
        # coverage of 95% intervals, pooled (binomial SE 0.17%-0.69%, see the module)
        covered = np.abs(shares - truth) <= z * std_errors[:, :-1]
        assert 0.93 <= covered.mean() <= 0.97, (where, covered.mean())


# ---------------------------------------------------------------- exact channels


def _channel(params: OracleParams) -> np.ndarray:
    """``P[x, payload]``: the exact law of one report of category ``x``, from the docstrings."""
    d, prr, keep = params.d, params.prr_numerator / PROB_ONE, params.keep
    if isinstance(params, GrrParams):
        own, other = params.channel(params.prr_numerator, params.irr_numerator)
        return np.where(np.eye(d, dtype=bool), own, other)
    if isinstance(params, OlhParams):
        g = params.buckets
        own, other = bucket_channel(g, params.prr_numerator, params.irr_numerator)
        out = np.full((d, params.functions, g), other / params.functions)
        for x in range(d):
            for a in range(params.functions):
                out[x, a, params.hash(a, x)] = own / params.functions
        return out.reshape(d, -1)
    assert isinstance(params, HadamardParams)
    size = params.size
    inside = (2 * prr * keep + (1 - keep)) / size
    outside = (2 * (1 - prr) * keep + (1 - keep)) / size
    return np.array([[inside if params.supports(x, y) else outside for y in range(size)]
                     for x in range(d)])


SMALL: list[OracleParams] = [
    GrrParams(categories=_categories(5), epsilon=2.0),
    OlhParams(categories=_categories(5), epsilon=2.0, g=2),
    OlhParams(categories=_categories(6), epsilon=3.0),
    HadamardParams(categories=_categories(5), epsilon=2.0),
]
SMALL_IDS = [f"{p.oracle}-{p.d}" + (f"-g{p.buckets}" if isinstance(p, OlhParams) else "")
             for p in SMALL]
ENCODE = {GrrParams: encode_grr, OlhParams: encode_olh, HadamardParams: encode_hadamard}


@pytest.mark.parametrize("params", SMALL, ids=SMALL_IDS)
def test_simulated_reports_have_the_exact_channel(params: OracleParams) -> None:
    channel = _channel(params)
    assert np.allclose(channel.sum(axis=1), 1.0)
    rng = np.random.default_rng(11)
    for x in (0, params.d - 1):
        n = 40_000
        payloads = ENCODE[type(params)](params, np.full(n, x), rng)  # type: ignore[operator]
        observed = np.bincount(payloads, minlength=params.responses)
        assert observed.size == params.responses
        # chi-square goodness of fit to the exact law, rejected below 1e-4
        expected = n * channel[x]
        chi2 = float(np.sum((observed - expected) ** 2 / expected))
        assert stats.chi2.sf(chi2, params.responses - 1) > 1e-4, (params.oracle, x, chi2)


def test_simulated_oue_bits_have_the_exact_law() -> None:
    params = OueParams(categories=_categories(11), epsilon=2.0)
    p, q = params.support_probs
    rng = np.random.default_rng(12)
    n, x = 40_000, 3
    bits = unpack_bits(encode_oue(params, np.full(n, x), rng), params.d).astype(float)
    expected = np.full(params.d, q)
    expected[x] = p
    # each bit: a binomial mean, 5 standard errors
    se = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(bits.mean(axis=0) - expected) <= 5 * se)
    # bits are independent: pairwise products have mean p_i p_j (5 standard errors)
    pairs = bits[:, :, None] * bits[:, None, :]
    product = expected[:, None] * expected[None, :]
    off = ~np.eye(params.d, dtype=bool)
    gap = np.abs(pairs.mean(axis=0) - product)[off]
    assert np.all(gap <= 5 * np.sqrt(product * (1 - product) / n)[off])


@pytest.mark.parametrize("params", [*SMALL, OueParams(categories=_categories(6), epsilon=2.0)],
                         ids=[*SMALL_IDS, "oue-6"])
def test_reports_of_one_installation_share_their_permanent_response(params: OracleParams,
                                                                     ) -> None:
    # 20,000 installations, each reporting category 1 twice: the two reports agree with the
    # probability of two instantaneous responses of one permanent response
    installations = 20_000
    clients = np.repeat(np.arange(installations), 2)
    values = np.ones(2 * installations, dtype=np.int64)
    rng = np.random.default_rng(13)
    keep = params.keep
    if isinstance(params, OueParams):
        words = encode_oue(params, values, rng, clients)
        bits = unpack_bits(words, params.d).reshape(installations, 2, params.d)
        agree = (bits[:, 0] == bits[:, 1]).mean(axis=0)
        zero, one = (t / PROB_ONE for t in params.irr_thresholds(params.irr_numerator))
        chance = np.full(params.d, one**2 + zero**2)  # either permanent bit
    else:
        payloads = ENCODE[type(params)](params, values, rng, clients)  # type: ignore[operator]
        pairs = payloads.reshape(installations, 2)
        if isinstance(params, OlhParams):
            # the function is part of the permanent response: always equal
            assert np.array_equal(pairs[:, 0] // params.buckets, pairs[:, 1] // params.buckets)
            symbols = params.buckets
        else:
            symbols = params.responses
        agree = np.array([(pairs[:, 0] == pairs[:, 1]).mean()])
        fresh = (1 - keep) / symbols
        chance = np.array([(keep + fresh) ** 2 + (symbols - 1) * fresh**2])
    # binomial means over the installations, 5 standard errors
    se = np.sqrt(chance * (1 - chance) / installations)
    assert np.all(np.abs(agree - chance) <= 5 * se), (params.oracle, agree, chance)


#: the small configurations, and larger ones where light categories take the per-report
#: path of the direct sampler and heavy ones the multinomial path
SAMPLED: list[OracleParams] = [
    *SMALL,
    OueParams(categories=_categories(6), epsilon=2.0),
    OlhParams(categories=_categories(20), epsilon=2.0, g=7),
    HadamardParams(categories=_categories(20), epsilon=2.0),
    GrrParams(categories=_categories(20), epsilon=1.0),
]


@pytest.mark.parametrize("params", SAMPLED, ids=[
    f"{p.oracle}-{p.d}" + (f"-g{p.buckets}" if isinstance(p, OlhParams) else "") for p in SAMPLED])
def test_direct_sampler_has_the_exact_expected_counts(params: OracleParams) -> None:
    true_counts = np.zeros(params.d, dtype=np.int64)
    pattern = [500, 300, 0, 150, 50, 12, 3, 1]
    true_counts[: min(params.d, len(pattern))] = pattern[: params.d]
    total = int(true_counts.sum())
    if isinstance(params, OueParams):
        p, q = params.support_probs
        probs = np.where(np.eye(params.d, dtype=bool), p, q)
    else:
        probs = _channel(params)
    # per cell, a sum over categories of binomials: exact mean and variance
    mean = true_counts @ probs
    variance = true_counts @ (probs * (1 - probs))
    rng = np.random.default_rng(14)
    runs = 400
    draws = np.array([simulate_oracle_counts(params, true_counts, rng) for _ in range(runs)])
    if not isinstance(params, OueParams):
        assert np.all(draws.sum(axis=1) == total)
    # the mean of 400 draws, 5 standard errors per cell
    assert np.all(np.abs(draws.mean(axis=0) - mean) <= 5 * np.sqrt(variance / runs))
    # the spread: each cell's sample variance against the exact one (chi-square law of a
    # sample variance, two 1e-4 tails shared among the cells: Bonferroni)
    ratio = draws.var(axis=0, ddof=1)[variance > 0] / variance[variance > 0]
    dof, tail = runs - 1, 1e-4 / ratio.size
    assert np.all(ratio > stats.chi2.ppf(tail, dof) / dof), ratio.min()
    assert np.all(ratio < stats.chi2.isf(tail, dof) / dof), ratio.max()


# ---------------------------------------------------------------- through decode_counts


@pytest.mark.parametrize("params", ORACLES, ids=IDS)
def test_decode_counts_of_simulated_reports(params: OracleParams) -> None:
    shares = _shares(params.d)
    n = 30_000
    rng = np.random.default_rng(15)
    values = list(rng.choice(params.categories, size=n, p=shares))
    simulated = SIMULATORS[params.mechanism_name](params, values, rng)
    statistic = statistic_for(params)
    stored = [statistic.stored_payload(params, p, params.parse_payload(p))
              for p in simulated.payloads]
    [(_, reports, state)] = statistic.accumulate(params, simulated.cohorts, stored)
    document = {"metric": "m", "kind": params.kind, "params": params.to_dict(),
                "reports": reports,
                "cohorts": [{"cohort": 0, "reports": reports, **statistic.to_entry(state)}]}
    result = decode_counts(document)
    assert result.column("value") == list(params.categories)
    truth = {c: values.count(c) / n for c in params.categories}
    for row in result.rows:
        # within 4 stated standard errors of the realized shares
        assert abs(row["proportion"] - truth[row["value"]]) <= 4 * row["prop_std_error"], row
    summary = result.summary
    assert summary["oracle"] == params.oracle and summary["reports"] == n
    assert summary["support_probs"] == list(params.support_probs)
    assert summary["share_variance_per_report"] == params.share_variance()
    assert summary["epsilon_inf"] == params.epsilon_inf
    assert summary["epsilon_1"] == params.epsilon_1
    if isinstance(params, OlhParams):
        assert summary["buckets"] == params.buckets
    if isinstance(params, HadamardParams):
        assert summary["size"] == params.size


def test_counts_documents_of_the_direct_sampler_decode() -> None:
    rng = np.random.default_rng(16)
    for params in ORACLES:
        true_counts = np.round(_shares(params.d) * 50_000).astype(np.int64)
        counts = simulate_oracle_counts(params, true_counts, rng)
        document = (oue_counts_document(params, int(true_counts.sum()), counts)
                    if isinstance(params, OueParams) else oracle_counts_document(params, counts))
        result = decode_counts(document)
        truth = true_counts / true_counts.sum()
        # within 4 stated standard errors
        assert np.all(np.abs(np.array(result.column("proportion")) - truth)
                      <= 4 * np.array(result.column("prop_std_error")))


def test_olh_decode_time_does_not_grow_with_reports() -> None:
    # one FFT of the g^(r+1) counters: 10^6 reports over 1,024 categories in well under 2 s
    # (one call, a loose wall-clock bound on a shared machine)
    params = OlhParams(categories=_categories(1024), epsilon=2.0)
    true_counts = np.random.default_rng(17).multinomial(1_000_000, np.full(1024, 1 / 1024))
    counts = simulate_oracle_counts(params, true_counts, np.random.default_rng(18))
    started = time.perf_counter()
    result = DECODERS[params.mechanism_name](_counts_arrays(params, 1_000_000, counts))
    assert time.perf_counter() - started < 2.0
    assert len(result.rows) == 1024


# ---------------------------------------------------------------- tiny populations


@pytest.mark.parametrize("params", [*ORACLES, OlhParams(categories=("a", "b"), epsilon=1.0, g=2),
                                    HadamardParams(categories=("a", "b"), epsilon=0.5)],
                         ids=[*IDS, "olh-2-g2", "hadamard-2"])
@pytest.mark.parametrize("reports", [1, 2, 1000])
def test_tiny_or_uniform_populations_decode(params: OracleParams, reports: int) -> None:
    # every report carries the same payload: the most lopsided statistic there is
    field = np.zeros(statistic_for(params).length(params), dtype=np.int64)
    field[0] = reports
    result = DECODERS[params.mechanism_name](_counts_arrays(params, reports, field))
    shares = np.array(result.column("proportion"))
    errors = np.array(result.column("prop_std_error"))
    assert np.all(np.isfinite(shares)) and np.all(np.isfinite(errors)) and np.all(errors > 0)
    for row in result.rows:
        assert 0.0 <= row["prop_low_95"] <= row["prop_high_95"] <= 1.0
        assert 0.0 <= row["p_value"] <= 1.0
    if not np.all((shares >= 0) & (shares <= 1)):
        assert "outside [0, 1]" in result.summary["note"]


def test_response_counts_add_up_to_the_reports() -> None:
    from veil.server.counts import counts_arrays
    from veil.shared.errors import ParameterError

    params = GrrParams(categories=("a", "b", "c"))
    statistic = statistic_for(params)
    # accumulate groups by cohort and counts each payload; the fold of single reports agrees
    rows = statistic.accumulate(params, np.array([0, 2, 0, 0]), [2, 1, 2, 0])
    assert [(c, n, s["responses"].tolist()) for c, n, s in rows] == [(0, 3, [1, 0, 2]),
                                                                     (2, 1, [0, 1, 0])]
    assert statistic.of_report(params, 1)["responses"].tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="outside"):
        statistic.accumulate(params, np.array([0]), [3])
    document = oracle_counts_document(params, np.array([1, 2, 1]))
    assert counts_arrays(document).fields["responses"].tolist() == [[1, 2, 1]]
    document["reports"] = document["cohorts"][0]["reports"] = 5
    with pytest.raises(ParameterError, match="add up to 4"):
        counts_arrays(document)


def test_no_reports_is_a_clear_error() -> None:
    from veil.shared.errors import ParameterError

    params = ORACLES[0]
    with pytest.raises(ParameterError, match="no reports"):
        DECODERS[params.mechanism_name](
            _counts_arrays(params, 0, np.zeros(params.responses, dtype=np.int64)))


def test_veil_decode_of_a_tiny_population_from_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = {f"m_{params.oracle}": params for params in ORACLES}
    registry = Registry([Metric(name, params, min_reports=1) for name, params in metrics.items()])
    rng = np.random.default_rng(19)
    reports = []
    for name, params in metrics.items():
        # three reports of one installation (one shared permanent response) and one other
        simulated = SIMULATORS[params.mechanism_name](
            params, ["c1", "c1", "c1", "c0"], rng, np.array([0, 0, 0, 1]))
        reports += [make_report(f"{len(reports) + i:032x}", name, None, payload,
                                params.fingerprint)
                    for i, payload in enumerate(simulated.payloads)]
    validation = validate_batch(make_batch("f" * 32, reports), registry)
    assert validation.errors == []
    storage = open_storage(tmp_path / "veil.db", registry, create=True)
    try:
        assert storage.insert(validation.reports, "2024-01-01").accepted == len(reports)
    finally:
        storage.close()
    for name, params in metrics.items():
        out = tmp_path / name
        assert main(["decode", "--db", str(tmp_path / "veil.db"), "--metric", name,
                     "--out", str(out)]) == 0
        with open(out / "results.csv", newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert [row["value"] for row in rows] == list(params.categories)
        assert all(math.isfinite(float(row["proportion"])) for row in rows)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["reports"] == 4 and summary["oracle"] == params.oracle
    capsys.readouterr()
