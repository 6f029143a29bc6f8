"""Every kind through every face, in the manner of scikit-learn's ``check_estimator``.

For each mechanism in :data:`veil.shared.kinds.MECHANISMS` (every kind, and every
oracle of a category metric) and each example parameter set (:data:`EXAMPLES`), each
check of :data:`COMMON_CHECKS` runs as a test of its own: the mechanism has every face,
the parameters validate and round-trip, the SDK encoder's output passes wire
validation, the statistic's fast accumulation equals the report-by-report fold
and merges, counts documents round-trip, the decoder recovers a known
population, and the simulation encoder's reports have the SDK encoder's mean
statistic in every cohort (the whole law of one report where the statistic counts
each payload value, GRR, OLH and Hadamard, or the payload is one bit, booleans and
1bitmean; each bit's law for bit vectors; the first two moments for laplace and
gaussian numbers; for discovery, whose bucket counts are uniform whatever is hashed,
also whether each report's bucket is ``A x`` of its own value). A kind that lacks a
face (encoder, statistic, decoder, simulation encoder) or an example here fails this
file. The checks are functions ``check(params, shares, truth)`` that look every face up
in its registry, so they run as well on a mechanism defined elsewhere
(``tests/test_toy_mechanism.py`` defines one in the test itself).

Randomness is seeded. Tolerances: the decoder's estimate lies within 4 of its
stated standard errors of the truth (for discovery, of the share realized among the
reports of the level where the string ended); SDK and simulated reports agree, field
by field, within 5 standard errors of a difference of two means, each standard error
estimated from its own sample (``sqrt(var_sdk / n + var_sim / n)``; 5 because
every bit of every example is checked); a share of reports of stated probability
``p`` lies within 4 binomial standard errors ``sqrt(p (1 - p) / n)`` of it.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from veil.client.encoders import ENCODERS, make_encoder
from veil.server.analysis.decoders import DECODERS, decode_counts
from veil.server.analysis.discovery import PrefixSearch, payload_rows, reports_by_level
from veil.server.counts import counts_arrays
from veil.server.storage.base import payload_array
from veil.shared.errors import ParameterError
from veil.shared.kinds import (
    KINDS,
    MECHANISMS,
    BooleanParams,
    CategoryParams,
    DiscoveryParams,
    FlhParams,
    GrrParams,
    HadamardParams,
    HcmsParams,
    JointParams,
    MechanismParams,
    NumberParams,
    OlhParams,
    OueParams,
    StringParams,
)
from veil.shared.kinds.number import NUMBER_MECHANISMS
from veil.shared.registry import Metric, Registry
from veil.shared.statistics import STATISTICS, Statistic, statistic_for
from veil.shared.wire import make_batch, make_report, validate_batch
from veil.simulations.encoders import SIMULATORS

#: (parameters, population: value -> share, truth: result row label -> expected value)
EXAMPLES: list[tuple[MechanismParams, dict[Any, float], dict[str, float]]] = [
    (StringParams(k=32, h=2, m=8), {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2},
     {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2}),
    (StringParams(k=32, h=2, m=8, hashing="md5-google"),
     {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2},
     {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2}),
    *[(cls(epsilon=3.0, report_epsilon=2.0, **shape),
       {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2},
       {"a.example": 0.5, "b.example": 0.3, "c.example": 0.2})
      for cls, shape in ((FlhParams, {"functions": 8}), (HcmsParams, {"rows": 8, "columns": 16}))],
    (CategoryParams(categories=("x", "y", "z")), {"x": 0.6, "y": 0.3, "z": 0.1},
     {"x": 0.6, "y": 0.3, "z": 0.1}),
    *[(cls(categories=("x", "y", "z", "w"), epsilon=3.0), {"x": 0.5, "y": 0.3, "z": 0.2},
       {"x": 0.5, "y": 0.3, "z": 0.2, "w": 0.0})
      for cls in (GrrParams, OueParams, OlhParams, HadamardParams)],
    (BooleanParams(alpha=0.6, beta=0.4), {True: 0.3, False: 0.7}, {"true": 0.3, "false": 0.7}),
    (NumberParams(low=0.0, high=10.0, mechanism="laplace", epsilon=2.0),
     {2.5: 0.5, 7.5: 0.5}, {"mean": 5.0}),
    (NumberParams(low=0.0, high=10.0, mechanism="gaussian", epsilon=2.0, delta=1e-6),
     {2.5: 0.25, 7.5: 0.75}, {"mean": 6.25}),
    (NumberParams(low=0.0, high=10.0, mechanism="1bitmean", epsilon=2.0),
     {2.5: 0.5, 10.0: 0.5}, {"mean": 6.25}),
    (DiscoveryParams(share=0.5, segment=1, max_length=4, fingerprint_bits=6),
     {"ab": 0.5, "cd": 0.3, "xyz": 0.2}, {"ab": 0.5, "cd": 0.3, "xyz": 0.2}),
    *[(JointParams(of=("b", "c"), domains=(("x", "y", "z"), "boolean"), epsilon=3.0,
                   encoding=encoding),
       {("x", True): 0.3, ("y", False): 0.5, ("z", True): 0.2},
       {"b=x, c=true": 0.3, "b=y, c=false": 0.5, "b=z, c=true": 0.2, "b=x, c=false": 0.0})
      for encoding in ("grr", "olh")],
]
IDS = [
    "-".join(part for part in (params.mechanism_name.replace("/", "-"),
                               getattr(params, "mechanism", ""), getattr(params, "hashing", ""),
                               getattr(params, "encoding", ""))
             if part)
    for params, _, _ in EXAMPLES
]
SDK_REPORTS = 3000
POPULATION = 200_000


def population(shares: dict[Any, float], n: int, seed: int) -> list[Any]:
    """``n`` values with exactly ``round(share * n)`` of each, shuffled."""
    values = [value for value, share in shares.items() for _ in range(round(share * n))]
    random.Random(seed).shuffle(values)
    return values


def metric_name(params: MechanismParams) -> str:
    """The example's metric name: a channel (a discovery channel) is named after the metric
    it belongs to, ``m``."""
    return f"m.{params.kind}" if params.channel_of else "m"


def registry_for(params: MechanismParams) -> Registry:
    """A registry holding the example's metric (and, for a channel, the metric it belongs to,
    with its kind's default parameters)."""
    if params.channel_of:
        return Registry([Metric("m", KINDS[params.channel_of]()),
                         Metric(metric_name(params), params, of="m")])
    return Registry([Metric("m", params)])


def sdk_reports(params: MechanismParams, values: list[Any], seed: int) -> list[dict[str, Any]]:
    """One wire report per value, each from its own installation (seeded secret and noise)."""
    metric = registry_for(params)[metric_name(params)]
    rnd = random.Random(seed)
    out = []
    for index, value in enumerate(values):
        encoder = make_encoder(metric, rnd.randbytes(32), index, random_bytes=rnd.randbytes)
        out.append(make_report(f"{index:032x}", metric.name, encoder.cohort, encoder.encode(value),
                               params.fingerprint))
    return out


def stored_payloads(params: MechanismParams, payloads: list[Any]) -> list[Any]:
    """What the collector stores for each wire payload."""
    statistic = statistic_for(params)
    return [statistic.stored_payload(params, p, params.parse_payload(p)) for p in payloads]


def document(params: MechanismParams, sizes: Any, states: list[Any]) -> dict[str, Any]:
    """The counts document of ``sizes[c]`` reports with statistic ``states[c]`` per cohort."""
    statistic = statistic_for(params)
    return {"metric": "m", "kind": params.kind, "params": params.to_dict(),
            "reports": int(sum(sizes)),
            "cohorts": [{"cohort": c, "reports": int(sizes[c]), **statistic.to_entry(states[c])}
                        for c in range(params.cohorts)]}


def per_report_fields(params: MechanismParams, cohorts: list[int], payloads: list[Any],
                      ) -> dict[str, np.ndarray]:
    """Each field of the statistic of each report, as ``(reports, ...)`` arrays.

    Counts vectors are laid out per cohort (zeros elsewhere), so comparing means
    compares the per-cohort laws too.
    """
    statistic = statistic_for(params)
    out: dict[str, list[Any]] = {field.name: [] for field in statistic.fields}
    for cohort, stored in zip(cohorts, stored_payloads(params, payloads), strict=True):
        state = statistic.of_report(params, stored)
        for field in statistic.fields:
            value = np.asarray(state[field.name], dtype=float)
            if field.type == "counts":
                spread = np.zeros((params.cohorts, value.size))
                spread[cohort] = value
                value = spread.ravel()
            out[field.name].append(value)
    return {name: np.array(values) for name, values in out.items()}


def test_every_mechanism_has_every_face_and_an_example() -> None:
    mechanisms = set(MECHANISMS)
    assert set(ENCODERS) == mechanisms, "an encoder each (veil.client.encoders.ENCODERS)"
    assert set(DECODERS) == mechanisms, "a decoder each (veil.server.analysis.decoders.DECODERS)"
    assert set(SIMULATORS) == mechanisms, "a simulation encoder each (veil.simulations.encoders)"
    assert {params.mechanism_name for params, _, _ in EXAMPLES} == mechanisms, "an example each here"
    numbers = {params.mechanism for params, _, _ in EXAMPLES if isinstance(params, NumberParams)}
    assert numbers == set(NUMBER_MECHANISMS), "an example of each number mechanism here"
    for params, shares, truth in EXAMPLES:
        check_every_face_is_registered(params, shares, truth)


def check_every_face_is_registered(params: MechanismParams, shares: dict[Any, float],
                                   truth: dict[str, float]) -> None:
    """The mechanism of ``params`` is registered with every face, under its name."""
    name = params.mechanism_name
    assert MECHANISMS.get(name) is type(params), f"{name}: not in veil.shared.kinds.MECHANISMS"
    assert name in ENCODERS, f"{name}: no encoder (veil.client.encoders.ENCODERS)"
    assert name in DECODERS, f"{name}: no decoder (veil.server.analysis.decoders.DECODERS)"
    assert name in SIMULATORS, f"{name}: no simulation encoder (veil.simulations.encoders)"
    assert params.statistic in STATISTICS, f"{name}: no statistic {params.statistic!r}"


def check_parameters_round_trip_and_state_their_privacy(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    assert type(params).from_dict(params.to_dict()) == params
    registry = Registry.from_dict(registry_for(params).to_dict())
    assert registry[metric_name(params)].params == params
    assert 0 < params.epsilon_1 <= params.epsilon_inf < float("inf")
    assert params.privacy_map(2) >= 2 * params.epsilon_inf


def check_encoder_output_passes_wire_validation(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    reports = sdk_reports(params, population(shares, 50, 1), 2)
    result = validate_batch(make_batch("f" * 32, reports), registry_for(params))
    assert result.errors == [] and len(result.reports) == len(reports)


def check_statistic_accumulates_merges_and_round_trips(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    statistic = statistic_for(params)
    reports = sdk_reports(params, population(shares, 400, 3), 4)
    cohorts = np.array([r.get("cohort", 0) for r in reports])
    stored = stored_payloads(params, [r["payload"] for r in reports])
    folded = [statistic.zero(params) for _ in range(params.cohorts)]
    sizes = [0] * params.cohorts
    for cohort, item in zip(cohorts, stored, strict=True):
        folded[cohort] = statistic.merge(folded[cohort], statistic.of_report(params, item))
        sizes[cohort] += 1

    def accumulated(rows: slice) -> list[Any]:
        states = [statistic.zero(params) for _ in range(params.cohorts)]
        for cohort, n, state in statistic.accumulate(params, cohorts[rows], stored[rows]):
            assert n == np.count_nonzero(cohorts[rows] == cohort)
            states[cohort] = state
        return states

    halves = [statistic.merge(a, b)
              for a, b in zip(accumulated(slice(0, 150)), accumulated(slice(150, None)),
                              strict=True)]
    for whole, merged, fold in zip(accumulated(slice(None)), halves, folded, strict=True):
        assert statistic.to_entry(whole) == statistic.to_entry(fold)
        assert statistic.to_entry(merged) == statistic.to_entry(fold)
    arrays = counts_arrays(document(params, sizes, folded))
    for field in statistic.fields:
        expected = [statistic.to_entry(state)[field.name] for state in folded]
        assert arrays.fields[field.name].tolist() == expected


def check_array_accumulation_equals_accumulate(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    """``accumulate_arrays`` (what an archive's buckets use), the statistic's own and the
    generic default, and ``accumulate_counters`` (what SQLite folds with), which every
    statistic of one counts vector offers, give exactly ``accumulate``'s result on random
    reports."""
    statistic = statistic_for(params)
    values = population(shares, 5000, 10)
    simulated = SIMULATORS[params.mechanism_name](params, values, np.random.default_rng(11))
    stored = stored_payloads(params, simulated.payloads)
    cohorts = np.asarray(simulated.cohorts)
    arrays = payload_array(statistic.payload_type, stored)

    def entries(results: list[Any]) -> list[Any]:
        return [(cohort, n, statistic.to_entry(state)) for cohort, n, state in results]

    want = entries(statistic.accumulate(params, cohorts, stored))
    assert entries(statistic.accumulate_arrays(params, cohorts, arrays)) == want
    assert entries(Statistic.accumulate_arrays(statistic, params, cohorts, arrays)) == want
    assert statistic.accumulate_arrays(params, cohorts[:0], arrays[:0]) == []
    counters = statistic.accumulate_counters(params, cohorts, arrays)
    one_vector = [field.type for field in statistic.fields] == ["counts"]
    assert (counters is not None) == one_vector
    if counters is not None:
        assert entries(counters.states(statistic.fields[0].name)) == want
        assert (counters.cohorts.dtype, counters.reports.dtype, counters.counters.dtype) \
            == (np.int64, np.int64, np.uint64)


def check_simulation_encoder_has_the_sdk_law(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    values = population(shares, SDK_REPORTS, 5)
    sdk = sdk_reports(params, values, 6)
    simulated = SIMULATORS[params.mechanism_name](params, values, np.random.default_rng(7))
    sdk_fields = per_report_fields(params, [r.get("cohort", 0) for r in sdk],
                                   [r["payload"] for r in sdk])
    sim_fields = per_report_fields(params, simulated.cohorts.tolist(), simulated.payloads)
    for name, a in sdk_fields.items():
        b = sim_fields[name]
        se = np.sqrt(a.var(axis=0) / len(a) + b.var(axis=0) / len(b))
        gap = np.abs(a.mean(axis=0) - b.mean(axis=0))
        # where both samples are constant (a bit never set) the means must agree exactly
        assert np.all(gap <= 5 * se + 1e-12), f"{name}: max gap {gap.max()} (se {se.max()})"
    further = FURTHER_LAW_CHECKS.get(params.mechanism_name)
    if further is not None:
        further(params, values, sdk, simulated)


def own_bucket(params: DiscoveryParams, values: list[str], cohorts: Any, payloads: list[str],
               ) -> np.ndarray:
    """Per discovery report, 1.0 where its bucket is ``A x`` (``A``: the ``t`` rows of the
    payload; ``x``: the vector of its value at its level, the cohort; bit ``i`` of ``A x`` the
    parity of ``popcount(row_i & x)``), else 0.0. Read from the hex payloads, independently
    of the encoders and of the decoder's ``payload_rows``."""
    t, width = params.bucket_bits or 0, params.row_bytes
    out = np.empty(len(payloads))
    for i, (value, level, payload) in enumerate(zip(values, cohorts, payloads, strict=True)):
        data = bytes.fromhex(payload)
        x = params.vector(params.padded(value.encode()), int(level))
        rows = [int.from_bytes(data[r * width:(r + 1) * width], "big") for r in range(t)]
        hashed = sum(((row & x).bit_count() & 1) << r for r, row in enumerate(rows))
        out[i] = float(data[-1] == hashed)
    return out


def check_discovery_law(params: DiscoveryParams, values: list[str], sdk: list[dict[str, Any]],
                        simulated: Any) -> None:
    """The law of a discovery report that carries its value: whether its bucket is ``A x``.

    The bucket counts per level compared above cannot tell a simulator that hashes a wrong
    vector from the SDK: ``A`` is uniform, so ``A x`` is uniform over the ``2**t`` buckets
    for every ``x != 0``, whichever ``x`` it is. Whether a report's bucket equals ``A x`` of its
    own value at its level is a Bernoulli(``p``) draw, ``p = support_probs[0]`` (the
    randomized responses keep ``A x``, or name it again, with probability ``p`` in all),
    while a report of another vector matches with probability ``1/g`` only.
    """
    p = params.support_probs[0]
    a = own_bucket(params, values, [r["cohort"] for r in sdk], [r["payload"] for r in sdk])
    b = own_bucket(params, values, simulated.cohorts.tolist(), simulated.payloads)
    # SDK and simulator agree within 5 standard errors of a difference of two means,
    # sqrt(var_sdk / n + var_sim / n), as every field above
    se = np.sqrt(a.var() / len(a) + b.var() / len(b))
    assert abs(a.mean() - b.mean()) <= 5 * se, ("A x kept: sdk", a.mean(), "sim", b.mean(), se)
    # and each matches the stated p within 4 binomial standard errors sqrt(p (1 - p) / n)
    for source, share in (("sdk", a), ("simulation", b)):
        error = np.sqrt(p * (1 - p) / len(share))
        assert abs(share.mean() - p) <= 4 * error, (source, share.mean(), p, error)


def check_discovery(params: DiscoveryParams, cohorts: np.ndarray, stored: list[bytes],
                    truth: dict[str, float], values: list[str]) -> None:
    """The prefix search finds every true string, with its share within 4 standard errors
    of the share it holds among the reports of the level where it ended (``values[i]`` is
    the value of report ``i``, ``cohorts[i]`` its level), and nothing else; counts alone
    are refused with a message naming ``veil discover``."""
    payloads = payload_array("bytes", stored)
    levels = reports_by_level(params, [(np.asarray(cohorts), payloads)])
    # at most 1e-4 prefixes kept per level by noise: over the example's 4 levels a false
    # candidate is a 0.04% event, as rare as the file's 4-sd checks
    search = PrefixSearch(params, false_prefixes=1e-4).fit(levels)
    assert set(search.strings_) == set(truth)
    ended = {value: level for level in search.levels_ for prefix, _ in level.ended
             for value in [prefix.split(b"\0")[0].decode()]}
    held = np.asarray(values, dtype=object)
    for value in truth:
        level = ended[value]
        at_level = np.asarray(cohorts) == level.level
        assert level.reports == np.count_nonzero(at_level)
        # The estimate is unbiased for the share s the value holds among the level's n
        # reports (reports of other vectors support it with probability exactly q = 1/g),
        # with variance (s p (1 - p) + (1 - s) q (1 - q)) / (n (p - q)^2), the OLH variance
        # at a fixed s (DiscoveryParams.share_variance). Compared with the population share
        # instead, the sampling of the values would add s (1 - s) / n. (The search also
        # subtracts the mean over the ~60 unused fingerprints, adding about 1/60 of the
        # zero-share variance: left out.)
        share = float(np.mean(held[at_level] == value))
        error = params.share_variance(share, level.reports) ** 0.5
        assert abs(search.strings_[value] - share) <= 4 * error, (value, search.strings_[value],
                                                                   share)
    assert payload_rows(params, payloads)[0].shape == (params.bucket_bits, len(stored))
    statistic = statistic_for(params)
    states = [statistic.zero(params) for _ in range(params.cohorts)]
    for cohort, _, state in statistic.accumulate(params, np.asarray(cohorts), stored):
        states[cohort] = state
    with pytest.raises(ParameterError, match="veil discover"):
        decode_counts(document(params, np.bincount(cohorts, minlength=params.cohorts), states))


def check_decoder_recovers_a_known_population(
        params: MechanismParams, shares: dict[Any, float], truth: dict[str, float]) -> None:
    values = population(shares, POPULATION, 8)
    simulated = SIMULATORS[params.mechanism_name](params, values, np.random.default_rng(9))
    statistic = statistic_for(params)
    stored = stored_payloads(params, simulated.payloads)
    if params.reads_raw_reports:  # its decoder is an analysis of the raw reports
        return RAW_REPORT_CHECKS[params.mechanism_name](params, simulated.cohorts, stored,
                                                        truth, values)
    states = [statistic.zero(params) for _ in range(params.cohorts)]
    sizes = np.bincount(simulated.cohorts, minlength=params.cohorts)
    for cohort, _, state in statistic.accumulate(params, simulated.cohorts, stored):
        states[cohort] = state
    # candidates matter to strings only; the other decoders ignore them
    result = decode_counts(document(params, sizes, states), [*truth, "never.example"])
    # a test level is refused for every kind alike, whether its decoder reads it or not
    for option, value in (("alpha", 0.0), ("alpha", math.nan), ("confidence", 1.0)):
        with pytest.raises(ParameterError) as refused:
            decode_counts(document(params, sizes, states), [*truth], **{option: value})
        assert refused.value.field == option
    # one tidy table for every kind: a statistic drawn on its metric's range (a number's
    # mean) is estimated in the metric's unit, the others as shares
    estimate, std_error = (("estimate", "std_error") if result.chart == "range"
                           else ("proportion", "prop_std_error"))
    rows = {row["value"]: row for row in result.rows}
    for name, expected in truth.items():
        row = rows[name]
        assert abs(row[estimate] - expected) <= 4 * row[std_error], (name, row, expected)


#: checks of a mechanism's own law beyond its statistic's, after the common one (by name)
FURTHER_LAW_CHECKS = {DiscoveryParams.mechanism_name: check_discovery_law}
#: the check of the analysis of a mechanism that reads its raw reports (``reads_raw_reports``)
RAW_REPORT_CHECKS = {DiscoveryParams.mechanism_name: check_discovery}
#: every check a mechanism must pass, each ``check(params, shares, truth)``
COMMON_CHECKS = (
    check_every_face_is_registered,
    check_parameters_round_trip_and_state_their_privacy,
    check_encoder_output_passes_wire_validation,
    check_statistic_accumulates_merges_and_round_trips,
    check_array_accumulation_equals_accumulate,
    check_simulation_encoder_has_the_sdk_law,
    check_decoder_recovers_a_known_population,
)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_parameters_round_trip_and_state_their_privacy(params, shares, truth) -> None:
    check_parameters_round_trip_and_state_their_privacy(params, shares, truth)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_encoder_output_passes_wire_validation(params, shares, truth) -> None:
    check_encoder_output_passes_wire_validation(params, shares, truth)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_statistic_accumulates_merges_and_round_trips(params, shares, truth) -> None:
    check_statistic_accumulates_merges_and_round_trips(params, shares, truth)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_array_accumulation_equals_accumulate(params, shares, truth) -> None:
    check_array_accumulation_equals_accumulate(params, shares, truth)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_simulation_encoder_has_the_sdk_law(params, shares, truth) -> None:
    check_simulation_encoder_has_the_sdk_law(params, shares, truth)


@pytest.mark.parametrize(("params", "shares", "truth"), EXAMPLES, ids=IDS)
def test_decoder_recovers_a_known_population(params, shares, truth) -> None:
    check_decoder_recovers_a_known_population(params, shares, truth)
