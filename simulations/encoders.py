"""The simulation face of each kind: many installations' reports at once, as wire payloads.

Each mechanism's simulation encoder is marked with :func:`simulates`, which adds it to
:data:`SIMULATORS` under the mechanism's name: a function
``(params, values, rng, clients=None)`` returning :class:`SimulatedReports`
with the same law as the SDK's encoder (numpy's generators instead of the CSPRNG,
which is fine for simulation and only for it).
``values`` are the metric's own values (strings, category names, booleans, numbers);
``clients[r]``, when given, says which installation made report ``r`` (reports of one
installation and value share their memoized response).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np

from veil.shared.faces import FaceRegistry
from veil.shared.kinds import (
    BooleanParams,
    CategoryParams,
    DiscoveryParams,
    GrrParams,
    HadamardParams,
    MechanismParams,
    NumberParams,
    OlhParams,
    OracleParams,
    OueParams,
    StringParams,
    implements,
)
from veil.shared.kinds.joint import JointParams
from veil.simulations.discovery import encode_discovery, payload_hex, value_vectors
from veil.simulations.encoding import (
    bloom_table,
    encode_booleans,
    encode_categories,
    encode_numbers,
    encode_strings,
    payloads,
)
from veil.simulations.oracle_encoding import encode_grr, encode_hadamard, encode_olh, encode_oue


@dataclasses.dataclass(frozen=True)
class SimulatedReports:
    """Each report's cohort and wire payload, in the order of the values given."""

    cohorts: np.ndarray
    payloads: list[Any]


class Simulator(Protocol):
    """A simulation encoder marked with the parameter class it simulates."""

    params_type: type[MechanismParams]

    def __call__(self, params: Any, values: Sequence[Any], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports: ...


#: the simulation encoder of each mechanism, keyed by its parameter class's mechanism_name
SIMULATORS: FaceRegistry[Simulator] = FaceRegistry(
    "simulation encoder", built_in=("veil.simulations.string_oracles",))


def simulates(
    params_type: type[MechanismParams],
) -> Callable[[Callable[..., SimulatedReports]], Simulator]:
    """Make a function the simulation encoder of ``params_type`` (in :data:`SIMULATORS`).

    :func:`~veil.shared.kinds.base.implements` sets the function's ``params_type`` and
    registers it; the cast tells the type checker the function is now a :class:`Simulator`.
    """
    mark = implements(params_type, SIMULATORS)

    def simulator(function: Callable[..., SimulatedReports]) -> Simulator:
        return cast(Simulator, mark(function))

    return simulator


def _client_cohorts(params: MechanismParams, n: int, rng: np.random.Generator,
                    clients: np.ndarray | None) -> np.ndarray:
    """A uniformly random cohort per installation (the SDK derives one from its seed)."""
    if not params.has_cohorts:
        return np.zeros(n, dtype=np.int64)
    if clients is None:
        return rng.integers(0, params.cohorts, n)
    _, index = np.unique(np.asarray(clients), return_inverse=True)
    cohorts: np.ndarray = rng.integers(0, params.cohorts, index.max(initial=-1) + 1)
    return cohorts[index.reshape(-1)]


def _category_indices(params: CategoryParams | OracleParams, values: Sequence[str]) -> np.ndarray:
    """The index of each category name in ``values`` (:class:`ParameterError` for an unknown one)."""
    return np.array([params.index(value) for value in values], dtype=np.int64)


@simulates(StringParams)
def simulate_strings(params: StringParams, values: Sequence[str], rng: np.random.Generator,
                     clients: np.ndarray | None = None) -> SimulatedReports:
    """Bloom-filter RAPPOR reports of string ``values``."""
    distinct, index = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    cohorts = _client_cohorts(params, len(values), rng, clients)
    table = bloom_table(params, [str(v) for v in distinct])
    reports = encode_strings(params, table, index.reshape(-1), cohorts, rng, clients)
    return SimulatedReports(cohorts, reports.payloads())


@simulates(CategoryParams)
def simulate_categories(params: CategoryParams, values: Sequence[str], rng: np.random.Generator,
                        clients: np.ndarray | None = None) -> SimulatedReports:
    """One-hot basic RAPPOR reports of category names ``values``."""
    reports = encode_categories(params, _category_indices(params, values), rng, clients)
    return SimulatedReports(reports.cohorts, reports.payloads())


@simulates(GrrParams)
def simulate_grr(params: GrrParams, values: Sequence[str], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports:
    """Generalized randomized response (memoized) of category names ``values``."""
    out = encode_grr(params, _category_indices(params, values), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), out.tolist())


@simulates(OueParams)
def simulate_oue(params: OueParams, values: Sequence[str], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports:
    """Optimized unary encoding (memoized, L-OSUE) of category names ``values``: hex payloads."""
    words = encode_oue(params, _category_indices(params, values), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), payloads(words, params.d))


@simulates(OlhParams)
def simulate_olh(params: OlhParams, values: Sequence[str], rng: np.random.Generator,
                 clients: np.ndarray | None = None) -> SimulatedReports:
    """Optimized local hashing (memoized) of category names ``values``."""
    out = encode_olh(params, _category_indices(params, values), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), out.tolist())


@simulates(HadamardParams)
def simulate_hadamard(params: HadamardParams, values: Sequence[str], rng: np.random.Generator,
                      clients: np.ndarray | None = None) -> SimulatedReports:
    """Hadamard response (memoized) of category names ``values``."""
    out = encode_hadamard(params, _category_indices(params, values), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), out.tolist())


@simulates(BooleanParams)
def simulate_booleans(params: BooleanParams, values: Sequence[bool], rng: np.random.Generator,
                      clients: np.ndarray | None = None) -> SimulatedReports:
    """Randomized-response answers (0/1) of boolean ``values``."""
    answers = encode_booleans(params, np.asarray(values, dtype=bool), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), answers.tolist())


@simulates(NumberParams)
def simulate_numbers(params: NumberParams, values: Sequence[float], rng: np.random.Generator,
                     clients: np.ndarray | None = None) -> SimulatedReports:
    """Noisy grid values (laplace, gaussian) or 1BitMean bits of numeric ``values``."""
    out = encode_numbers(params, np.asarray(values, dtype=float), rng, clients)
    return SimulatedReports(np.zeros(len(values), np.int64), out.tolist())


@simulates(DiscoveryParams)
def simulate_discovery(params: DiscoveryParams, values: Sequence[str], rng: np.random.Generator,
                       clients: np.ndarray | None = None) -> SimulatedReports:
    """Discovery-channel reports of string ``values``, each installation at a uniformly
    random level (its cohort)."""
    cohorts = _client_cohorts(params, len(values), rng, clients)
    vectors = np.empty(len(values), dtype=np.int64)
    for level in np.unique(cohorts):
        pick = np.flatnonzero(cohorts == level)
        vectors[pick] = value_vectors(params, [values[int(i)] for i in pick], int(level))
    keyed = None if clients is None else np.asarray(clients)
    rows, buckets = encode_discovery(params, vectors, rng, keyed)
    return SimulatedReports(cohorts, payload_hex(params, rows, buckets))


@simulates(JointParams)
def simulate_joint(params: JointParams, values: Sequence[Any], rng: np.random.Generator,
                   clients: np.ndarray | None = None) -> SimulatedReports:
    """Joint reports of tuples ``values`` (mappings or sequences, as the SDK takes them): each
    tuple's cell through the cell oracle's simulation encoder; with ``marginals``, the cell
    of the marginal each installation's uniformly random cohort names."""
    oracle = params.cell_oracle
    simulate = SIMULATORS.lookup(oracle.mechanism_name)
    if not params.has_cohorts:
        return simulate(oracle, [str(params.cell_of(value)) for value in values], rng, clients)
    cohorts = _client_cohorts(params, len(values), rng, clients)
    cells = [str(params.marginal_cell(int(c), value))
             for c, value in zip(cohorts, values, strict=True)]
    return SimulatedReports(cohorts, simulate(oracle, cells, rng, clients).payloads)
