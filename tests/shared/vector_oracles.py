"""The test vectors of the category oracles and of joint metrics (docs/test-vectors.json,
sections ``category_oracle`` and ``joint``), derived from docs/protocol.md, section 5,
without the library: the realized permanent numerators in closed form, OLH's default ``g``
by its 1% rule, OLH's linear hash, the order in which each permanent response reads its
stream, a tuple's cell (row-major, bucketed numbers clipped) and, with ``marginals``, the
installation's marginal from its cohort seed.

:func:`tests.shared.test_vectors.build_vectors` imports this module when it derives the
file, and this module builds on that one's stream, fingerprint and stream reader.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from tests.shared.test_vectors import (
    WORD,
    Reader,
    reference_context,
    reference_fingerprint,
    reference_stream,
)

#: the stream layout of every vector here (layout 2 only: the oracles always had the fingerprint)
LAYOUT = 2
#: the most (function, bucket) counters an OLH metric may keep
MAX_OLH_RESPONSES = 2**20
#: bytes of stream the reference reads from (the file gives the first 64)
STREAM_BYTES = 512

CATEGORIES = ["firefox", "chrome", "safari", "edge", "other"]
#: (oracle, epsilon, report_epsilon or None for the default) of the category oracle vectors;
#: OLH at 3/3 is where the 1% rule matters (g = 19, while 23 has the lowest variance)
ORACLE_SETTINGS = [(oracle, 2.0, report_epsilon) for report_epsilon in (2.0, None)
                   for oracle in ("grr", "oue", "olh", "hadamard")] + [("olh", 3.0, 3.0)]
ORACLE_VALUES = ["firefox", "safari", "other"]

BROWSER = ["firefox", "chrome", "safari"]
OS = ["linux", "mac", "windows", "android"]
#: (metric, declared parameters, tuples) of the joint vectors; the parameters are what the
#: registry records (``encoding`` as ``auto`` resolves it: ``grr`` for the pair, ``olh`` for
#: the marginals of three), ``g`` left to the default rule
JOINT_METRICS: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("browser_crashed",
     {"kind": "joint", "of": ["browser", "crashed"], "domains": [BROWSER, "boolean"],
      "epsilon": 2.0, "report_epsilon": 1.0, "encoding": "grr"},
     [{"browser": "chrome", "crashed": True}, {"browser": "safari", "crashed": False}]),
    ("browser_crashed_os",
     {"kind": "joint", "of": ["browser", "crashed", "os"], "domains": [BROWSER, "boolean", OS],
      "epsilon": 2.0, "report_epsilon": 1.0, "encoding": "olh", "marginals": 2},
     [{"browser": "safari", "crashed": True, "os": "mac"},
      {"browser": "firefox", "crashed": False, "os": "android"}]),
    ("browser_os_load",
     {"kind": "joint", "of": ["browser", "crashed", "os", "load_seconds"],
      "domains": [BROWSER, "boolean", OS, [0.0, 1.0, 2.0, 5.0, 10.0]],
      "epsilon": 2.0, "report_epsilon": 1.0, "encoding": "hadamard", "marginals": 3},
     [{"browser": "chrome", "crashed": False, "os": "windows", "load_seconds": 3.7},
      {"browser": "safari", "crashed": True, "os": "linux", "load_seconds": 12.5}]),
]


def is_prime(n: int) -> bool:
    return n >= 2 and all(n % f for f in range(2, math.isqrt(n) + 1))


def digit_count(g: int, d: int) -> int:
    """``r``: the least ``r >= 1`` with ``g^r >= d``."""
    r = 1
    while g**r < d:
        r += 1
    return r


def prr_numerator(oracle: str, d: int, epsilon: float) -> int:
    """``N_prr``: ``floor(2^32 e^eps / (e^eps + d - 1))`` for GRR (and OLH, ``d = g``),
    ``floor(2^32 e^eps / (e^eps + 1))`` for OUE and Hadamard."""
    e = math.exp(epsilon)
    return math.floor(WORD * e / (e + (d - 1 if oracle in ("grr", "olh") else 1)))


def olh_keep(g: int, a: float, report_epsilon: float) -> float:
    """``lambda`` of OLH: the most, in steps of ``2^-32``, with
    ``ln(P1 / P0) <= report_epsilon`` (linear in ``lambda``, solved in closed form)."""
    e = math.exp(report_epsilon)
    rise = (a - 1 / g) - e * ((1 - a) / (g - 1) - 1 / g)
    return min(1.0, math.floor(WORD * (e - 1) / (g * rise)) / WORD)


def olh_g(d: int, epsilon: float, report_epsilon: float) -> int:
    """OLH's default ``g``: among the primes whose ``g^(r+1)`` counters fit, the fewest
    counters within 1% of the lowest variance ``q(1-q)/(p-q)^2`` (an absent category's)."""
    variances = {}
    for g in range(2, math.isqrt(MAX_OLH_RESPONSES) + 1):
        if is_prime(g) and g ** (digit_count(g, d) + 1) <= MAX_OLH_RESPONSES:
            a = prr_numerator("olh", g, epsilon) / WORD
            keep = olh_keep(g, a, report_epsilon)
            p, q = keep * a + (1 - keep) / g, 1 / g
            variances[g] = q * (1 - q) / (p - q) ** 2
    lowest = min(variances.values())
    return min((g for g, variance in variances.items() if variance <= 1.01 * lowest),
               key=lambda g: g ** (digit_count(g, d) + 1))


def olh_hash(a: int, x: int, g: int, r: int) -> int:
    """``h_a(x) = sum(a_i x_i) mod g`` over the ``r`` base-``g`` digits of ``a`` and ``x``."""
    return sum((a // g**i % g) * (x // g**i % g) for i in range(r)) % g


def bernoulli_mask(numerator: int, words: list[int]) -> int:
    """Section 3: the mask of Bernoulli(``numerator / 2^32``) bits built from ``words``."""
    mask = 0
    rest = iter(words)
    for position in range((numerator & -numerator).bit_length() - 1, 32):
        word = next(rest)
        mask = (word | mask) if (numerator >> position) & 1 else (word & mask)
    return mask


def permanent_response(oracle: str, g: int | None, x: int, d: int, numerator: int,
                       stream: bytes) -> dict[str, Any]:
    """The permanent response of category index ``x`` of ``d`` (``g`` buckets for OLH) with
    the numerator ``N_prr``, as the wire carries it (``permanent``), read from ``stream`` in
    section 5's order; OLH's also gives the hash function ``a`` and the bucket ``h_a(x)``."""
    reader = Reader(stream)
    if oracle == "grr":
        if reader.u32() < numerator:
            return {"permanent": x}
        other = reader.randbelow(d - 1)
        return {"permanent": other + (other >= x)}
    if oracle == "oue":
        other = WORD - numerator  # N_c: every other bit is 1 with c = N_c / 2^32
        width, trailing = (d + 7) // 8, (other & -other).bit_length() - 1
        words = [int.from_bytes(reader.read(width), "little") & ((1 << d) - 1)
                 for _ in range(1 + 32 - trailing)]
        own = 1 << x
        bits = (bernoulli_mask(other, words[1:]) & ~own) | (words[0] & own)
        return {"permanent": bits.to_bytes(width, "little").hex()}
    if oracle == "olh":
        assert g is not None
        r = digit_count(g, d)
        a = reader.randbelow(g**r)
        bucket = olh_hash(a, x, g, r)
        response = bucket
        if reader.u32() >= numerator:
            other = reader.randbelow(g - 1)
            response = other + (other >= bucket)
        return {"function": a, "bucket": bucket, "permanent": a * g + response}
    size = 1
    while size <= d:
        size *= 2
    y, u = reader.randbelow(size), x + 1
    inside = reader.u32() < numerator
    if ((u & y).bit_count() % 2 == 0) != inside:
        y ^= u & -u
    return {"permanent": y}


def oracle_params(oracle: str, epsilon: float, report_epsilon: float | None) -> dict[str, Any]:
    """The parameters as ``to_dict()`` writes them: ``report_epsilon`` filled in
    (``epsilon / 2`` by default) and OLH's ``g`` by its default rule."""
    params: dict[str, Any] = {"kind": "category", "oracle": oracle, "categories": CATEGORIES,
                              "epsilon": epsilon,
                              "report_epsilon": epsilon / 2 if report_epsilon is None
                              else report_epsilon}
    if oracle == "olh":
        params["g"] = olh_g(len(CATEGORIES), epsilon, params["report_epsilon"])
    return params


def category_oracle_vector(params: dict[str, Any], value: str) -> dict[str, Any]:
    """Section 5, category oracles: one category's permanent response."""
    fp = reference_fingerprint(params)
    oracle, g = params["oracle"], params.get("g")
    d, x = len(params["categories"]), params["categories"].index(value)
    numerator = prr_numerator(oracle, g or d, params["epsilon"])
    stream = reference_stream(b"prr", "browser",
                              reference_context(LAYOUT, fp, value.encode()), STREAM_BYTES)
    return {"metric": "browser", "value": value, "index": x, "layout": LAYOUT,
            "params": params, "fingerprint": fp, "prr_numerator": numerator,
            "first_64_bytes_hex": stream[:64].hex(),
            **permanent_response(oracle, g, x, d, numerator, stream)}


def category_oracle_vectors() -> list[dict[str, Any]]:
    return [category_oracle_vector(oracle_params(*setting), value)
            for setting in ORACLE_SETTINGS for value in ORACLE_VALUES]


def value_index(domain: Any, value: Any) -> int:
    """A variable's index: a category's position, 0 or 1 for a boolean, a bucketed number's
    bucket ``[e_i, e_(i+1))`` (the last closed), clipped to the first or last."""
    if domain == "boolean":
        return int(value)
    if isinstance(domain[0], str):
        return int(domain.index(value))
    return sum(1 for edge in domain[1:-1] if value >= edge)


def domain_size(domain: Any) -> int:
    """A variable's number of values: 2, its categories, or its buckets (edges less one)."""
    if domain == "boolean":
        return 2
    return len(domain) - (not isinstance(domain[0], str))


def joint_params(declared: dict[str, Any]) -> dict[str, Any]:
    """The declared joint parameters as ``to_dict()`` writes them: ``g`` after ``encoding``
    (OLH's by its default rule over the cell oracle's categories, else ``None``), and
    ``marginals`` last when given."""
    params = {key: value for key, value in declared.items() if key != "marginals"}
    g = None
    if declared["encoding"] == "olh":
        g = olh_g(max(cells for _, cells in marginals_of(declared)), declared["epsilon"],
                  declared["report_epsilon"])
    params["g"] = g
    if "marginals" in declared:
        params["marginals"] = declared["marginals"]
    return params


def marginals_of(params: dict[str, Any]) -> list[tuple[tuple[int, ...], int]]:
    """Each marginal's variables (``itertools.combinations`` over ``of``; the whole tuple
    without ``marginals``) and its cells."""
    sizes = [domain_size(domain) for domain in params["domains"]]
    sets = list(itertools.combinations(range(len(sizes)), params.get("marginals") or len(sizes)))
    return [(chosen, math.prod(sizes[i] for i in chosen)) for chosen in sets]


def joint_vector(metric: str, params: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """Section 5, ``joint``: the cohort (the marginal), the cell ``c`` and the cell oracle's
    permanent response of category ``str(c)``, keyed by the joint metric's fingerprint."""
    fp = reference_fingerprint(params)
    marginals = marginals_of(params)
    cohort, chosen = None, marginals[0][0]
    if params.get("marginals"):  # the installation's marginal: its cohort seed mod C(v, k)
        seed = int.from_bytes(reference_stream(b"cohort", "", b"", 8), "big")
        cohort = seed % len(marginals)
        chosen = marginals[cohort][0]
    cell = 0
    for i in chosen:  # row-major: the last variable varies fastest
        domain = params["domains"][i]
        cell = cell * domain_size(domain) + value_index(domain, value[params["of"][i]])
    cells = max(count for _, count in marginals)  # the cell oracle's categories
    oracle, g = params["encoding"], params["g"]
    numerator = prr_numerator(oracle, g or cells, params["epsilon"])
    stream = reference_stream(b"prr", metric, reference_context(LAYOUT, fp, str(cell).encode()),
                              STREAM_BYTES)
    return {"metric": metric, "value": value, "layout": LAYOUT, "params": params,
            "fingerprint": fp, "cohort": cohort, "cell": cell, "category": str(cell),
            "prr_numerator": numerator, "first_64_bytes_hex": stream[:64].hex(),
            **permanent_response(oracle, g, cell, cells, numerator, stream)}


def joint_vectors() -> list[dict[str, Any]]:
    return [joint_vector(metric, joint_params(declared), value)
            for metric, declared, values in JOINT_METRICS for value in values]
