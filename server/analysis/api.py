"""The analysis' entry points: decode or discover collected data in one call, for
notebooks, scripts and ``veil decode``/``veil discover``.

:func:`decode_metric` decodes a metric over a range of days, :func:`decode_metric_by_day`
each day on its own, and :func:`discover` finds a string metric's frequent strings from
its discovery channel. Each reads its counts through a
:class:`~veil.server.analysis.sources.CountsSource` and decodes them with
:func:`~veil.server.analysis.decoders.decode_counts`.

>>> result = decode_metric(db="veil.db", metric="dark_mode")            # doctest: +SKIP
>>> result.to_pandas()                                           # doctest: +SKIP
>>> result.plot()                                                # doctest: +SKIP
>>> decode_metric_by_day(db="veil.db", metric="dark_mode").plot()       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, overload

from veil.server.analysis.candidate_map import read_candidates
from veil.server.analysis.daily import DailyResult, decode_days
from veil.server.analysis.decoders import decode_counts
from veil.server.analysis.discovery import (
    DEFAULT_FALSE_PREFIXES,
    DiscoveryResult,
    PrefixSearch,
    reports_by_level,
)
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.sources import CountsSource
from veil.shared.errors import ParameterError
from veil.shared.kinds.discovery import DiscoveryParams

Candidates = Sequence[str] | str | Path | None


def _candidates(candidates: Candidates) -> Sequence[str] | None:
    """A list of candidate strings as given, or read from a file (one per line)."""
    if isinstance(candidates, str | Path):
        return read_candidates(candidates)
    return candidates


@overload
def decode_metric(*, metric: str, db: str | Path | None = ..., server: str | None = ...,
                  token: str | None = ..., candidates: Candidates = ..., start: str | None = ...,
                  end: str | None = ..., force: bool = ..., by: None = ...,
                  **options: Any) -> DecodeResult: ...
@overload
def decode_metric(*, metric: str, db: str | Path | None = ..., server: str | None = ...,
                  token: str | None = ..., candidates: Candidates = ..., start: str | None = ...,
                  end: str | None = ..., force: bool = ..., by: Literal["day"],
                  **options: Any) -> DailyResult: ...
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
    by: str | None = None,
    **options: Any,
) -> DecodeResult | DailyResult:
    """Decode ``metric`` over the UTC days ``start``..``end`` (inclusive; open when None)
    from a collector's database file (``db``) or its HTTP API (``server``, with a read
    ``token``, by default ``$VEIL_READ_TOKEN``).

    ``candidates`` (string metrics) is a list of strings or a file with one per line.
    ``force`` (``db`` only) decodes below the metric's ``min_reports``. ``options`` go to
    :func:`~veil.server.analysis.decoders.decode_counts` (``correction``, ``alpha``,
    ``confidence``, ``background``). The summary's ``start`` and ``end`` are the first
    and last day that hold reports. ``by="day"`` decodes each day on its own, as
    :func:`decode_metric_by_day` (``veil decode --by day``).
    """
    if by is not None:
        if by != "day":
            raise ParameterError("by", f"by must be 'day' or None; got {by!r}")
        return decode_metric_by_day(metric=metric, db=db, server=server, token=token,
                                    candidates=candidates, start=start, end=end, force=force,
                                    **options)
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


def discover(metric: str, *, db: str | Path | None = None, server: str | None = None,
             token: str | None = None, start: str | None = None, end: str | None = None,
             false_prefixes: float = DEFAULT_FALSE_PREFIXES, correction: str = "bh",
             alpha: float = 0.05, force: bool = False, progress: Any = None) -> DiscoveryResult:
    """Discover the frequent strings of string metric ``metric`` over days ``start``..``end``:
    the prefix search over its discovery channel's raw reports, then the string decoder
    over the string channel's counts with the strings found as candidates (``correction``,
    default Benjamini-Hochberg, at ``alpha``).

    The reports come from a collector's store (``db``, a path or URL; ``force`` reads below
    the metrics' ``min_reports``) or from a running collector (``server``, with a read
    ``token``, by default ``$VEIL_READ_TOKEN``: it serves the raw reports at
    ``GET /v1/metrics/<name>/reports``), as for :func:`decode_metric`. When the search
    finds no string, the result has no rows and states the string channel's reports as
    not in the table.
    """
    with CountsSource(metric, db, server, token, start, end, force) as source:
        channel = source.registry.channel(metric)
        owner = getattr(source.registry.get(metric), "of", None)
        if channel is None and owner:
            raise ParameterError(
                "metric", f"metric {metric!r} is the discovery channel of {owner!r}: name the "
                          f"string metric it serves (--metric {owner})")
        if channel is None:
            raise ParameterError(
                "metric", f"metric {metric!r} has no discovery channel: add a "
                          f"[metrics.{metric}.discovery] table to the registry "
                          "(docs/discovery.md)")
        params = channel.params
        assert isinstance(params, DiscoveryParams)
        search = PrefixSearch(params, false_prefixes=false_prefixes, progress=progress).fit(
            reports_by_level(params, source.reports(channel.name, params.payload_size)))
        document = source.counts()
    candidates = sorted(search.strings_)
    result = decode_counts(document, candidates, correction=correction, alpha=alpha,
                           source=source.name)
    result.summary["discovery"] = {
        "channel": channel.name,
        "reports": sum(level.reports for level in search.levels_),
        "levels": params.levels,
        "levels_searched": len(search.levels_),
        "candidates": len(candidates),
        "false_prefixes_per_level": false_prefixes,
        "epsilon_inf": params.epsilon_inf,
        "seconds": round(search.seconds_, 3),
    }
    cost = max(params.epsilon_inf, result.summary["privacy"].get("epsilon_per_value") or 0.0)
    result.summary["privacy"]["statement"] += (
        f" (string channel). Discovery channel: epsilon_inf = {params.epsilon_inf:.4g} per "
        f"prefix for the installations on it; each installation reports through one channel "
        f"only, so the metric costs at most {cost:.4g} per value.")
    return DiscoveryResult(result, search)
