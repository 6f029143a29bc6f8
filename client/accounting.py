"""Privacy accounting for one installation: the worst-case epsilon spent so far.

Every encoder memoizes its randomized response per *memo key* (the value, or
for numbers its grid point), so what a metric has revealed depends only on
which keys were reported and whether each was reported once or more:

* a key reported exactly once costs ``epsilon_1`` (one report; never more than
  ``epsilon_inf``, since that report is a post-processing of the memoized response);
* a key reported two or more times costs ``epsilon_inf``, the bound memoization
  gives for any number of reports of one value. (Reports of one key share the
  memoized response, so they are not independent mechanisms and
  ``n * epsilon_1`` would not be a valid bound.)

A metric's cost is the sum over its distinct keys (sequential composition over
the distinct values one person reported), and the installation's total is the
sequential composition over metrics. If a metric's parameters change, reports
under the old and the new parameters are separate mechanisms and add up: each
parameter set's memoized responses come from streams keyed by its fingerprint
(stream layout 2, :data:`~veil.client.randomness.STREAM_LAYOUT`), so they are
independent of every other parameter set's.

Stream layout 1, of older SDKs, keyed the streams of strings, RAPPOR categories,
booleans and numbers by the metric name alone, so two parameter sets of one
name drew correlated responses, whose joint cost no sum bounds (booleans at
``alpha`` 0.5 and then 0.6 answer (0, 1) with probability 0.05 for True and never
for False: the pair can reveal the value outright). A database
from such an SDK keeps its parameter sets at layout 1
(:meth:`PrivacyLedger.stream_layout`: their memoized responses stay what they
were, so reporting again costs what the rules above say), new parameter sets
get layout 2, and a metric with two or more layout 1 parameter sets of those
kinds is charged ``inf`` (:func:`entangled`).

What a budget is charged is another figure: which values the reports carried is private,
and a report refused or queued according to it would tell the collector, which sees how
many reports an installation sends, about them (with a budget of 5, the values A, B, A
sent two reports of a string metric and A, B, C three). So a budget charges each
parameter set the most its number of reports could cost over every sequence of values
(:func:`worst_cost`), and :attr:`PrivacySpent.charged` states it: a report is queued or
refused by its count alone, never by its value.

If the ledger was lost (the state database deleted or replaced while the
secret stayed, see :func:`veil.client.state_dir.open_state`), what the reports
before the loss cost is unknown, and the ledger keeps its figures upper bounds
with two rules:

* that unknown spend is counted as :attr:`PrivacySpent.lost`: the whole budget
  (the installation never spent more while a budget was set), or ``inf``
  without one;
* every key's first report after the loss is charged ``epsilon_inf``, as if
  the key had been reported before. The memoized response of a key is the same
  as before the loss (it derives from the secret, and so does the cohort), so
  ``epsilon_inf`` bounds everything the key's reports reveal, before and after.

The ledger lives in the state database and is read and written inside the
same transaction that queues the report, so it stays exact even when several
processes share one state directory. Keys are stored only as
``HMAC-SHA256(ledger_key, metric || 0x00 || memo_key)`` with a ledger key
derived from the installation secret, never as raw values.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import math
import sqlite3
from collections.abc import Callable, Iterable
from fractions import Fraction

from veil.client.encoders import ENCODERS
from veil.client.randomness import DOMAIN, STREAM_LAYOUT
from veil.shared.kinds import MechanismParams, params_from_dict
from veil.shared.privacy import sequential
from veil.shared.registry import Metric

#: memo-key digests kept in memory (recomputed on a miss)
DIGEST_CACHE_SIZE = 4096
#: keys known to be reported twice kept in memory (looked up in the ledger on a miss): every
#: distinct value an installation repeats would otherwise stay, about 260 bytes each
SATURATED_CACHE_SIZE = 65_536


@dataclasses.dataclass(frozen=True)
class PrivacySpent:
    """Worst-case epsilon spent so far: per metric and in total (sequential composition).

    ``lost`` bounds what reports made before the ledger was lost cost (0.0 if it
    never was; then the budget, or ``inf`` without one); ``total`` includes it.
    """

    per_metric: dict[str, float]
    total: float
    budget: float | None
    lost: float = 0.0
    #: what the budget is charged: the most the reports sent could cost over every sequence
    #: of values they could have carried (:func:`worst_cost`), ``lost`` included; at least
    #: ``total``
    charged: float = 0.0
    #: the ``delta`` that goes with ``total``: Gaussian number metrics are ``(epsilon,
    #: delta)``-LDP per grid point reported, and the deltas add up (basic composition); 0.0
    #: without them, ``inf`` once one is reported after the ledger was lost (what was
    #: reported before is unknown). Budgets and the application's limits count epsilon only
    delta: float = 0.0

    @property
    def remaining(self) -> float | None:
        """What is left of the budget (``None`` without a budget), after :attr:`charged`."""
        return None if self.budget is None else max(self.budget - self.charged, 0.0)


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """One metric under one parameter set, with how many memo keys it has seen, the stream
    layout of its memoized responses, its parameters (JSON, as
    :meth:`~veil.shared.kinds.MechanismParams.to_dict` gives) and how many reports it has
    queued (``None``: unknown, for a parameter set recorded by an SDK that did not count
    them)."""

    fingerprint: str
    metric: str
    epsilon_1: float
    epsilon_inf: float
    once: int = 0
    repeated: int = 0
    layout: int = STREAM_LAYOUT
    params: str = ""
    reports: int | None = 0

    def cost(self) -> Fraction | float:
        """Exact worst-case epsilon of the keys seen (``inf`` if a mechanism has no bound)."""
        return price(self.epsilon_1, self.epsilon_inf, self.once, self.repeated)


def price(epsilon_1: float, epsilon_inf: float, once: int, repeated: int) -> Fraction | float:
    """The ledger's rule: ``once`` keys reported once cost ``min(epsilon_1, epsilon_inf)``
    each, ``repeated`` keys reported more than once ``epsilon_inf`` each; exact (``inf`` if
    a term with keys has no bound)."""
    terms = [(min(epsilon_1, epsilon_inf), once), (epsilon_inf, repeated)]
    counted = [(epsilon, keys) for epsilon, keys in terms if keys]
    if any(math.isinf(epsilon) for epsilon, _ in counted):
        return math.inf
    return sum((exact(epsilon) * keys for epsilon, keys in counted), Fraction(0))


@dataclasses.dataclass(frozen=True)
class Charge:
    """One more report of a memo key under ``metric``: ``delta`` is the change of the
    mechanism's (once, repeated) key tallies, ``(1, 0)`` for a first report, ``(-1, 1)``
    for a second, and ``(0, 1)`` for a first report after the ledger was lost."""

    metric: Metric
    fingerprint: str
    digest: bytes
    delta: tuple[int, int]

    @property
    def saturates(self) -> bool:
        """Whether the key now counts as repeated: its later reports cost nothing more."""
        return self.delta[1] == 1


def worst_cost(epsilon_1: float, epsilon_inf: float, reports: int | None,
               keys: int | None) -> Fraction | float:
    """The most ``reports`` reports of one parameter set can cost over every sequence of
    values (``None``: any number of reports), for a metric of at most ``keys`` distinct
    memo keys (``None``: no bound): what a budget is charged for them.

    Under the ledger's rule, ``s`` keys reported once and ``t`` more than once cost
    ``s epsilon_1 + t epsilon_inf``, with ``s + 2t <= reports`` and ``s + t <= keys``. The
    cost rises with ``t`` up to ``reports - keys``, and beyond it only when ``epsilon_inf
    >= 2 epsilon_1``, so the largest is at ``t = min(keys, reports // 2)`` then, and at
    ``t = reports - keys`` (kept in range) otherwise.
    """
    if reports is None:
        return math.inf if keys is None else price(epsilon_1, epsilon_inf, 0, keys)
    most = reports // 2 if keys is None else min(keys, reports // 2)
    pairs = most if epsilon_inf >= 2 * min(epsilon_1, epsilon_inf) else (
        0 if keys is None else min(max(reports - keys, 0), most))
    singles = reports - 2 * pairs if keys is None else min(reports - 2 * pairs, keys - pairs)
    return price(epsilon_1, epsilon_inf, singles, pairs)


@functools.lru_cache(maxsize=256)
def exact(epsilon: float) -> Fraction:
    """The exact rational value of a float epsilon (cached: a handful of distinct values)."""
    return Fraction(epsilon)


def upward(value: Fraction | float) -> float:
    """``value`` as a float never below it."""
    if isinstance(value, float):
        return value
    result = float(value)
    if Fraction(result) < value:
        result = math.nextafter(result, math.inf)
    return result


def compose(epsilons: Iterable[float]) -> float:
    """Sequential composition over metrics (a sum of one term is exact, of none 0)."""
    values = [value for value in epsilons if value]
    if len(values) <= 1:
        return values[0] if values else 0.0
    return sequential(values)


def per_metric(
    mechanisms: Iterable[Mechanism], unbounded: frozenset[str] = frozenset(),
    cost: Callable[[Mechanism], Fraction | float] = Mechanism.cost,
    reported: Callable[[Mechanism], bool] = lambda m: bool(m.once or m.repeated),
) -> dict[str, float]:
    """Each metric's worst-case epsilon: the ``cost`` (:meth:`Mechanism.cost` by default) of
    each of its parameter sets ``reported`` under (some key reported, by default), summed
    and rounded up; ``inf`` for the ``unbounded`` metrics (:func:`entangled`)."""
    sums: dict[str, Fraction | float] = {}
    for mechanism in mechanisms:
        if reported(mechanism):
            value = math.inf if mechanism.metric in unbounded else cost(mechanism)
            sums[mechanism.metric] = sums.get(mechanism.metric, Fraction(0)) + value
    return {metric: upward(value) for metric, value in sorted(sums.items())}


@functools.lru_cache(maxsize=256)
def recorded_params(params_json: str) -> MechanismParams | None:
    """A parameter set recorded as JSON (``None`` if it no longer parses)."""
    try:
        return params_from_dict(json.loads(params_json))
    except (ValueError, TypeError, KeyError):
        return None


def key_count(params_json: str) -> int | None:
    """How many distinct memo keys a parameter set recorded as JSON can have: the values one
    installation may report (:attr:`~veil.shared.kinds.base.MechanismParams.possible_values`;
    ``None``, no bound, for strings or if it no longer parses)."""
    params = recorded_params(params_json)
    return None if params is None else params.possible_values[0]


def charged(mechanisms: Iterable[Mechanism], unbounded: frozenset[str], lost: float,
            keys: Callable[[Mechanism], int | None]) -> float:
    """What a budget is charged for ``mechanisms``' reports: each parameter set's
    :func:`worst_cost` for its number of reports and ``keys`` (its metric's memo keys),
    composed over metrics as :func:`per_metric` does, and ``lost``. After a lost ledger
    (``lost`` above 0) any report may be a value's second, so every report is priced at
    ``epsilon_inf``, as the ledger prices a value's first report after the loss."""
    worst = per_metric(mechanisms, unbounded, lambda m: worst_cost(
        m.epsilon_inf if lost else m.epsilon_1, m.epsilon_inf, m.reports, keys(m)),
        lambda m: m.reports != 0)
    return compose([*worst.values(), lost])


def delta_spent(mechanisms: Iterable[Mechanism], lost: bool) -> float:
    """:attr:`PrivacySpent.delta`: each Gaussian parameter set's ``delta`` times the keys
    (grid points) it reported, added up; ``inf`` if ``lost`` and one was reported."""
    total = Fraction(0)
    for mechanism in mechanisms:
        params = recorded_params(mechanism.params)
        delta = getattr(params, "delta", None)
        if delta and (mechanism.once or mechanism.repeated):
            if lost:
                return math.inf
            total += exact(delta) * (mechanism.once + mechanism.repeated)
    return upward(total)


def entangled(mechanisms: Iterable[Mechanism]) -> frozenset[str]:
    """The metrics reported under two or more parameter sets whose memoized responses share
    one stream: layout 1 of an encoder keyed by the metric name alone
    (:attr:`~veil.client.encoders.base.Encoder.name_keyed_in_layout_1`). No bound on their
    joint cost is known, so they cost ``inf``, whichever values each parameter set saw
    (a number's rounding threshold is shared by all of them). Parameters whose JSON no
    longer parses count as keyed by name."""
    shared: dict[str, set[str]] = {}
    for mechanism in mechanisms:
        if mechanism.layout != 1:
            continue
        params = recorded_params(mechanism.params)
        if params is None:
            identity = mechanism.params
        else:
            if not ENCODERS[params.mechanism_name].name_keyed_in_layout_1:
                continue
            identity = params.fingerprint
        shared.setdefault(mechanism.metric, set()).add(identity)
    return frozenset(metric for metric, sets in shared.items() if len(sets) > 1)


def fingerprint(metric: Metric) -> str:
    """A short stable identifier of a metric's name and parameters."""
    text = json.dumps([metric.name, metric.params.to_dict()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class PrivacyLedger:
    """Counts memo keys per metric in the state database and prices what they cost.

    :meth:`charge`, :meth:`charged_after`, :meth:`write` and :meth:`count` run inside the
    caller's write transaction (``BEGIN IMMEDIATE``), together with the insert into the outbox.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        secret: bytes,
        budget: float | None,
        lost_at: str | None = None,
    ) -> None:
        self.connection = connection
        self.budget = budget
        #: when the ledger was found lost (ISO 8601), or ``None``
        self.lost_at = lost_at
        key = hmac.new(secret, DOMAIN + b"\0ledger", hashlib.sha256).digest()
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._digests: dict[tuple[str, bytes], bytes] = {}
        self._fingerprints: dict[int, tuple[Metric, str, str]] = {}
        #: keys known to be reported twice or more: later reports cost nothing more
        self._saturated: set[tuple[str, bytes]] = set()
        #: stream layout per parameter set (fixed once known: no layout 1 set is ever added)
        self._layouts: dict[str, int] = {}
        #: memo keys per parameter set (:meth:`_key_count`)
        self._keys: dict[str, int | None] = {}
        self._entangled: frozenset[str] | None = None

    def digest(self, metric: str, memo_key: bytes) -> bytes:
        """The stored form of a memo key: an HMAC, so the ledger never holds raw values."""
        cache_key = (metric, memo_key)
        found = self._digests.get(cache_key)
        if found is None:
            if len(self._digests) >= DIGEST_CACHE_SIZE:
                self._digests.clear()
            mac = self._mac.copy()
            mac.update(metric.encode() + b"\0" + memo_key)
            found = self._digests[cache_key] = mac.digest()
        return found

    def _identity(self, metric: Metric) -> tuple[Metric, str, str]:
        """``(metric, fingerprint, parameters as JSON)``, computed once per metric object."""
        cached = self._fingerprints.get(id(metric))
        if cached is None or cached[0] is not metric:
            params = json.dumps(metric.params.to_dict(), sort_keys=True)
            cached = (metric, fingerprint(metric), params)
            self._fingerprints[id(metric)] = cached
        return cached

    def _fingerprint(self, metric: Metric) -> str:
        return self._identity(metric)[1]

    def stream_layout(self, metric: Metric) -> int:
        """The stream layout of ``metric``'s memoized responses on this installation: 1 for a
        parameter set it reported under with an SDK of layout 1 (its responses stay the
        same), :data:`~veil.client.randomness.STREAM_LAYOUT` for every other. The encoder
        must be made with it (:func:`veil.client.encoders.make_encoder`)."""
        fp = self._fingerprint(metric)
        layout = self._layouts.get(fp)
        if layout is None:
            row = self.connection.execute(
                "SELECT layout FROM mechanisms WHERE fingerprint = ?", (fp,)
            ).fetchone()
            layout = self._layouts[fp] = STREAM_LAYOUT if row is None else int(row[0])
        return layout

    def mechanisms(self) -> list[Mechanism]:
        """Every metric and parameter set this installation has reported under."""
        return [
            Mechanism(*row)
            for row in self.connection.execute(
                "SELECT fingerprint, metric, epsilon_1, epsilon_inf, once_keys, repeated_keys, "
                "layout, params, reports FROM mechanisms"
            )
        ]

    def unbounded(self, mechanisms: list[Mechanism]) -> frozenset[str]:
        """:func:`entangled` of the installation's mechanisms (computed once: the layout 1
        parameter sets are those of the database's migration, never more)."""
        if self._entangled is None:
            self._entangled = entangled(mechanisms)
        return self._entangled

    def charge(self, metric: Metric, memo_key: bytes) -> Charge | None:
        """One more report of ``memo_key``; ``None`` if it costs nothing more (seen twice)."""
        fp = self._fingerprint(metric)
        digest = self.digest(metric.name, memo_key)
        if (fp, digest) in self._saturated:
            return None
        row = self.connection.execute(
            "SELECT reports FROM ledger WHERE digest = ? AND params = ?", (digest, fp)
        ).fetchone()
        previous = row[0] if row else 0
        if previous >= 2:
            self._saturate(fp, digest)
            return None
        if previous == 1:
            return Charge(metric, fp, digest, (-1, 1))
        return Charge(metric, fp, digest, (1, 0) if self.lost_at is None else (0, 1))

    @property
    def lost(self) -> float:
        """Bound on the spend the lost ledger held: 0.0, or the budget, or ``inf`` without one."""
        if self.lost_at is None:
            return 0.0
        return math.inf if self.budget is None else self.budget

    def charged_after(self, metric: Metric) -> float:
        """What the budget would be charged with one more report of ``metric`` queued
        (:func:`charged`): decided by the number of reports alone, never their values."""
        recorded = self.mechanisms()
        unbounded = self.unbounded(recorded)
        mechanisms = {m.fingerprint: m for m in recorded}
        fp = self._fingerprint(metric)
        params = metric.params
        current = mechanisms.get(fp) or Mechanism(
            fp, metric.name, params.epsilon_1, params.epsilon_inf, params=self._identity(metric)[2])
        mechanisms[fp] = dataclasses.replace(
            current, reports=None if current.reports is None else current.reports + 1)
        return charged(mechanisms.values(), unbounded, self.lost, self._key_count)

    def _key_count(self, mechanism: Mechanism) -> int | None:
        """:func:`key_count` of a parameter set, kept per fingerprint (a few per installation)."""
        if mechanism.fingerprint not in self._keys:
            self._keys[mechanism.fingerprint] = key_count(mechanism.params)
        return self._keys[mechanism.fingerprint]

    def write(self, charge: Charge) -> None:
        """Record the charge (inside the caller's transaction, with the queued report)."""
        metric, fp = charge.metric, charge.fingerprint
        once, repeated = charge.delta
        self.connection.execute(
            "INSERT INTO mechanisms (fingerprint, metric, params, epsilon_1, epsilon_inf, "
            "once_keys, repeated_keys, layout, reports) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1) "
            "ON CONFLICT (fingerprint) DO UPDATE SET once_keys = once_keys + excluded.once_keys, "
            "repeated_keys = repeated_keys + excluded.repeated_keys, reports = reports + 1",
            (fp, metric.name, self._identity(metric)[2], metric.params.epsilon_1,
             metric.params.epsilon_inf, once, repeated, self.stream_layout(metric)),
        )
        self.connection.execute(
            "INSERT INTO ledger (digest, params, metric, reports) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (digest, params) DO UPDATE SET reports = 2",
            (charge.digest, fp, metric.name, 2 if charge.saturates else 1),
        )

    def count(self, metric: Metric) -> None:
        """Count a report that costs nothing more (its key was reported twice) in its parameter
        set's reports (inside the caller's transaction, with the queued report)."""
        self.connection.execute("UPDATE mechanisms SET reports = reports + 1 WHERE fingerprint = ?",
                                (self._fingerprint(metric),))

    def committed(self, charge: Charge) -> None:
        """Note a charge whose transaction committed (saturated keys skip the lookup)."""
        if charge.saturates:
            self._saturate(charge.fingerprint, charge.digest)

    def _saturate(self, fingerprint: str, digest: bytes) -> None:
        """Remember a key reported twice (a cache of the ledger: forgotten when it holds
        :data:`SATURATED_CACHE_SIZE`, as the digests are)."""
        if len(self._saturated) >= SATURATED_CACHE_SIZE:
            self._saturated.clear()
        self._saturated.add((fingerprint, digest))

    def spent(self) -> PrivacySpent:
        """Per-metric and total worst-case epsilon so far (the lost spend included)."""
        mechanisms = self.mechanisms()
        unbounded = self.unbounded(mechanisms)
        metrics = per_metric(mechanisms, unbounded)
        lost = self.lost
        return PrivacySpent(metrics, compose([*metrics.values(), lost]), self.budget, lost,
                            charged(mechanisms, unbounded, lost, self._key_count),
                            delta_spent(mechanisms, self.lost_at is not None))
