"""The decoder face of a kind: one decoding function per parameter class.

A decoder takes validated counts (:class:`~veil.server.analysis.counts.CountsArrays`)
and :class:`DecodeOptions` and returns a :class:`~veil.server.analysis.results.DecodeResult`.
:func:`decodes` (:func:`veil.shared.kinds.base.implements`) marks a function as the
decoder of a parameter class;
:data:`veil.server.analysis.decode.DECODERS` collects them by kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from veil.server.analysis.counts import CountsArrays
from veil.server.analysis.results import DecodeResult
from veil.shared.kinds import MechanismParams
from veil.shared.kinds.base import implements


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """What a decode may be asked; each decoder reads the options that apply to its kind.

    ``candidates`` and ``candidate_map`` (a google/rappor map as a sparse matrix), and
    ``correction``, ``alpha``, ``background``, ``progress`` apply to strings;
    ``confidence`` to every kind.
    """

    candidates: Sequence[str] | None = None
    candidate_map: Any = None
    correction: str = "storey"
    alpha: float = 0.05
    confidence: float = 0.95
    background: bool = True
    progress: bool | None = None


class Decoder(Protocol):
    """A decoding function marked with the parameter class it decodes."""

    params_type: type[MechanismParams]

    def __call__(self, counts: CountsArrays, options: DecodeOptions = ...) -> DecodeResult: ...


def decodes(
    params_type: type[MechanismParams],
) -> Callable[[Callable[[CountsArrays, DecodeOptions], DecodeResult]], Decoder]:
    """Mark a function ``(counts, options) -> DecodeResult`` as the decoder of ``params_type``.

    :func:`~veil.shared.kinds.base.implements` sets the function's ``params_type`` at run
    time; the cast tells the type checker the function is now a :class:`Decoder`.
    """
    mark = implements(params_type)

    def decoder(function: Callable[[CountsArrays, DecodeOptions], DecodeResult]) -> Decoder:
        return cast(Decoder, mark(function))

    return decoder


#: the options of a decode that asks for nothing in particular
DEFAULT_OPTIONS = DecodeOptions()
