"""The encoder interface: one value in, one randomized payload out."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from veil.client.randomness import STREAM_LAYOUT, FreshStream, HmacStream, keyed
from veil.shared.faces import FaceRegistry
from veil.shared.kinds import MechanismParams

P = TypeVar("P", bound=MechanismParams)

#: the encoder class of each mechanism, keyed by its parameter class's ``mechanism_name``
ENCODERS: FaceRegistry[type[Encoder[Any]]] = FaceRegistry("encoder")

#: how many memoized responses an encoder keeps in memory (recomputed on a miss)
MEMO_CACHE_SIZE = 4096


class Encoder(Generic[P]):
    """Turns values of one metric into randomized payloads on the device.

    ``secret`` keys every memoized response (so it is stable across restarts);
    ``cohort_seed`` picks the installation's cohort; ``random_bytes`` is the
    source of fresh noise and must be a CSPRNG in production (the default,
    ``os.urandom``). Tests may inject a seeded source. ``layout`` is the stream layout
    of the memoized responses (:meth:`permanent_stream`): :data:`STREAM_LAYOUT`, or 1 for
    parameters this installation reported under with an SDK of layout 1, whose memoized
    responses it keeps (:meth:`veil.client.accounting.PrivacyLedger.stream_layout`).

    A subclass that sets ``params_type`` is that mechanism's encoder: defining it registers
    it in :data:`ENCODERS`.
    """

    params_type: ClassVar[type[MechanismParams]]
    #: whether stream layout 1 keyed this encoder's memoized responses by the metric name
    #: alone (no fingerprint in the context): strings, RAPPOR categories, booleans, numbers
    name_keyed_in_layout_1: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "params_type" in cls.__dict__:
            ENCODERS.add(cls.params_type.mechanism_name, cls)

    def __init__(
        self,
        params: P,
        metric: str,
        secret: bytes,
        cohort_seed: int = 0,
        random_bytes: Callable[[int], bytes] = os.urandom,
        layout: int = STREAM_LAYOUT,
    ) -> None:
        if layout not in (1, STREAM_LAYOUT):
            raise ValueError(f"layout must be 1 or {STREAM_LAYOUT}; got {layout!r}")
        self.params = params
        self.metric = metric
        self.secret = secret
        self._key = keyed(secret)
        self.layout = layout
        name_keyed = layout == 1 and self.name_keyed_in_layout_1
        self._context_prefix = b"" if name_keyed else params.fingerprint.encode() + b"\0"
        self.cohort: int | None = cohort_seed % params.cohorts if params.has_cohorts else None
        self.fresh = FreshStream(random_bytes)
        self._memo: OrderedDict[Any, Any] = OrderedDict()

    def permanent_stream(self, purpose: bytes, context: bytes) -> HmacStream:
        """The deterministic stream of a memoized response: ``purpose``, the metric and the
        context ``fingerprint || 0x00 || context`` (the parameters' 16 hex digits, ASCII), so
        that parameters declared anew under one metric name draw independent responses.
        Layout 1 of the :attr:`name_keyed_in_layout_1` encoders has ``context`` alone."""
        return HmacStream(self._key, purpose, self.metric, self._context_prefix + context)

    def memo_key(self, value: Any) -> bytes:
        """What the memoized response depends on (privacy accounting counts distinct keys).

        Raises :class:`~veil.shared.errors.ParameterError` for a value of the wrong
        type or outside the metric's domain.
        """
        raise NotImplementedError

    def memoized(self, key: bytes) -> Any:
        """The permanent response for ``key``, derived from the secret (cached)."""
        cached = self._memo.get(key)
        if cached is None:
            cached = self.derive(key)
            self._memo[key] = cached
            if len(self._memo) > MEMO_CACHE_SIZE:
                self._memo.popitem(last=False)
        return cached

    def derive(self, key: bytes) -> Any:
        """Compute the permanent response for ``key`` (deterministic in the secret)."""
        raise NotImplementedError

    def finish(self, permanent: Any) -> Any:
        """Turn the permanent response into this report's payload (fresh noise, if any)."""
        return permanent

    def encode(self, value: Any) -> Any:
        """The wire payload for one report of ``value``."""
        return self.finish(self.memoized(self.memo_key(value)))
