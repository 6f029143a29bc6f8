"""Which peers may say who the client is: ``X-Forwarded-For`` read through ``--proxy-hops``
reverse proxies, and only from ``--trusted-proxy`` addresses when any are given.

With ``PROXY_HOPS`` set, werkzeug's ``ProxyFix`` takes the client's address from the
header (the ``PROXY_HOPS``-th entry from the right), so a client that reaches the collector
directly could name any address and so any rate-limit bucket. ``TRUSTED_PROXIES`` (addresses
or CIDR networks) closes that: a request from any other peer has its forwarded headers
removed and is counted under the peer's own address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.middleware.proxy_fix import ProxyFix

from veil.shared.errors import ParameterError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: the WSGI keys of the headers ProxyFix reads
FORWARDED_KEYS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
                  "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX")


def trusted_networks(values: str | Iterable[str] | None, field: str = "trusted_proxy",
                     name: str = "--trusted-proxy") -> tuple[Network, ...]:
    """The networks of ``values`` (addresses or CIDR networks; one comma-separated string
    too); :class:`ParameterError` naming ``field`` (``name`` in its message) for one that is
    neither."""
    if isinstance(values, str):
        values = [part.strip() for part in values.split(",") if part.strip()]
    networks = []
    for value in values or ():
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise ParameterError(
                field, f"{name} {value!r} is not an IP address or network: give one such as "
                "10.0.0.5, 10.0.0.0/8 or fd00::/8") from None
    return tuple(networks)


class TrustedProxyFix:
    """``ProxyFix`` for requests from ``networks`` (any peer when empty); other requests
    lose their forwarded headers and keep the peer's address."""

    def __init__(self, app: Callable[..., Any], hops: int,
                 networks: tuple[Network, ...]) -> None:
        self.app = app
        self.fixed = ProxyFix(app, x_for=hops)
        self.networks = networks

    def trusts(self, peer: str) -> bool:
        """Whether ``peer`` (an address) is one of the trusted proxies."""
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if self.trusts(str(environ.get("REMOTE_ADDR", ""))):
            return self.fixed(environ, start_response)
        for key in FORWARDED_KEYS:
            environ.pop(key, None)
        return self.app(environ, start_response)
