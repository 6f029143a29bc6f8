"""``veil populate``: simulated installations upload reports to a running collector.

A collector releases counts only once a metric holds ``min_reports`` reports,
so a new deployment has nothing to decode. ``veil populate`` fills it with a
known truth: it reads the registry the collector serves, draws one value per
installation and metric from the population of ``veil demo`` (its sites with
Zipf 1.5 popularity for strings, categories shared the same way, its 35%
yes-share for booleans), a skewed number within the metric's bounds, or for a
joint metric tuples whose variables are associated,
randomizes every value with the metric's own mechanism (the vectorized
simulation encoders, same law as the SDK) and uploads the reports over HTTP
in batches, exactly as clients would. It also writes the candidate strings to
decode against, decoys included, and prints the truth to compare the decoded
estimates with.

Use it on a collector you are trying out, never on one that holds real data:
its reports would mix with the real ones.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests

from veil.client import RegistryUnavailableError, RequestsTransport
from veil.shared.errors import ParameterError, VeilError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    DiscoveryParams,
    MechanismParams,
    NumberParams,
    OracleParams,
    StringParams,
)
from veil.shared.kinds.joint import JointParams
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report
from veil.simulations.demo import DECOYS, SITES, draw_settings, popularity
from veil.simulations.encoders import SIMULATORS
from veil.simulations.report import progress

#: reports per uploaded batch (well under the collector's default limit)
BATCH_REPORTS = 2_000
#: seconds to wait for each batch's answer
TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True)
class Populated:
    """What :func:`populate` uploaded: reports accepted per metric and the true values drawn."""

    accepted: dict[str, int]
    truth: dict[str, str]


def _shares(labels: list[str], rng: np.random.Generator, n: int) -> tuple[list[str], str]:
    """``n`` draws from ``labels`` by :func:`popularity`, and the five largest shares in words."""
    draws = rng.choice(len(labels), n, p=popularity(len(labels)))
    counts = np.bincount(draws, minlength=len(labels))
    top = ", ".join(f"{labels[i]} {counts[i] / n:.1%}" for i in np.argsort(-counts)[:5])
    return [labels[i] for i in draws], top


#: a kind's simulated population: ``(params, rng, n) -> (values, truth in words)``
Population = Callable[[Any, np.random.Generator, int], tuple[list[Any], str]]
#: the simulated population of each kind of metric, keyed by kind (a kind's mechanisms, a
#: category metric's oracles, share its values)
POPULATIONS: FaceRegistry[Population] = FaceRegistry("simulated population")


def population_of(*kinds: str) -> Callable[[Population], Population]:
    """Make a function the simulated population of metrics of ``kinds`` (in :data:`POPULATIONS`)."""

    def register(function: Population) -> Population:
        for kind in kinds:
            POPULATIONS.add(kind, function)
        return function

    return register


def draw_population(params: MechanismParams, rng: np.random.Generator,
                    n: int) -> tuple[list[Any], str]:
    """One true value per installation for a metric with ``params``, and its truth in words,
    from its kind's population (:data:`POPULATIONS`)."""
    return POPULATIONS.lookup(params.kind, "metric")(params, rng, n)


@population_of(StringParams.kind, DiscoveryParams.kind)
def _draw_sites(params: StringParams | DiscoveryParams, rng: np.random.Generator,
                n: int) -> tuple[list[Any], str]:
    return _shares(list(SITES), rng, n)


@population_of(CategoryParams.kind)
def _draw_categories(params: CategoryParams | OracleParams, rng: np.random.Generator,
                     n: int) -> tuple[list[Any], str]:
    return _shares(list(params.categories), rng, n)


@population_of(BooleanParams.kind)
def _draw_flags(params: BooleanParams, rng: np.random.Generator,
                n: int) -> tuple[list[Any], str]:
    flags = draw_settings(rng, n)
    return [bool(v) for v in flags], f"{flags.mean():.1%} true"


@population_of(NumberParams.kind)
def _draw_numbers(params: NumberParams, rng: np.random.Generator,
                  n: int) -> tuple[list[Any], str]:
    span = params.high - params.low
    numbers = np.clip(params.low + rng.gamma(2.0, span / 8.0, n), params.low, params.high)
    return [float(v) for v in numbers], f"mean {numbers.mean():.4g}"


@population_of(JointParams.kind)
def _draw_tuples(params: JointParams, rng: np.random.Generator,
                 n: int) -> tuple[list[Any], str]:
    """The first variable by :func:`popularity`; each other one by popularity too, its
    ranking turned by the first variable's value (so the variables are associated); a
    bucketed number as its bucket's middle."""
    first = rng.choice(params.shape[0], n, p=popularity(params.shape[0]))
    indices = [first]
    for size in params.shape[1:]:
        indices.append((rng.choice(size, n, p=popularity(size)) + first) % size)
    values: list[Any] = []
    for row in zip(*indices, strict=True):
        value: dict[str, Any] = {}
        for variable, index in zip(params.variables, row, strict=True):
            if variable.form == "boolean":
                value[variable.name] = bool(index)
            elif variable.form == "number":
                value[variable.name] = (variable.edges[index] + variable.edges[index + 1]) / 2
            else:
                value[variable.name] = variable.labels[index]
        values.append(value)
    # counted, not binned: the product domain of a wide marginals metric has no array size
    cells = Counter(params.cell_of(value) for value in values)
    top = ", ".join(f"{params.cell_label(cell)} {count / n:.1%}"
                    for cell, count in cells.most_common(3))
    return values, f"{top} (associated by construction)"


def fetch_registry(server: str, timeout: float = TIMEOUT) -> Registry:
    """The registry ``server`` serves at ``/v1/metrics``, fetched as the client fetches it."""
    transport = RequestsTransport()
    try:
        return transport.fetch_registry(server, token=None, timeout=timeout)
    except RegistryUnavailableError as exc:
        raise VeilError(f"{exc}; is the collector running at {server}?") from None
    finally:
        transport.close()


def _upload(session: requests.Session, server: str, token: str | None,
            reports: list[dict[str, Any]]) -> int:
    """POST one batch; the number of reports the collector accepted."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    batch = make_batch(os.urandom(16).hex(), reports)
    response = session.post(f"{server}/v1/reports", json=batch, headers=headers, timeout=TIMEOUT)
    if response.status_code >= 300:
        try:
            error = response.json().get("error", {})
            detail = error.get("message", response.text) if isinstance(error, dict) else error
        except ValueError:
            detail = response.text[:200]
        hint = " (give --upload-token or set VEIL_UPLOAD_TOKEN)" if response.status_code == 401 else ""
        raise VeilError(f"POST {server}/v1/reports answered HTTP {response.status_code}: "
                        f"{detail}{hint}")
    return int(response.json().get("accepted", len(reports)))


def populate(server: str, installations: int, *, token: str | None = None,
             metrics: list[str] | None = None, seed: int | None = None,
             candidates_out: Path | None = None,
             say: Callable[[str], None] = print) -> Populated:
    """Upload one simulated report per installation and metric to ``server``.

    ``metrics`` limits the metrics (default: all the registry's);
    ``candidates_out`` receives the string candidates (the sites and decoys,
    one per line). ``seed`` draws the population; None (the default) draws a fresh one,
    said with its seed, so that a second run adds a new sample of installations instead
    of the same one again. Returns the reports accepted per metric and the truth.
    """
    if isinstance(installations, bool) or not isinstance(installations, int) or installations < 1:
        raise ParameterError("installations",
                             f"--installations must be an integer >= 1; got {installations!r}")
    server = server.rstrip("/")
    registry = fetch_registry(server)
    names = list(registry) if metrics is None else metrics
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ParameterError("metric", f"the collector serves no metric {unknown[0]!r}; "
                             f"it serves {', '.join(registry)}")
    if candidates_out is not None:
        # written before any upload, so a path that cannot be written fails the run before
        # it has sent anything
        candidates_out.parent.mkdir(parents=True, exist_ok=True)
        candidates_out.write_text("".join(f"{s}\n" for s in (*SITES, *DECOYS)), encoding="utf-8")
        say(f"candidates: {candidates_out} ({len(SITES)} sites that will be reported and "
            f"{len(DECOYS)} that will not)")
    if seed is None:
        seed = secrets.randbelow(2**32)
        say(f"population seed {seed} (--seed {seed} draws the same installations again)")
    rng = np.random.default_rng(seed)
    accepted: dict[str, int] = {}
    truth: dict[str, str] = {}
    with requests.Session() as session:
        for name in names:
            metric = registry[name]
            values, truth[name] = draw_population(metric.params, rng, installations)
            simulated = SIMULATORS[metric.params.mechanism_name](metric.params, values, rng)
            fingerprint = metric.params.fingerprint
            cohorts = simulated.cohorts.tolist() if metric.params.has_cohorts else None
            batches = range(0, installations, BATCH_REPORTS)
            accepted[name] = 0
            for start in progress(batches, f"upload {name}", len(batches)):
                stop = min(start + BATCH_REPORTS, installations)
                reports = [
                    make_report(os.urandom(16).hex(), name,
                                None if cohorts is None else cohorts[i],
                                simulated.payloads[i], fingerprint)
                    for i in range(start, stop)
                ]
                accepted[name] += _upload(session, server, token, reports)
            say(f"{name}: {accepted[name]:,} reports accepted; truth: {truth[name]}")
    return Populated(accepted, truth)
