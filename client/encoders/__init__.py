"""Encoders, one per mechanism (a kind, or a category oracle); :func:`make_encoder` picks the
one for a metric from :data:`ENCODERS`, where each encoder class registers itself when it
is defined. This package imports the built-in ones."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from veil.client.encoders.base import ENCODERS, Encoder
from veil.client.encoders.boolean import BooleanEncoder
from veil.client.encoders.category import CategoryEncoder
from veil.client.encoders.discovery import DiscoveryEncoder
from veil.client.encoders.flh import FlhEncoder
from veil.client.encoders.hcms import HcmsEncoder
from veil.client.encoders.joint import JointEncoder
from veil.client.encoders.number import NumberEncoder
from veil.client.encoders.oracles import GrrEncoder, HadamardEncoder, OlhEncoder, OueEncoder
from veil.client.encoders.string import StringEncoder
from veil.client.randomness import STREAM_LAYOUT
from veil.shared.registry import Metric


def make_encoder(
    metric: Metric,
    secret: bytes,
    cohort_seed: int = 0,
    random_bytes: Callable[[int], bytes] = os.urandom,
    layout: int = STREAM_LAYOUT,
) -> Encoder[Any]:
    """The encoder for ``metric``, keyed by the installation ``secret``; ``layout`` is the
    stream layout of its memoized responses (:class:`~veil.client.encoders.base.Encoder`),
    which :meth:`veil.client.accounting.PrivacyLedger.stream_layout` says for an installation."""
    cls = ENCODERS.lookup(metric.params.mechanism_name)
    return cls(metric.params, metric.name, secret, cohort_seed, random_bytes, layout)


__all__ = [
    "ENCODERS",
    "BooleanEncoder",
    "CategoryEncoder",
    "DiscoveryEncoder",
    "Encoder",
    "FlhEncoder",
    "GrrEncoder",
    "HadamardEncoder",
    "HcmsEncoder",
    "JointEncoder",
    "NumberEncoder",
    "OlhEncoder",
    "OueEncoder",
    "StringEncoder",
    "make_encoder",
]
