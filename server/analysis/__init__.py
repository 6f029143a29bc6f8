"""Offline analysis: decode frequencies and means with standard errors.

One job per module. Inputs: :mod:`~veil.server.analysis.sources` (a collector, its
database, google/rappor's files; the counts document itself is
:mod:`veil.server.counts`) and :mod:`~veil.server.analysis.candidate_map`. Decoders: one
module per mechanism family (:mod:`~veil.server.analysis.strings`,
:mod:`~veil.server.analysis.closed_form`, :mod:`~veil.server.analysis.oracles`,
:mod:`~veil.server.analysis.string_oracles`, :mod:`~veil.server.analysis.joint` and
:mod:`~veil.server.analysis.joint_marginals`, :mod:`~veil.server.analysis.discovery`;
IBU in :mod:`~veil.server.analysis.ibu` and, for FLH and HCMS,
:mod:`~veil.server.analysis.string_oracle_ibu`; google/rappor's association files in
:mod:`~veil.server.analysis.assoc_em`) on the statistics of
:mod:`~veil.server.analysis.stats` and :mod:`~veil.server.analysis.selection`, found
through :mod:`~veil.server.analysis.decoders`. Outputs: the result
(:mod:`~veil.server.analysis.results`, :mod:`~veil.server.analysis.daily`), its tables
(:mod:`~veil.server.analysis.tables`), charts (:mod:`~veil.server.analysis.charts`) and
files (:mod:`~veil.server.analysis.files`). The entry points are in
:mod:`~veil.server.analysis.api`.

The public names load lazily (:mod:`veil.server.lazy`), so importing this
package (as the ``veil`` command does to list its subcommands) does not pull in NumPy or SciPy.

In a notebook, :func:`decode_metric` reads a collector's database file or its HTTP API and
returns a :class:`DecodeResult` (``.to_pandas()``, ``.plot()``, an HTML table);
:func:`decode_metric_by_day` decodes each day on its own (a :class:`DailyResult`)::

    >>> from veil.server.analysis import decode_metric
    >>> result = decode_metric(db="veil.db", metric="dark_mode")  # doctest: +SKIP
    >>> result.to_pandas()                                       # doctest: +SKIP

>>> from veil.server.analysis import StringDecoder, decode_counts, read_rappor_files, build_map
"""

from __future__ import annotations

from veil.server.lazy import lazy_getattr

_EXPORTS = {
    "decode_metric": "veil.server.analysis.api",
    "decode_metric_by_day": "veil.server.analysis.api",
    "discover": "veil.server.analysis.api",
    "DiscoveryResult": "veil.server.analysis.discovery",
    "DailyResult": "veil.server.analysis.daily",
    "decode_days": "veil.server.analysis.daily",
    "RAPPOR_COLUMNS": "veil.server.analysis.tables",
    "RESULT_COLUMNS": "veil.server.analysis.tables",
    "STRING_COLUMNS": "veil.server.analysis.tables",
    "StringDecoder": "veil.server.analysis.strings",
    "build_map": "veil.server.analysis.candidate_map",
    "read_candidates": "veil.server.analysis.candidate_map",
    "DecodeResult": "veil.server.analysis.results",
    "write_outputs": "veil.server.analysis.files",
    "write_discovery": "veil.server.analysis.files",
    "decode_counts": "veil.server.analysis.decoders",
    "decode_category": "veil.server.analysis.closed_form",
    "decode_boolean": "veil.server.analysis.closed_form",
    "decode_number": "veil.server.analysis.closed_form",
    "decode_grr": "veil.server.analysis.oracles",
    "decode_oue": "veil.server.analysis.oracles",
    "decode_olh": "veil.server.analysis.oracles",
    "decode_hadamard": "veil.server.analysis.oracles",
    "decode_strings": "veil.server.analysis.strings",
    "DecodeOptions": "veil.server.analysis.decoders",
    "DECODERS": "veil.server.analysis.decoders",
    "CountsArrays": "veil.server.counts",
    "counts_arrays": "veil.server.counts",
    "counts_document": "veil.server.counts",
    "RapporFiles": "veil.server.analysis.sources",
    "read_rappor_files": "veil.server.analysis.sources",
    "read_params": "veil.server.counts",
    "read_counts": "veil.server.counts",
    "read_map": "veil.server.analysis.candidate_map",
    "write_params": "veil.server.counts",
    "write_counts": "veil.server.counts",
    "write_map": "veil.server.analysis.candidate_map",
    "simulate_string_counts": "veil.server.analysis.synthetic",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
