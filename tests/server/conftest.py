"""Helpers for collector tests: build wire reports with the real encoders, predict counts."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from veil.client.encoders import make_encoder
from veil.shared.registry import Registry
from veil.shared.statistics import statistic_for
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
        """The ``reports`` and ``cohorts`` of the counts document, folded report by report
        with the statistic's one-report reference (:meth:`Statistic.of_report`)."""
        params = self.registry[metric].params
        statistic = statistic_for(params)
        states = [statistic.zero(params) for _ in range(params.cohorts)]
        sizes = [0] * params.cohorts
        for report in reports:
            if report["metric"] != metric:
                continue
            cohort = report.get("cohort", 0)
            value = params.parse_payload(report["payload"])
            stored = statistic.stored_payload(params, report["payload"], value)
            states[cohort] = statistic.merge(states[cohort], statistic.of_report(params, stored))
            sizes[cohort] += 1
        cohorts = [{"cohort": c, "reports": sizes[c], **statistic.to_entry(states[c])}
                   for c in range(params.cohorts)]
        return {"reports": sum(sizes), "cohorts": cohorts}


@pytest.fixture
def wire(test_registry: Registry) -> Wire:
    """Report builder for the test registry."""
    return Wire(test_registry)
