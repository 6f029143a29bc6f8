"""One entry point for every kind: a counts document in, a :class:`DecodeResult` out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import scipy.sparse as sp

from veil.server.analysis.closed_form import decode_boolean, decode_category, decode_number
from veil.server.analysis.counts import CountsArrays, counts_arrays
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.strings import StringDecoder
from veil.shared.errors import ParameterError


def decode_counts(
    document: Mapping[str, Any] | CountsArrays,
    candidates: Sequence[str] | None = None,
    candidate_map: sp.spmatrix | None = None,
    *,
    correction: str = "bonferroni",
    alpha: float = 0.05,
    confidence: float = 0.95,
    background: bool = True,
    progress: bool | None = None,
    source: str = "counts document",
) -> DecodeResult:
    """Decode a counts document (from the collector, its SQLite file, or google/rappor files).

    String metrics need ``candidates`` (and optionally their ``candidate_map``,
    e.g. from a google/rappor ``map.csv``); the other kinds ignore them.
    ``correction``, ``alpha`` and ``background`` apply to strings only.
    """
    counts = document if isinstance(document, CountsArrays) else counts_arrays(document, source)
    kind = counts.params.kind
    if kind == "string":
        if candidates is None:
            raise ParameterError(
                "candidates",
                f"metric {counts.metric or '(unnamed)'} holds strings: give the candidate strings "
                "to look for (a file with one per line, or a google/rappor map.csv)",
            )
        decoder = StringDecoder(
            counts.params,
            correction=correction,
            alpha=alpha,
            confidence=confidence,
            background=background,
            progress=progress,
        ).fit(counts.reports, counts.ones, candidates, candidate_map, source=counts.source)
        result = decoder.result_
        result.summary.update({"metric": counts.metric, "start": counts.start, "end": counts.end})
        return result
    if kind == "category":
        return decode_category(counts, confidence)
    if kind == "boolean":
        return decode_boolean(counts, confidence)
    return decode_number(counts, confidence)
