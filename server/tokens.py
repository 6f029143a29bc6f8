"""Bearer tokens as the collector and the dashboard check them: the ``Authorization``
header's scheme (RFC 7235: case-insensitive) and a constant-time match against every
configured token, whichever matches."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Sequence

from veil.shared.errors import VeilError


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


#: RFC 6750's b64token: what a bearer token may be made of
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def checked_tokens(setting: str | Iterable[str] | None, name: str) -> list[str]:
    """A token setting as a list (one string is one token); :class:`VeilError` naming the
    setting for a token that is not an RFC 6750 ``b64token``, saying so apart for an empty or
    blank one (e.g. from an unset environment variable)."""
    tokens = [setting] if isinstance(setting, str) else list(setting or ())
    for token in tokens:
        if isinstance(token, str) and _TOKEN.fullmatch(token):
            continue
        if not isinstance(token, str) or not token.strip():
            raise VeilError(
                f"{name} holds an empty token ({token!r}; an unset environment variable?): "
                "give non-empty tokens, or leave the setting out"
            )
        raise VeilError(
            f"{name}: a bearer token may hold only letters, digits and - . _ ~ + / "
            "(then = padding), as RFC 6750 says; HTTP headers carry nothing else "
            "reliably. Generate one with: python3 -c 'import secrets; "
            "print(secrets.token_hex(32))'"
        )
    return tokens
