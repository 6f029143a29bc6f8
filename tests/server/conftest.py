"""Helpers for collector tests: build wire reports with the real encoders, predict counts."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from veil.client.encoders import make_encoder
from veil.shared.bits import hex_to_bits
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report


class Wire:
    """Builds batches of genuinely encoded reports and the counts they must produce."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def reports(self, metric: str, values: Iterable[Any], *, cohort_seed: int | None = None,
                ) -> list[dict[str, Any]]:
        """One wire report per value, each from a fresh installation secret (and cohort)."""
        out = []
        for index, value in enumerate(values):
            seed = index if cohort_seed is None else cohort_seed
            encoder = make_encoder(self.registry[metric], os.urandom(32), seed)
            out.append(make_report(os.urandom(16).hex(), metric, encoder.cohort,
                                   encoder.encode(value)))
        return out

    @staticmethod
    def batch(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """A batch with a fresh random batch id."""
        return make_batch(os.urandom(16).hex(), reports)

    def expected(self, metric: str, reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``reports`` and ``cohorts`` of the counts document, computed from payloads."""
        params = self.registry[metric].params
        chosen = [r for r in reports if r["metric"] == metric]
        if params.kind in ("string", "category"):
            cohorts = [{"cohort": c, "reports": 0, "ones": [0] * params.k}
                       for c in range(params.cohorts)]
            for report in chosen:
                entry = cohorts[report.get("cohort", 0)]
                entry["reports"] += 1
                bits = hex_to_bits(report["payload"], params.k)
                for i in range(params.k):
                    entry["ones"][i] += (bits >> i) & 1
        elif params.kind == "boolean" or params.mechanism == "1bitmean":
            cohorts = [{"cohort": 0, "reports": len(chosen),
                        "ones": sum(r["payload"] for r in chosen)}]
        else:
            values = [float(r["payload"]) for r in chosen]
            cohorts = [{"cohort": 0, "reports": len(chosen), "sum": math.fsum(values),
                        "sum_squares": math.fsum(v * v for v in values)}]
        return {"reports": len(chosen), "cohorts": cohorts}


@pytest.fixture
def wire(test_registry: Registry) -> Wire:
    """Report builder for the test registry."""
    return Wire(test_registry)
