"""Decoding collected data in one call, for notebooks and scripts.

>>> result = decode_metric(db="veil.db", metric="dark_mode")            # doctest: +SKIP
>>> result.to_pandas()                                           # doctest: +SKIP
>>> result.plot()                                                # doctest: +SKIP
>>> decode_metric_by_day(db="veil.db", metric="dark_mode").plot()       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from veil.server.analysis.candidate_map import read_candidates
from veil.server.analysis.daily import DailyResult, decode_days
from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.sources import CountsSource

Candidates = Sequence[str] | str | Path | None


def _candidates(candidates: Candidates) -> Sequence[str] | None:
    """A list of candidate strings as given, or read from a file (one per line)."""
    if isinstance(candidates, str | Path):
        return read_candidates(candidates)
    return candidates


def decode_metric(
    *,
    metric: str,
    db: str | Path | None = None,
    server: str | None = None,
    token: str | None = None,
    candidates: Candidates = None,
    start: str | None = None,
    end: str | None = None,
    force: bool = False,
    **options: Any,
) -> DecodeResult:
    """Decode ``metric`` over the UTC days ``start``..``end`` (inclusive; open when None)
    from a collector's database file (``db``) or its HTTP API (``server``, with a read
    ``token``, by default ``$VEIL_READ_TOKEN``).

    ``candidates`` (string metrics) is a list of strings or a file with one per line.
    ``force`` (``db`` only) decodes below the metric's ``min_reports``. ``options`` go to
    :func:`~veil.server.analysis.decoders.decode_counts` (``correction``, ``alpha``,
    ``confidence``, ``background``). The summary's ``start`` and ``end`` are the first
    and last day that hold reports.
    """
    with CountsSource(metric, db, server, token, start, end, force) as source:
        document = source.counts()
    return decode_counts(document, _candidates(candidates), source=source.name, **options)


def decode_metric_by_day(
    *,
    metric: str,
    db: str | Path | None = None,
    server: str | None = None,
    token: str | None = None,
    candidates: Candidates = None,
    start: str | None = None,
    end: str | None = None,
    force: bool = False,
    **options: Any,
) -> DailyResult:
    """Decode ``metric`` separately for each UTC day of ``start``..``end`` that holds
    reports; arguments as :func:`decode_metric`. Days with fewer reports than the metric's
    ``min_reports`` (unless ``force``) or than an estimate needs are skipped and listed
    in the result's ``skipped``."""
    with CountsSource(metric, db, server, token, start, end, force) as source:
        documents, skipped = source.daily()
    return decode_days(documents, _candidates(candidates), skipped, **options)
