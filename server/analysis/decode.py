"""One entry point for every kind: a counts document in, a :class:`DecodeResult` out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import scipy.sparse as sp

from veil.server.analysis.closed_form import decode_boolean, decode_category, decode_number
from veil.server.analysis.counts import CountsArrays, counts_arrays
from veil.server.analysis.decoders import DEFAULT_OPTIONS, DecodeOptions, Decoder
from veil.server.analysis.discovery import decode_discovery
from veil.server.analysis.oracles import decode_grr, decode_hadamard, decode_olh, decode_oue
from veil.server.analysis.results import DecodeResult
from veil.server.analysis.strings import decode_strings
from veil.shared.errors import ParameterError

#: the decoder of each mechanism, keyed by its parameter class's mechanism_name
DECODERS: dict[str, Decoder] = {
    decoder.params_type.mechanism_name: decoder
    for decoder in (decode_strings, decode_category, decode_grr, decode_oue, decode_olh,
                    decode_hadamard, decode_boolean, decode_number, decode_discovery)
}


def decode_counts(
    document: Mapping[str, Any] | CountsArrays,
    candidates: Sequence[str] | None = None,
    candidate_map: sp.spmatrix | None = None,
    *,
    correction: str = DEFAULT_OPTIONS.correction,
    alpha: float = DEFAULT_OPTIONS.alpha,
    confidence: float = DEFAULT_OPTIONS.confidence,
    background: bool = DEFAULT_OPTIONS.background,
    progress: bool | None = None,
    source: str = "counts document",
) -> DecodeResult:
    """Decode a counts document (from the collector, its SQLite file, or google/rappor files).

    String metrics need ``candidates`` (and optionally their ``candidate_map``,
    e.g. from a google/rappor ``map.csv``); the other kinds ignore them.
    ``correction``, ``alpha`` and ``background`` apply to strings only.
    """
    counts = document if isinstance(document, CountsArrays) else counts_arrays(document, source)
    decoder = DECODERS.get(counts.params.mechanism_name)
    if decoder is None:
        raise ParameterError("params.kind", f"no decoder for {counts.params.mechanism_name!r}")
    options = DecodeOptions(candidates, candidate_map, correction, alpha, confidence, background,
                            progress)
    return decoder(counts, options)
