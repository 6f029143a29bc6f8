"""Discovery channel simulated: a vectorized encoder with the SDK's law, URL-like populations.

:func:`encode_discovery` draws the reports of one level exactly as
:class:`~veil.client.encoders.discovery.DiscoveryEncoder` does (a uniform hash matrix,
the bucket ``A x`` through randomized response over ``2**t`` buckets at the realized
numerators, then the instantaneous response), from numpy's seeded generators: for
simulations only, never production. :func:`url_population` is the built-in
population of ``veil experiment discovery``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.shared.errors import ParameterError
from veil.shared.kinds.discovery import DiscoveryParams
from veil.simulations.encoding import memo_rows
from veil.simulations.oracle_encoding import bernoulli, parity

_WORDS = ("news", "shop", "mail", "cloud", "video", "play", "maps", "data", "home", "blog",
          "store", "music", "photo", "travel", "game", "book", "food", "health", "bank",
          "sport", "tech", "learn", "social", "search")
_TLDS = (".com", ".org", ".net", ".io", ".de", ".co.uk", ".fr", ".app")
_SCHEMES = ("https://", "https://www.", "http://")
_PATH = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789-/"))


def url_population(size: int, rng: np.random.Generator, *, low: int = 8,
                   high: int = 64) -> list[str]:
    """``size`` distinct URL-like ASCII strings of ``low`` to ``high`` bytes: a scheme, a
    host of one or two words, a number and a top-level domain, then a random path, the
    whole cut at a length drawn uniformly from ``low..high``; sorted."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ParameterError("size", f"must be an integer >= 1; got {size!r}")
    if not 1 <= low <= high:
        raise ParameterError("low", f"need 1 <= low <= high; got low={low!r}, high={high!r}")
    out: set[str] = set()
    while len(out) < size:
        host = "".join(rng.choice(_WORDS, size=int(rng.integers(1, 3))))
        value = (str(rng.choice(_SCHEMES)) + host + str(int(rng.integers(0, 1000)))
                 + str(rng.choice(_TLDS)))
        length = int(rng.integers(low, high + 1))
        if len(value) < length:
            value += "/" + "".join(rng.choice(_PATH, size=length - len(value) - 1))
        if len(value[:length]) >= low:
            out.add(value[:length])
    return sorted(out)


def value_vectors(params: DiscoveryParams, values: Sequence[str], level: int) -> np.ndarray:
    """``x`` of each value at ``level`` (:meth:`DiscoveryParams.vector`), as int64."""
    cache: dict[str, int] = {}
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        x = cache.get(value)
        if x is None:
            x = cache[value] = params.vector(params.padded(value.encode()), level)
        out[i] = x
    return out


def encode_discovery(params: DiscoveryParams, vectors: np.ndarray, rng: np.random.Generator,
                     clients: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rows (t, n), buckets (n,))`` of one report per vector. The permanent response
    (the matrix and the randomized bucket) is drawn once per (installation, vector) when
    ``clients`` says which installation made each report, else once per report; the
    instantaneous response is fresh for every report."""
    vectors = np.asarray(vectors, dtype=np.int64)
    first, memo = memo_rows(clients, vectors)
    x = vectors[first]
    n, t, g = len(x), params.bucket_bits or 0, params.buckets
    rows = rng.integers(0, 1 << params.domain_bits, size=(t, n), dtype=np.int64)
    bucket = np.zeros(n, dtype=np.int64)
    for i in range(t):
        bucket |= parity(rows[i] & x) << i
    prr, irr = params.numerators
    other = rng.integers(0, g - 1, size=n)
    bucket = np.where(bernoulli(prr, n, rng), bucket, other + (other >= bucket))
    if memo is not None:
        rows, bucket = rows[:, memo], bucket[memo]
    size = len(bucket)
    bucket = np.where(bernoulli(irr, size, rng), bucket, rng.integers(0, g, size=size))
    return rows, bucket


def payload_hex(params: DiscoveryParams, rows: np.ndarray, buckets: np.ndarray) -> list[str]:
    """The wire payloads (hex) of reports held as rows and buckets."""
    width = params.row_bytes
    out = []
    for j in range(len(buckets)):
        data = b"".join(int(rows[i, j]).to_bytes(width, "big") for i in range(rows.shape[0]))
        out.append((data + bytes([int(buckets[j])])).hex())
    return out
