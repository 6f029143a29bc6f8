"""The discovery decoder: support counts by transform, unbiased level shares, the prefix
search's false-prefix rate and pair threshold, and ``veil discover`` against a real
``veil serve``.

Randomness is seeded. Tolerances: a level's share estimate lies within 4 of its standard
errors, ``sqrt(DiscoveryParams.share_variance(s, n))`` (the OLH variance
``(s p(1-p) + (1-s) q(1-q)) / (n (p-q)^2)`` at the share ``s`` realized among the ``n``
reports); a rate averaged over runs lies within 4 Poisson standard errors of its bound; a
Monte Carlo count within 4 binomial standard errors of its expectation. The end-to-end
test (``veil discover``) takes its tolerance from the decoder's output instead: 4 of the
``prop_std_error`` that the string decoder states in results.csv.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import scipy.linalg
import scipy.special

from veil.server.analysis.discovery import (
    PrefixSearch,
    level_shares,
    pair_threshold,
    payload_rows,
    reports_by_level,
    support_counts,
)
from veil.server.analysis.stats import walsh_hadamard
from veil.shared.errors import ParameterError
from veil.shared.kinds import DiscoveryParams, StringParams
from veil.shared.registry import Metric, Registry
from veil.shared.wire import make_batch, make_report
from veil.simulations.discovery import encode_discovery, parity, payload_hex, value_vectors
from veil.simulations.encoders import SIMULATORS

SMALL = DiscoveryParams(share=0.5, segment=1, max_length=6, fingerprint_bits=10)


def test_the_transform_is_the_hadamard_matrix_product() -> None:
    values = np.random.default_rng(1).integers(-9, 9, size=64).astype(np.float32)
    assert np.array_equal(walsh_hadamard(values), scipy.linalg.hadamard(64) @ values)
    # float64 (the Hadamard oracle's counts) stays exact past float32's 2**24
    large = values.astype(np.float64) * 1e9
    assert np.array_equal(walsh_hadamard(large, np.float64), scipy.linalg.hadamard(64) @ large)
    with pytest.raises(ParameterError):
        walsh_hadamard(np.zeros(48, np.float32))


def test_support_counts_equal_counting_report_by_report() -> None:
    rng = np.random.default_rng(2)
    bits, t, n = 10, 3, 300
    rows = rng.integers(0, 1 << bits, size=(t, n), dtype=np.int64)
    buckets = rng.integers(0, 1 << t, size=n)
    every = np.arange(1 << bits, dtype=np.int64)
    hashed = np.zeros((n, 1 << bits), dtype=np.int64)
    for i in range(t):
        hashed |= parity(rows[i][:, None] & every[None, :]) << i
    brute = (hashed == buckets[:, None]).sum(axis=0)
    assert np.array_equal(support_counts(rows, buckets, bits), brute)


def test_payload_rows_read_back_the_wire_payloads() -> None:
    rng = np.random.default_rng(3)
    rows, buckets = encode_discovery(SMALL, rng.integers(0, 1 << SMALL.domain_bits, 50), rng)
    payloads = np.array([list(bytes.fromhex(p)) for p in payload_hex(SMALL, rows, buckets)],
                        dtype=np.uint8)
    back_rows, back_buckets = payload_rows(SMALL, payloads)
    assert np.array_equal(back_rows, rows) and np.array_equal(back_buckets, buckets)
    for payload in payload_hex(SMALL, rows, buckets):
        SMALL.parse_payload(payload)


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_level_shares_are_unbiased_within_their_standard_errors(epsilon: float) -> None:
    params = DiscoveryParams(segment=1, max_length=6, fingerprint_bits=6, epsilon=epsilon)
    rng = np.random.default_rng(4)
    n = 60_000
    truth = {0x0141: 0.5, 0x0262: 0.2, 0x3fff: 0.05}  # (fingerprint, segment) vectors
    vectors = rng.choice([*truth, 0x0001], size=n, p=[*truth.values(), 0.25])
    rows, buckets = encode_discovery(params, vectors, rng)
    shares = level_shares(params, rows, buckets).ravel()
    for vector in [*truth, 0x0001, 0x1234]:
        # unbiased for the share s realized among the n drawn vectors, with the OLH variance
        # at that fixed s; the population share would leave out the draw's s (1 - s) / n
        share = float(np.mean(vectors == vector))
        error = params.share_variance(share, n) ** 0.5
        assert abs(shares[vector] - share) <= 4 * error, (hex(vector), shares[vector], share)


def test_the_pair_threshold_grows_with_the_extensions_tested() -> None:
    few, many = pair_threshold(3.0, 256, 10, 0.5), pair_threshold(3.0, 256, 1000, 0.5)
    assert 3.0 < few < many


@pytest.mark.parametrize(("tested", "draws"), [(10, 200_000), (1000, 1_000_000)])
def test_the_pair_threshold_passes_the_stated_rate_by_monte_carlo(tested: int, draws: int,
                                                                  ) -> None:
    # At z = pair_threshold(low, width, tested, rate), tested * P(a + M > z | a > low) = rate,
    # with a ~ N(0, 1) truncated to a > low and M the largest of width N(0, 1) draws. Drawn
    # here: a by inversion, a = isf(u * P(Z > low)) for u ~ U(0, 1), and M as the maximum of
    # width standard normals. The count passing among `draws` is binomial(draws, P) with
    # P = rate / tested: it lies within 4 binomial standard errors sqrt(draws P (1 - P)) of
    # draws P (the integral's own error, a 4,001-point trapezoid, is far below that).
    low, width, rate = 3.0, 64, 0.5
    z = pair_threshold(low, width, tested, rate)
    rng = np.random.default_rng(12)
    passed = 0
    for start in range(0, draws, 50_000):
        size = min(50_000, draws - start)
        a = -scipy.special.ndtri(rng.random(size) * scipy.special.ndtr(-low))
        assert a.min() > low
        biggest = rng.standard_normal((size, width)).max(axis=1)
        passed += int(np.count_nonzero(a + biggest > z))
    chance = rate / tested
    expected, spread = draws * chance, (draws * chance * (1 - chance)) ** 0.5
    # that is: the expected number of the tested extensions passing is the stated rate
    assert abs(passed - expected) <= 4 * spread, (tested, z, passed, expected, spread)


def levels_for(params: DiscoveryParams, population: dict[str, float], n: int, seed: int,
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each level's ``(rows, buckets)`` for ``n`` installations, uniform over levels."""
    rng = np.random.default_rng(seed)
    values = list(population)
    per_level = rng.multinomial(n, np.full(params.levels, 1 / params.levels))
    out = []
    for level, size in enumerate(per_level):
        held = rng.multinomial(int(size), list(population.values()))
        vectors = np.repeat(value_vectors(params, values, level), held)
        out.append(encode_discovery(params, vectors, rng))
    return out


def test_the_search_finds_the_frequent_strings_and_keeps_few_false_prefixes() -> None:
    """Over 12 seeded runs the prefixes kept that no value has stay within the stated
    ``false_prefixes`` per level (4 Poisson standard errors over all levels and runs), and
    every string of share >= 5% is found each time."""
    population = {"home": 0.4, "hose": 0.2, "mail.x": 0.15, "map": 0.1,
                  **{f"r{i:03d}": 0.15 / 300 for i in range(300)}}
    true_prefixes = {SMALL.padded(v.encode())[:cut] for v in population
                     for cut in range(1, SMALL.levels + 1)}
    false, level_count = 0, 0
    for seed in range(12):
        search = PrefixSearch(SMALL, false_prefixes=1.0).fit(
            levels_for(SMALL, population, 150_000, seed))
        assert {"home", "hose", "mail.x", "map"} <= set(search.strings_)
        for level in search.levels_:
            kept = [p for p, _ in level.kept + level.ended]
            false += sum(p not in true_prefixes for p in kept)
            level_count += 1
    bound = 1.0 * level_count
    assert false <= bound + 4 * bound**0.5, (false, level_count)


def test_search_arguments_are_checked() -> None:
    with pytest.raises(ParameterError) as info:
        PrefixSearch(SMALL, false_prefixes=0).fit([])
    assert info.value.field == "false_prefixes"
    with pytest.raises(ParameterError) as info:
        PrefixSearch(SMALL, max_prefixes=0).fit([])
    assert info.value.field == "max_prefixes"
    # more false prefixes a level than a level keeps made the per-extension rate no
    # probability (its threshold NaN: nothing found, silently)
    for absurd in (101, 1e300, math.inf, math.nan, True):
        with pytest.raises(ParameterError, match="at most the 100 prefixes a level keeps"):
            PrefixSearch(SMALL, false_prefixes=absurd).fit([])
    PrefixSearch(SMALL, false_prefixes=100).fit([])
    # a level may keep more prefixes than the first level examines extensions (256 here)
    with pytest.raises(ParameterError, match=r"below 512 \(twice the extensions the first level"):
        PrefixSearch(SMALL, max_prefixes=1000, false_prefixes=600).fit([])


def test_reports_by_level_groups_chunks_by_cohort() -> None:
    rng = np.random.default_rng(5)
    simulated = SIMULATORS["discovery"](SMALL, ["ab"] * 200 + ["c"] * 100, rng)
    payloads = np.array([list(bytes.fromhex(p)) for p in simulated.payloads], dtype=np.uint8)
    cohorts = np.asarray(simulated.cohorts)
    levels = reports_by_level(SMALL, [(cohorts[:120], payloads[:120]),
                                      (cohorts[120:], payloads[120:])])
    assert [len(b) for _, b in levels] == np.bincount(cohorts, minlength=SMALL.levels).tolist()

    def reports(rows: np.ndarray, buckets: np.ndarray) -> list[tuple[int, ...]]:
        """The level's reports as (row_0, ..., row_t-1, bucket), sorted: order within a
        level is not part of the contract."""
        return sorted(zip(*rows.tolist(), buckets.tolist(), strict=True))

    for level, (rows, buckets) in enumerate(levels):
        assert rows.shape == (SMALL.bucket_bits, len(buckets))
        assert reports(rows, buckets) == reports(*payload_rows(SMALL, payloads[cohorts == level]))


# --- veil discover against a real collector ----------------------------------------------

REGISTRY = Registry([
    Metric("home", StringParams(k=32, h=1, m=4, p=0.0, q=1.0, f=0.2), min_reports=10),
    Metric("home.discovery", DiscoveryParams(share=0.6, segment=1, max_length=8,
                                             fingerprint_bits=6), min_reports=10, of="home"),
])
POPULATION = {"news.org": 0.45, "mail.io": 0.3, "maps": 0.15,
              **{f"tail{i:03d}": 0.1 / 200 for i in range(200)}}


def wire_reports(metric: str, values: list[str], seed: int) -> list[dict]:
    params = REGISTRY[metric].params
    simulated = SIMULATORS[params.mechanism_name](params, values, np.random.default_rng(seed))
    return [make_report(f"{seed:08x}{i:024x}", metric, int(cohort), payload, params.fingerprint)
            for i, (cohort, payload) in enumerate(zip(simulated.cohorts, simulated.payloads,
                                                      strict=True))]


def test_veil_discover_finds_the_strings_a_real_collector_stored(collector_factory,
                                                                 tmp_path: Path) -> None:
    collector = collector_factory(REGISTRY)
    rng = np.random.default_rng(6)
    values = list(rng.choice(list(POPULATION), size=60_000, p=list(POPULATION.values())))
    split = int(0.6 * len(values))
    reports = (wire_reports("home.discovery", values[:split], 7)
               + wire_reports("home", values[split:], 8))
    for start in range(0, len(reports), 1000):
        response = requests.post(collector.url + "/v1/reports", timeout=30,
                                 json=make_batch(f"{start:032x}", reports[start:start + 1000]))
        assert response.status_code == 200, response.text
    out = tmp_path / "found"
    done = subprocess.run([sys.executable, "-m", "veil.server.cli", "discover", "--db",
                           collector.db, "--metric", "home", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with open(out / "results.csv", newline="", encoding="utf-8") as handle:
        rows = {row["string"]: row for row in csv.DictReader(handle)}
    assert {"news.org", "mail.io", "maps"} <= set(rows)
    on_strings = values[split:]
    for value in ("news.org", "mail.io", "maps"):
        row = rows[value]
        share, error = float(row["proportion"]), float(row["prop_std_error"])
        # the decoder estimates the share among the string channel's reports: the drawn one
        held = on_strings.count(value) / len(on_strings)
        assert abs(share - held) <= 4 * error, (value, row, held)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["discovery"]["channel"] == "home.discovery"
    assert summary["discovery"]["reports"] == split
    assert (out / "prefixes.csv").stat().st_size > 0 and (out / "prefixes.png").exists()
    assert "Discovery channel" in done.stdout  # the privacy statement names both channels

    # the collector serves the channel's raw reports to readers, and only those
    raw = f"{collector.url}/v1/metrics/home.discovery/reports"
    bearer = {"Authorization": f"Bearer {collector.token}"}
    assert requests.get(raw, timeout=30).status_code == 401
    refused = requests.get(f"{collector.url}/v1/metrics/home/reports", headers=bearer, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "counts_suffice"
    assert requests.get(f"{collector.url}/v1/metrics/nope/reports", headers=bearer,
                        timeout=30).status_code == 404
    empty = requests.get(raw, headers=bearer, params={"start": "2001-01-01", "end": "2001-01-02"},
                         timeout=30)  # min_reports holds here as for counts
    assert empty.status_code == 409 and empty.json()["error"]["code"] == "too_few_reports"
    served = requests.get(raw, headers=bearer, timeout=30)
    width = 2 + REGISTRY["home.discovery"].params.payload_size
    assert served.headers["X-Veil-Record-Bytes"] == str(width)
    assert len(served.content) == split * width
    sent = {bytes.fromhex(r["payload"]) for r in reports if r["metric"] == "home.discovery"}
    got = {served.content[i + 2:i + width] for i in range(0, len(served.content), width)}
    assert got == sent

    # and veil discover --server finds exactly what --db found
    remote = tmp_path / "remote"
    done = subprocess.run([sys.executable, "-m", "veil.server.cli", "discover", "--server",
                           collector.url, "--token", collector.token, "--metric", "home",
                           "--out", str(remote)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (remote / "results.csv").read_text() == (out / "results.csv").read_text()
    assert (remote / "prefixes.csv").read_text() == (out / "prefixes.csv").read_text()


def test_veil_discover_explains_a_metric_without_a_channel(tmp_path: Path) -> None:
    from veil.server.storage import open_storage

    db = tmp_path / "plain.db"
    open_storage(str(db), Registry([Metric("home", StringParams())]), create=True).close()
    done = subprocess.run([sys.executable, "-m", "veil.server.cli", "discover", "--db", str(db),
                           "--metric", "home", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no discovery channel" in done.stderr and "Traceback" not in done.stderr


def test_veil_discover_names_the_option_and_the_metric_to_give(tmp_path: Path) -> None:
    """``--false-prefixes 0`` is named as the option, and a channel given as ``--metric`` is
    answered with the string metric it serves (it suggested a channel of the channel)."""
    from veil.server.storage import open_storage

    db = tmp_path / "veil.db"
    open_storage(str(db), REGISTRY, create=True).close()

    def discover(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "veil.server.cli", "discover", "--db",
                               str(db), "--out", str(tmp_path / "out"), "--force", *options],
                              capture_output=True, text=True, timeout=120)

    done = discover("--metric", "home", "--false-prefixes", "0")
    assert done.returncode == 2 and "false_prefixes (--false-prefixes) must be" in done.stderr
    done = discover("--metric", "home.discovery")
    assert done.returncode == 2, done.stderr
    assert "is the discovery channel of 'home': name the string metric it serves " \
           "(--metric home)" in done.stderr


def test_discover_with_no_frequent_string_states_everything_as_missing(tmp_path: Path) -> None:
    """Every report a different value (8 random letters): the search keeps no string, and the string decoder
    fits the background alone (no placeholder candidate): no rows, no candidates, and the
    string channel's reports all outside the table (the missing share within 4 of its
    stated standard errors of 1)."""
    from veil.server.analysis.api import discover
    from veil.server.storage import open_storage
    from veil.shared.wire import validate_batch

    letters = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    values = ["".join(word) for word in np.random.default_rng(10).choice(letters, (3000, 8))]
    reports = wire_reports("home.discovery", values[:1800], 11) + wire_reports(
        "home", values[1800:], 12)
    with open_storage(str(tmp_path / "veil.db"), REGISTRY, create=True) as storage:
        for start in range(0, len(reports), 1000):
            batch = make_batch(f"{start:032x}", reports[start:start + 1000])
            storage.insert(validate_batch(batch, REGISTRY).reports)
    found = discover("home", db=tmp_path / "veil.db")
    summary = found.result.summary
    assert found.result.rows == [] and not found.search.strings_
    assert summary["candidates"] == summary["discovery"]["candidates"] == summary["detected"] == 0
    missing, error = summary["missing_proportion_unbiased"], summary["missing_proportion_std_error"]
    assert abs(missing - 1.0) <= 4 * error, (missing, error)
