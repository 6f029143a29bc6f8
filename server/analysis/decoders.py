"""The decoder face: what a decoder is, the registry of decoders, and the one entry point.

A decoder takes validated counts (:class:`~veil.server.counts.CountsArrays`)
and :class:`DecodeOptions` and returns a :class:`~veil.server.analysis.results.DecodeResult`.
:func:`decodes` marks a function as the decoder of a parameter class and adds it to
:data:`DECODERS`, keyed by the class's ``mechanism_name``; :func:`decode_counts` looks
the decoder of a counts document up there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from veil.server.analysis.results import DecodeResult
from veil.server.analysis.stats import check_correction, check_level
from veil.server.counts import CountsArrays, counts_arrays
from veil.shared.errors import ParameterError
from veil.shared.faces import FaceRegistry
from veil.shared.kinds import MechanismParams
from veil.shared.kinds.base import implements

if TYPE_CHECKING:
    import scipy.sparse as sp


#: the estimators a frequency decoder offers: ``unbiased`` (the default: the inverted
#: channel, unbiased, shares may leave [0, 1]) and ``ibu`` (iterative Bayesian update:
#: non-negative shares summing to the mass the list explains, bootstrap intervals, or for
#: FLH and HCMS strings the observed information's; :mod:`veil.server.analysis.ibu`)
ESTIMATORS = ("unbiased", "ibu")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """What a decode may be asked; each decoder reads the options that apply to its kind.

    ``candidates`` and ``candidate_map`` (a google/rappor map as a sparse matrix), and
    ``correction``, ``alpha``, ``background``, ``progress`` apply to strings;
    ``confidence`` to every kind; ``estimator`` (one of :data:`ESTIMATORS`) to the
    frequency decoders, which refuse an estimator they lack (booleans and numbers have the
    unbiased one only); ``all_candidates`` to string metrics: the table lists
    every candidate, ranked, not only the detected ones.
    """

    candidates: Sequence[str] | None = None
    candidate_map: Any = None
    correction: str = "storey"
    alpha: float = 0.05
    confidence: float = 0.95
    background: bool = True
    progress: bool | None = None
    estimator: str = "unbiased"
    all_candidates: bool = False

    def __post_init__(self) -> None:
        # checked for every kind, whether or not its decoder reads them: an alpha of -1
        # must not pass for a boolean and fail for a string
        check_level(self.alpha, "alpha")
        check_level(self.confidence, "confidence")
        check_correction(self.correction)
        check_estimator(self.estimator)


def check_estimator(estimator: str) -> str:
    """``estimator`` if it is one of :data:`ESTIMATORS`, else a :class:`ParameterError`
    naming the field."""
    if estimator not in ESTIMATORS:
        raise ParameterError(
            "estimator", f"The 'estimator' parameter must be one of {', '.join(ESTIMATORS)}. "
                         f"Got {estimator!r} instead.")
    return estimator


class Decoder(Protocol):
    """A decoding function marked with the parameter class it decodes."""

    params_type: type[MechanismParams]

    def __call__(self, counts: CountsArrays, options: DecodeOptions = ...) -> DecodeResult: ...


#: the decoder of each mechanism, keyed by its parameter class's ``mechanism_name``; the
#: modules of the built-in decoders are imported on its first read, so that importing the
#: analysis package stays cheap
DECODERS: FaceRegistry[Decoder] = FaceRegistry("decoder", built_in=(
    "veil.server.analysis.strings",
    "veil.server.analysis.string_oracles",
    "veil.server.analysis.closed_form",
    "veil.server.analysis.oracles",
    "veil.server.analysis.discovery",
    "veil.server.analysis.joint",
))


def decodes(
    params_type: type[MechanismParams],
) -> Callable[[Callable[[CountsArrays, DecodeOptions], DecodeResult]], Decoder]:
    """Make a function ``(counts, options) -> DecodeResult`` the decoder of ``params_type``
    (in :data:`DECODERS`).

    :func:`~veil.shared.kinds.base.implements` sets the function's ``params_type`` and
    registers it; the cast tells the type checker the function is now a :class:`Decoder`.
    """
    mark = implements(params_type, DECODERS)

    def decoder(function: Callable[[CountsArrays, DecodeOptions], DecodeResult]) -> Decoder:
        return cast(Decoder, mark(function))

    return decoder


#: the options of a decode that asks for nothing in particular
DEFAULT_OPTIONS = DecodeOptions()


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
    estimator: str = DEFAULT_OPTIONS.estimator,
    all_candidates: bool = DEFAULT_OPTIONS.all_candidates,
    source: str = "counts document",
) -> DecodeResult:
    """Decode a counts document (from the collector, its SQLite file, or google/rappor files).

    String metrics need ``candidates`` (and optionally their ``candidate_map``,
    e.g. from a google/rappor ``map.csv``); the other kinds ignore them.
    ``correction``, ``alpha`` and ``all_candidates`` apply to strings only,
    ``background`` to Bloom-filter strings only (the FLH and HCMS decoders always estimate
    the unlisted share); ``estimator`` (:data:`ESTIMATORS`) to categories and strings.
    """
    counts = document if isinstance(document, CountsArrays) else counts_arrays(document, source)
    decoder = DECODERS.lookup(counts.params.mechanism_name, "params.kind")
    options = DecodeOptions(candidates=candidates, candidate_map=candidate_map,
                            correction=correction, alpha=alpha, confidence=confidence,
                            background=background, progress=progress, estimator=estimator,
                            all_candidates=all_candidates)
    return decoder(counts, options)
