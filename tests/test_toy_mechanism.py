"""A mechanism defined entirely in this file passes every common check, with no edit to Veil.

The toy kind ``coin`` reports a yes/no value through a memoized coin: the true answer
with probability ``keep``, otherwise a fair coin's. It brings every face of its own: its
parameters (a :class:`MechanismParams` subclass), its statistic (the count of yes
answers, in the aggregate column booleans use), its SDK encoder, its decoder and its
simulation encoder. Defining them registers them (a subclass hook or a decorator, where
each face is defined), so everything that looks a face up by ``mechanism_name`` finds
them: the registry's parser, wire validation, counts documents, :func:`decode_counts`
and the checks of ``tests/test_common_checks.py``, each run here on the toy.

The toy lives only inside :func:`~veil.shared.faces.registrations_undone`: the other
tests, which compare the registries with the built-in mechanisms, never see it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest

from tests.test_common_checks import COMMON_CHECKS
from veil.client.encoders import ENCODERS, Encoder
from veil.server.analysis.decoders import DECODERS, DEFAULT_OPTIONS, DecodeOptions, decodes
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import z_quantile
from veil.server.analysis.tables import RESULT_COLUMNS, frequency_rows
from veil.server.counts import CountsArrays
from veil.shared.bits import PROB_ONE, realize, realized
from veil.shared.errors import ParameterError
from veil.shared.faces import registrations_undone
from veil.shared.kinds import KINDS, MECHANISMS, MechanismParams
from veil.shared.kinds.boolean import parse_bit
from veil.shared.privacy import binary_rr_epsilon
from veil.shared.registry import Registry
from veil.shared.statistics import STATISTICS, Field, State, Statistic
from veil.shared.statistics.base import PayloadType
from veil.shared.validation import Interval, check_fields
from veil.simulations.encoders import SIMULATORS, SimulatedReports, simulates

#: the toy's population (value -> share) and the shares its decoder must recover
SHARES = {True: 0.3, False: 0.7}
TRUTH = {"true": 0.3, "false": 0.7}


def define_coin() -> type[MechanismParams]:
    """Define the toy mechanism's five faces (registering them) and return its parameter class."""

    @dataclasses.dataclass(frozen=True)
    class CoinParams(MechanismParams):
        """The true answer with probability ``keep``, else a fair coin's; memoized per value."""

        kind: ClassVar[str] = "coin"

        keep: float = 0.5

        def __post_init__(self) -> None:
            check_fields(type(self).__name__, dataclasses.asdict(self),
                         {"keep": Interval(float, 0, 1, "neither")})

        @property
        def yes_probs(self) -> tuple[float, float]:
            """``(P(yes | no), P(yes | yes))`` with the realized ``keep``."""
            keep = realized(self.keep)
            return (1 - keep) / 2, keep + (1 - keep) / 2

        @property
        def statistic(self) -> str:
            return "coin_yes"

        @property
        def epsilon_1(self) -> float:
            yes_if_no, yes_if_yes = self.yes_probs
            return binary_rr_epsilon(yes_if_yes, yes_if_no)

        @property
        def epsilon_inf(self) -> float:
            return self.epsilon_1

        def parse_payload(self, payload: Any, field: str = "payload") -> int:
            return parse_bit(payload, field)

    class CoinYes(Statistic):
        """How many answers were yes; a report is stored as the integer 0 or 1."""

        name: ClassVar[str] = "coin_yes"
        fields = (Field("yes", "count", "ones"),)
        payload_type: ClassVar[PayloadType] = "int"

        def stored_payload(self, params: MechanismParams, payload: Any, value: Any) -> int:
            return int(value)

        def of_report(self, params: MechanismParams, stored: Any) -> State:
            return {"yes": int(stored)}

        def accumulate(self, params: MechanismParams, cohorts: np.ndarray,
                       stored: Sequence[Any]) -> list[tuple[int, int, State]]:
            return [(0, len(stored), {"yes": int(sum(stored))})] if len(stored) else []

    class CoinEncoder(Encoder[CoinParams]):
        """``u1 < keep``: the truth; else ``u2 < 1/2``: yes (the stream's first two words)."""

        params_type = CoinParams

        def memo_key(self, value: Any) -> bytes:
            if not isinstance(value, bool):
                raise ParameterError("value", f"must be True or False; got {value!r}")
            return b"\x01" if value else b"\x00"

        def derive(self, key: bytes) -> int:
            stream = self.permanent_stream(b"coin", key)
            kept = stream.u32() < realize(self.params.keep)
            heads = stream.u32() < PROB_ONE // 2
            return key[0] if kept else int(heads)

    @decodes(CoinParams)
    def decode_coin(counts: CountsArrays, options: DecodeOptions = DEFAULT_OPTIONS,
                    ) -> DecodeResult:
        """Warner's estimator: share ``(mean - P(yes | no)) / (P(yes | yes) - P(yes | no))``,
        variance ``mean (1 - mean) / (N spread^2)``."""
        params = counts.params
        assert isinstance(params, CoinParams)
        total = counts.total_reports
        yes_if_no, yes_if_yes = params.yes_probs
        spread = yes_if_yes - yes_if_no
        mean = float(counts.fields["yes"][0]) / total
        share = (mean - yes_if_no) / spread
        se = math.sqrt(mean * (1 - mean) / total) / spread
        rows = frequency_rows(counts.metric, "coin", ["true", "false"],
                              np.array([share, 1 - share]), np.array([se, se]), total,
                              z_quantile(options.confidence))
        return DecodeResult("coin", RESULT_COLUMNS, rows, {"kind": "coin", "reports": total},
                            f"true share {share:.4g}", chart="share")

    @simulates(CoinParams)
    def simulate_coin(params: CoinParams, values: Sequence[bool], rng: np.random.Generator,
                      clients: np.ndarray | None = None) -> SimulatedReports:
        """The encoder's law with numpy's draws, one installation per report."""
        n = len(values)
        kept = rng.integers(0, PROB_ONE, size=n) < realize(params.keep)
        heads = rng.integers(0, PROB_ONE, size=n) < PROB_ONE // 2
        answers = np.where(kept, np.asarray(values, dtype=bool), heads).astype(np.int64)
        return SimulatedReports(np.zeros(n, np.int64), answers.tolist())

    return CoinParams


@pytest.fixture
def coin() -> Iterator[MechanismParams]:
    """The toy's parameters, its faces registered for the test only."""
    with registrations_undone():
        yield define_coin()(keep=0.6)


@pytest.mark.parametrize("check", COMMON_CHECKS, ids=[check.__name__ for check in COMMON_CHECKS])
def test_a_mechanism_defined_in_a_test_passes_every_common_check(coin, check) -> None:
    check(coin, SHARES, TRUTH)


def test_the_toy_reads_from_a_registry_file_like_any_kind(coin) -> None:
    registry = Registry.from_toml('version = 1\n\n[metrics.flip]\nkind = "coin"\nkeep = 0.6\n')
    assert registry["flip"].params == coin


def test_leaving_the_block_unregisters_every_face() -> None:
    registries = (MECHANISMS, KINDS, STATISTICS, ENCODERS, DECODERS, SIMULATORS)
    before = [dict(registry) for registry in registries]
    assert not any("coin" in registry or "coin_yes" in registry for registry in registries)
    with registrations_undone():
        define_coin()
        assert all("coin" in registry or "coin_yes" in registry for registry in registries)
    assert [dict(registry) for registry in registries] == before
    with pytest.raises(ParameterError, match="kind must be one of"):
        Registry.from_toml('version = 1\n\n[metrics.flip]\nkind = "coin"\n')
