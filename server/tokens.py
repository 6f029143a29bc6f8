"""Bearer tokens as the collector and the dashboard check them: the ``Authorization``
header's scheme (RFC 7235: case-insensitive) and a constant-time match against every
configured token, whichever matches."""

from __future__ import annotations

import hmac
from collections.abc import Sequence


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (any case of ``Bearer``),
    or None without one."""
    scheme, _, given = (header or "").partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def matching_token(given: str, tokens: Sequence[bytes]) -> bytes | None:
    """The one of ``tokens`` (UTF-8 bytes) that ``given`` is, or None: every comparison
    runs, in constant time, whichever matches."""
    given_bytes = given.encode("utf-8", "surrogateescape")
    matched = None
    for token in tokens:
        if hmac.compare_digest(given_bytes, token):
            matched = token
    return matched
