"""The :class:`Client` applications embed: report values, flush them, see the privacy spent.

The client is a facade over its parts: the encoders randomize values, the
:class:`~veil.client.outbox.Outbox` and the
:class:`~veil.client.accounting.PrivacyLedger` keep reports and epsilon in the
state database, a :class:`~veil.client.transport.Transport` carries batches to
the collector, and a :class:`~veil.client.worker.BackgroundWorker` flushes
from a daemon thread when ``background=True``.

It lives inside other people's applications, so by default it never blocks
them on the network and never raises into them: the constructor reads the
registry from its cache and fetches it in a background thread, and a report
that cannot be queued is dropped, counted (:attr:`Client.drops`) and logged
once per cause. ``strict=True`` raises instead, for tests and development.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from veil.client import settings
from veil.client.accounting import PrivacyLedger, PrivacySpent
from veil.client.encoders import make_encoder
from veil.client.encoders.base import Encoder
from veil.client.errors import (
    BudgetExceededError,
    ClientClosedError,
    StateError,
    UnknownMetricError,
)
from veil.client.outbox import DROP_CAUSES, Outbox
from veil.client.privacy_limits import DEFAULT_MAX_EPSILON_PER_VALUE, PrivacyLimits
from veil.client.randomness import HmacStream
from veil.client.registry_source import (
    WaitingValues,
    fetch_registry,
    given_registry,
    read_cache,
    resolve_registry,
)
from veil.client.state_dir import (
    cohort_seed,
    ledger_lost_at,
    open_database,
    open_state,
    prepare_directory,
    transaction,
)
from veil.client.transport import RequestsTransport, RetryPolicy, Transport
from veil.client.worker import BackgroundWorker, ExitHook
from veil.shared.bits import realize
from veil.shared.errors import ParameterError, VeilError
from veil.shared.registry import Metric, Registry
from veil.shared.wire import join_batch, make_report, validate_report

log = logging.getLogger("veil.client")

MAX_BATCH_SIZE = 10_000
#: default cap of the outbox, in reports (115 to 520 bytes each on disk, by kind and k)
DEFAULT_MAX_OUTBOX = 100_000
#: what a full outbox drops: the new report (the default) or the oldest queued one
OUTBOX_POLICIES = ("drop-newest", "drop-oldest")
#: seconds :meth:`Client.flush` takes at most by default, retries and waits included
DEFAULT_FLUSH_TIMEOUT = 2.0
#: seconds :meth:`Client.close` takes at most by default
DEFAULT_CLOSE_TIMEOUT = 1.0
#: seconds the client may take at interpreter exit, by default, to fetch the registry, encode the
#: values that waited for it and upload (``shutdown_timeout``)
DEFAULT_SHUTDOWN_TIMEOUT = 2.0
#: values that may wait in memory for the registry (raw values: never written to disk) ...
MAX_WAITING = 1_000
#: ... and how long after it was reported each is kept for sure: the next value that has to
#: wait, or the next failed fetch of the registry, drops those reported longer ago
WAITING_SECONDS = 10.0
#: a report waiting for the registry starts a new fetch at most this often
FETCH_RETRY_SECONDS = 5.0
_JSON = json.JSONEncoder(separators=(",", ":"))
#: what disables a client when it starts (``strict=True``: raises): the machine, not the code
_START_PROBLEMS = (ParameterError, StateError, OSError, sqlite3.Error)
#: what ``report()`` turns into a counted drop (``strict=True``: raises) ...
_REPORT_ERRORS = (VeilError, sqlite3.Error)
#: ... and the cause it is counted under (the first match)
_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (UnknownMetricError, "unknown_metric"),
    (BudgetExceededError, "budget"),
    (ClientClosedError, "closed"),
    (StateError, "state"),
    (sqlite3.Error, "state"),
    (VeilError, "invalid_value"),
)


def reporting_channel(registry: Registry, metric: str, secret: bytes) -> Metric:
    """The metric an installation with ``secret`` reports the string metric ``metric`` as:
    ``registry[metric]`` itself, or its discovery channel (:meth:`Registry.channel
    <veil.shared.registry.Registry.channel>`) for the installations whose ``u < N``, where
    ``u`` is the first word (:meth:`~veil.client.randomness.RandomStream.u32`) of the
    :class:`~veil.client.randomness.HmacStream` with purpose ``channel``, the metric's name
    and an empty context, and ``N / 2**32`` the channel's realized ``share``. The choice is
    made once for all: every value of ``metric`` goes out through the same channel."""
    channel = registry.channel(metric)
    if channel is not None:
        u = HmacStream(secret, b"channel", metric, b"").u32()
        if u < realize(channel.params.channel_share):
            return channel
    return registry[metric]


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What one :meth:`Client.flush` did.

    ``sent`` reports were answered by the collector: ``accepted`` new ones,
    ``duplicates`` it already had (both leave the outbox), and ``rejected`` ones
    it refused for good (dropped from the outbox, counted in
    :attr:`Client.dropped`, and logged). ``remaining`` reports are still queued
    (values waiting in memory for the registry included); ``held`` of them are
    being uploaded by another thread or process sharing the state directory, so
    this flush could not send them. ``dropped`` values were given up by
    :meth:`Client.close`: they waited in memory for a registry that did not
    come (counted as ``no_registry``; ``remaining`` then counts only what the
    outbox keeps for the next start). ``error`` says why the flush did not empty
    the outbox (``None`` when it did).
    """

    batches: int = 0
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None
    held: int = 0
    dropped: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing went wrong (every claimed batch was acknowledged)."""
        return self.error is None


@dataclasses.dataclass(frozen=True)
class _Metrics:
    """The registry in use and what derives from it; replaced whole when another arrives.

    ``prepared`` maps each metric reported so far (and not refused) to its
    :class:`Metric` and encoder: the one lookup of :meth:`Client.report`.
    """

    registry: Registry
    refused: dict[str, str]
    prepared: dict[str, tuple[Metric, Encoder[Any]]] = dataclasses.field(default_factory=dict)

    @property
    def loaded(self) -> bool:
        """False for the stand-in used until a registry arrives."""
        return self is not _NOT_LOADED

    def uses(self, registry: Registry) -> bool:
        """Whether ``registry`` is the one loaded already."""
        return self.loaded and self.registry == registry


_NOT_LOADED = _Metrics(Registry([]), {})


def _positive(name: str, value: Any, *, integer: bool = False, upper: float = math.inf) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value <= upper:
        what = "an integer" if integer else "a number"
        bound = f" and at most {upper:g}" if math.isfinite(upper) else ""
        raise ParameterError(name, f"{name} must be {what} greater than 0{bound}; got {value!r}")


def _check_url(url: Any, source: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ParameterError(
            "url",
            f"{source} must be the collector's base URL, like 'https://veil.example.org'; "
            f"got {url!r}",
        )
    return url.rstrip("/")


def _check_token(token: Any, source: str) -> str:
    """``token`` checked; the message never shows it (it is a secret)."""
    if not isinstance(token, str) or not token or "\n" in token:
        raise ParameterError(
            "token",
            f"{source} must be a non-empty string without line breaks (leave it out for "
            "collectors open to uploads)",
        )
    return token


def _values(count: int) -> str:
    """``1 value``, ``2 values``: counts in log lines and errors."""
    return f"{count} value" if count == 1 else f"{count} values"


def _enable_debug_logging() -> None:
    """``debug=True``: log on ``veil.client`` at DEBUG level, to stderr unless the application
    has a handler for it."""
    log.setLevel(logging.DEBUG)
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)


class Client:
    """Records values privately and uploads the randomized reports to a Veil collector.

    ``Client(url, app_name="myapp")`` keeps the installation's secret, outbox
    and privacy ledger in the platform's per-user state directory for
    ``myapp``, or in ``state_dir``; ``url``, ``token``, ``state_dir``,
    ``disabled`` and ``debug`` left at ``None`` come from ``VEIL_URL``,
    ``VEIL_UPLOAD_TOKEN``, ``VEIL_STATE_DIR``, ``VEIL_DISABLED`` and ``VEIL_DEBUG``.
    The metric registry is ``registry=`` (a :class:`~veil.shared.registry.Registry`
    or a TOML path), or the collector's, read from the state directory's cache
    and fetched in a background thread: the constructor never waits for the
    network. :meth:`report` never touches the network; :meth:`flush` uploads, or
    ``background=True`` lets a daemon thread do it about every ``flush_interval``
    seconds or ``batch_size`` reports. At interpreter exit a client that was not
    closed takes at most ``shutdown_timeout`` seconds to fetch the registry
    (if values still wait for it), encode and upload (0: it only counts and logs
    what it drops).

    ``budget`` caps the installation's total worst-case epsilon;
    ``max_epsilon_per_value``, ``max_epsilon_per_report`` and ``pinned`` are the
    application's own limits on what the collector's registry may ask (metrics
    beyond them are refused: :attr:`refused_metrics`). ``max_outbox`` caps the
    reports kept while the collector is unreachable, and ``outbox_policy`` says
    which go when it is full. ``transport`` replaces the default
    :class:`~veil.client.transport.RequestsTransport`; :meth:`close` closes it.

    By default nothing the SDK meets raises into the application: a report that
    cannot be queued is dropped, counted in :attr:`drops` and logged once per
    cause, and a missing URL, a bad ``VEIL_*`` variable or an unusable state
    directory disables the client (logged as an error). ``strict=True`` raises
    instead, and fetches the registry in the constructor. ``debug=True`` logs
    every drop. ``disabled=True`` makes every call a no-op: nothing is stored or
    sent.
    """

    def __init__(
        self,
        url: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        app_name: str | None = None,
        registry: Registry | str | os.PathLike[str] | None = None,
        token: str | None = None,
        budget: float | None = None,
        background: bool = False,
        batch_size: int = 500,
        timeout: float = 10.0,
        max_retries: int = 5,
        flush_interval: float = 5.0,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        max_batch_bytes: int = 1_000_000,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
        transport: Transport | None = None,
        max_outbox: int = DEFAULT_MAX_OUTBOX,
        outbox_policy: str = "drop-newest",
        max_epsilon_per_value: float | None = DEFAULT_MAX_EPSILON_PER_VALUE,
        max_epsilon_per_report: float | None = None,
        pinned: Mapping[str, str] | None = None,
        strict: bool = False,
        debug: bool | None = None,
        disabled: bool | None = None,
    ) -> None:
        if not isinstance(strict, bool):
            raise ParameterError("strict", f"strict must be True or False; got {strict!r}")
        self.strict = strict
        self.debug = settings.flag("debug", debug, settings.DEBUG_VARIABLE)
        self.disabled = settings.flag("disabled", disabled, settings.DISABLED_VARIABLE)
        if self.debug:
            _enable_debug_logging()
        if token is not None:
            _check_token(token, "token")
        if budget is not None:
            _positive("budget", budget)
        if not isinstance(background, bool):
            raise ParameterError(
                "background", f"background must be True or False; got {background!r}"
            )
        _positive("batch_size", batch_size, integer=True, upper=MAX_BATCH_SIZE)
        _positive("timeout", timeout, upper=3600)
        _positive("flush_interval", flush_interval, upper=86400)
        if isinstance(shutdown_timeout, bool) or not isinstance(shutdown_timeout, int | float) \
                or not 0 <= shutdown_timeout <= 3600:
            raise ParameterError(
                "shutdown_timeout",
                "shutdown_timeout must be a number of seconds from 0 (no upload at exit) to "
                f"3600; got {shutdown_timeout!r}",
            )
        _positive("max_batch_bytes", max_batch_bytes, integer=True)
        _positive("backoff_base", backoff_base, upper=3600)
        _positive("backoff_cap", backoff_cap, upper=3600)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ParameterError(
                "max_retries", f"max_retries must be an integer >= 0; got {max_retries!r}"
            )
        _positive("max_outbox", max_outbox, integer=True)
        if outbox_policy not in OUTBOX_POLICIES:
            raise ParameterError(
                "outbox_policy",
                f"outbox_policy must be 'drop-newest' or 'drop-oldest'; got {outbox_policy!r}",
            )
        self._limits = PrivacyLimits.checked(max_epsilon_per_report, max_epsilon_per_value, pinned)
        if transport is not None and not isinstance(transport, Transport):
            raise ParameterError(
                "transport",
                "transport must be a veil.client.Transport, or None for the default "
                f"RequestsTransport; got {type(transport).__name__}",
            )
        if app_name is not None:
            settings.check_app_name(app_name)
        given = given_registry(registry)
        if url is not None:
            url = _check_url(url, "url")
        #: the bearer token: the argument, else (once started) ``VEIL_UPLOAD_TOKEN``
        self.token = token
        self.budget = budget
        self.background = background
        self.batch_size = batch_size
        self._batch_limit = batch_size
        self.timeout = float(timeout)
        self.flush_interval = float(flush_interval)
        self.shutdown_timeout = float(shutdown_timeout)
        self.max_batch_bytes = max_batch_bytes
        self.max_outbox = max_outbox
        self.outbox_policy = outbox_policy
        self._drop_oldest = outbox_policy == "drop-oldest"
        self.retry_policy = RetryPolicy(max_retries, float(backoff_base), float(backoff_cap))
        self.transport: Transport = RequestsTransport() if transport is None else transport
        self._own_transport = transport is None

        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned: list[sqlite3.Connection] = []
        self._metrics = _NOT_LOADED
        self._waiting = WaitingValues(MAX_WAITING, WAITING_SECONDS)
        self._fetching = False
        self._fetched = threading.Event()
        self._fetch_ended = -math.inf
        self._registry_problem: str | None = None
        self._registry_warned = False
        self._upload_failing = False
        #: drop causes already logged at WARNING level (once each)
        self._warned: set[str] = set()
        #: drops that could not be written to the state database (it was closed or failing)
        self._unsaved: collections.Counter[str] = collections.Counter()
        self._drops_at_close = dict.fromkeys(DROP_CAUSES, 0)
        #: reports dropped since the outbox was last found full (logged once per episode)
        self._outbox_full_drops = 0
        self._worker: BackgroundWorker | None = None
        self._exit_hook: ExitHook[Client] | None = None
        if self.disabled:
            log.debug("Veil is disabled: reports are neither stored nor sent")
            return
        self._start(url, state_dir, app_name, given)

    # ---------------------------------------------------------------- set-up

    def _start(
        self, url: str | None, state_dir: str | os.PathLike[str] | None, app_name: str | None,
        given: Registry | None,
    ) -> None:
        """Read the environment, open the state directory and find the registry, or disable the
        client (non-strict) when the URL, the token or the state directory is missing or bad."""
        connection: sqlite3.Connection | None = None
        try:
            self._url = self._collector_url(url)
            self.token = self._upload_token()
            self._directory = prepare_directory(self._state_directory(state_dir, app_name))
            connection, self._secret = open_state(self._directory)
            self._attach(connection, recover=True)
            self._cohort_seed = cohort_seed(connection, self._secret)
            if given is None and self.strict:
                given = resolve_registry(self._url, self._directory, self.transport,
                                         token=self.token, timeout=self.timeout)
        except BaseException as problem:
            if connection is not None:
                connection.close()
            if self.strict or not isinstance(problem, _START_PROBLEMS):
                self._release_transport()
                raise
            log.error("Veil is disabled: %s", problem)
            self.disabled = True
            return
        self._exit_hook = ExitHook(self, Client._close_at_exit)
        if given is not None:
            self._install(given)
        else:
            cached = read_cache(self._directory)
            if cached is not None:
                self._install(cached)
            self._start_fetch()
        if self.background:
            self._worker = BackgroundWorker(
                self._flush_in_background, batch_size=self.batch_size,
                interval=self.flush_interval,
            )

    @staticmethod
    def _collector_url(url: str | None) -> str:
        """The collector's URL: the argument (checked already), else ``VEIL_URL``."""
        if url is not None:
            return url
        found = settings.environment(settings.URL_VARIABLE)
        if found is None:
            raise ParameterError(
                "url", f"no collector URL: pass url= or set {settings.URL_VARIABLE}"
            )
        return _check_url(found, settings.URL_VARIABLE)

    def _upload_token(self) -> str | None:
        """The bearer token: the argument (checked already), else ``VEIL_UPLOAD_TOKEN``, else
        ``None`` (an open collector)."""
        if self.token is not None:
            return self.token
        found = settings.environment(settings.TOKEN_VARIABLE)
        return None if found is None else _check_token(found, settings.TOKEN_VARIABLE)

    def _state_directory(
        self, state_dir: str | os.PathLike[str] | None, app_name: str | None
    ) -> str | os.PathLike[str]:
        """``state_dir``, else ``VEIL_STATE_DIR``, else the default directory of ``app_name``."""
        if state_dir is not None:
            return state_dir
        found = settings.environment(settings.STATE_DIR_VARIABLE)
        if found is not None:
            return found
        if app_name is None:
            if self.strict:
                raise ParameterError(
                    "app_name",
                    "give app_name= (Veil then keeps its state in the platform's per-user state "
                    f"directory for it) or state_dir=, or set {settings.STATE_DIR_VARIABLE}",
                )
            app_name = settings.DEFAULT_APP_NAME
            log.warning(
                "no app_name or state_dir given: Veil keeps its state in %s, shared by every "
                "application that names neither; pass app_name=",
                settings.default_state_dir(app_name),
            )
        return settings.default_state_dir(app_name)

    def _release_transport(self) -> None:
        """Close the default transport (one the caller passed in stays theirs until we exist)."""
        if self._own_transport:
            self.transport.close()

    @property
    def url(self) -> str | None:
        """The collector's base URL: ``url``, else ``VEIL_URL`` (``None`` when disabled)."""
        return None if self.disabled else self._url

    @property
    def state_dir(self) -> Path | None:
        """The installation's state directory (``None`` when disabled)."""
        return None if self.disabled else self._directory

    @property
    def session(self) -> requests.Session:
        """The default transport's ``requests.Session``: set proxies, CA bundles or headers there."""
        if not isinstance(self.transport, RequestsTransport):
            raise AttributeError(
                f"this client sends through {type(self.transport).__name__}; "
                "only the default RequestsTransport has a session"
            )
        return self.transport.session

    def _attach(self, connection: sqlite3.Connection, *, recover: bool) -> None:
        """Use ``connection`` (to the state database) for the outbox and the ledger."""
        self._connection = connection
        self._outbox = Outbox(connection)
        self._ledger = PrivacyLedger(
            connection, self._secret, self.budget, ledger_lost_at(connection)
        )
        if recover:
            returned = self._outbox.recover()
            if returned:
                log.info("%d reports whose upload was interrupted are queued again", returned)

    def _check_process(self) -> None:
        """Raise if closed; after ``os.fork()`` give the child its own connection.

        (The worker and the default transport notice the fork themselves.) The
        values waiting for the registry stay the parent's to encode.
        """
        if self._closed:
            raise ClientClosedError("this Client is closed; create a new one")
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._waiting = WaitingValues(MAX_WAITING, WAITING_SECONDS)
            self._fetching = False
            # never close the parent's SQLite connection in the child: closing it would
            # release this process's POSIX locks on the database (SQLite's fork caveat)
            self._abandoned.append(self._connection)
            self._attach(open_database(self._directory), recover=False)

    # ---------------------------------------------------------------- the registry

    @property
    def registry(self) -> Registry | None:
        """The metric registry in use, or ``None`` while it is not loaded yet."""
        metrics = self._metrics
        return metrics.registry if metrics.loaded else None

    @property
    def refused_metrics(self) -> dict[str, str]:
        """Metrics this application's limits refuse, with why: never encoded, reports dropped."""
        return self._metrics.refused

    def _install(self, registry: Registry) -> None:
        """Use ``registry`` from now on, and encode the values that waited for it."""
        refused = self._limits.refusals(registry)
        with self._waiting.settling:
            previous, ready, _ = self._end_fetch(_Metrics(registry, refused), None)
            if not previous.uses(registry):
                for name, why in refused.items():
                    if previous.refused.get(name) != why:
                        log.error("%s", why)
                for name in sorted(set(self._limits.pinned) - set(registry)):
                    log.warning("pinned metric %r is not in the registry", name)
            for metric, value in ready:
                self._submit(metric, value, strict=False)

    def _end_fetch(
        self, metrics: _Metrics | None, problem: str | None
    ) -> tuple[_Metrics, list[tuple[Any, Any]], int]:
        """A fetch of the registry ended (or a registry was given or cached): use ``metrics``
        unless its registry is in use already; ``None``: the fetch failed with ``problem``.

        Returns the metrics in use until now, the values to report now (once a
        registry is loaded, every value waiting) and, after a failed fetch, how
        many values it removed for waiting too long. Call it holding
        ``self._waiting.settling`` until those values are reported.
        """
        now = time.monotonic()
        ready: list[tuple[Any, Any]] = []
        with self._waiting.lock:
            previous = self._metrics
            if metrics is not None and not previous.uses(metrics.registry):
                self._metrics = metrics
            self._fetching = False
            self._fetch_ended = now
            expired = 0 if metrics is not None else self._waiting.expire(now)
            if self._metrics.loaded:
                ready = self._waiting.take()
            self._hold_for_exit()
        self._registry_problem = problem
        if problem is None:
            self._registry_warned = False
        return previous, ready, expired

    def _hold_for_exit(self) -> None:
        """Let the exit hook keep this client alive while values wait in its memory only (call it
        holding ``self._waiting.lock``)."""
        if self._exit_hook is not None:
            self._exit_hook.hold(self if len(self._waiting) else None)

    def _start_fetch(
        self, *, unless_within: float = 0.0, inline: float | None = None
    ) -> threading.Event:
        """Fetch the registry in a daemon thread, or with ``inline`` (seconds at most) in this
        one, unless a fetch is at it or the last attempt ended less than ``unless_within``
        seconds ago; the event is set when it ends."""
        with self._waiting.lock:
            if self._fetching or time.monotonic() - self._fetch_ended < unless_within:
                return self._fetched
            self._fetching = True
            done = self._fetched = threading.Event()
        if inline is not None:
            self._fetch_registry(done, inline)
            return done
        thread = threading.Thread(target=self._fetch_registry, args=(done, self.timeout),
                                  name="veil-registry", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            # the interpreter is shutting down (Python 3.12 and later start no thread then):
            # the values keep waiting, and the exit hook fetches in its own thread
            with self._waiting.lock:
                self._fetching = False
            done.set()
        return done

    def _fetch_registry(self, done: threading.Event, timeout: float) -> None:
        try:
            registry = fetch_registry(self.transport, self._url, self._directory,
                                      token=self.token, timeout=timeout)
        except VeilError as problem:
            self._registry_unavailable(str(problem))
        except Exception as problem:
            log.exception("fetching the metric registry failed")
            self._registry_unavailable(f"{type(problem).__name__}: {problem}")
        else:
            self._install(registry)
        finally:
            done.set()

    def _registry_unavailable(self, problem: str) -> None:
        """A fetch failed: forget the values that waited too long; with a registry loaded (this
        was a refresh), the values that waited for it are reported against the one in use."""
        with self._waiting.settling:
            previous, retry, expired = self._end_fetch(None, problem)
            self._drop_waiting(
                expired,
                f"for more than {WAITING_SECONDS:g} s (it could not be fetched: {problem})",
            )
            if previous.loaded:
                log.info("could not refresh the metric registry; using the one loaded: %s",
                         problem)
            elif not self._registry_warned:
                self._registry_warned = True
                log.warning(
                    "the metric registry is not available yet: %s. Up to %d values wait in "
                    "memory for it; one reported more than %g s ago is dropped when the next "
                    "value waits or the next fetch fails, and counted in "
                    "client.drops['no_registry']",
                    problem, MAX_WAITING, WAITING_SECONDS,
                )
            for metric, value in retry:
                self._submit(metric, value, strict=False)

    def _drop_waiting(self, count: int, why: str) -> None:
        """Count and log ``count`` values dropped after waiting for the registry (``why`` ends
        the message: how long they waited)."""
        if count:
            self._drop("no_registry", f"dropped {_values(count)} that waited for the metric "
                       f"registry {why}", count)

    def _wait_for_registry(self, metrics: _Metrics, metric: Any, value: Any) -> None:
        """Keep ``value`` in memory until the registry arrives (bounded in count and time)."""
        with self._waiting.lock:
            current = self._metrics is metrics and (not metrics.loaded or self._fetching)
            if current:
                kept, expired = self._waiting.add(metric, value, time.monotonic())
                self._hold_for_exit()
        if not current:  # the registry arrived meanwhile
            self._report(metric, value)
            return
        self._drop_waiting(expired, f"for more than {WAITING_SECONDS:g} s")
        if not kept:
            self._drop("no_registry", f"dropped a report of {metric!r}: {MAX_WAITING} values "
                       "already wait in memory for the metric registry")
        self._start_fetch(unless_within=FETCH_RETRY_SECONDS)

    def _await_registry(self, deadline: float | None, *, inline: bool = False) -> None:
        """Wait (at most until ``deadline``, or ``timeout``) for the registry, or for the refresh
        values wait for, fetching it if no fetch is under way (``inline``: in this thread)."""
        if self._metrics.loaded and not self._waiting:
            return
        limit = self.timeout if deadline is None else deadline - time.monotonic()
        if not inline:
            done = self._start_fetch()
        elif limit > 0:
            done = self._start_fetch(inline=min(limit, self.timeout))
        else:
            return
        done.wait(max(limit if deadline is None else deadline - time.monotonic(), 0.0))

    # ---------------------------------------------------------------- reporting

    def report(self, metric: str, value: Any) -> None:
        """Randomize ``value`` for ``metric`` and queue the report durably.

        When this returns, the report (randomized; the raw value is never stored)
        is committed to the outbox: it survives the application crashing. Before
        the registry is loaded the value waits in memory (bounded) and is encoded
        when it arrives.

        It never raises by default: an unknown metric, a bad value, a report
        over the ``budget``, a refused metric, a full outbox, a closed client or
        a failing state database drop the report (nothing is queued or charged),
        count it in :attr:`drops` and log the first drop of each cause. With
        ``strict=True`` it raises :class:`UnknownMetricError`,
        :class:`~veil.shared.errors.ParameterError` (field ``value``, naming the
        metric), :class:`BudgetExceededError`, :class:`ClientClosedError`, or
        :class:`StateError` or :class:`sqlite3.Error` (the state database failed)
        instead (refused metrics and a full outbox still only drop). A disabled
        client does nothing.
        """
        if self.disabled:
            return
        self._submit(metric, value, strict=self.strict)

    def _submit(self, metric: Any, value: Any, *, strict: bool) -> None:
        """Report a value (for :meth:`report`, or one that waited for the registry); one that
        cannot be queued raises if ``strict``, else it is dropped, counted and logged."""
        try:
            self._report(metric, value)
        except _REPORT_ERRORS as problem:
            if strict:
                raise
            cause = next(cause for kind, cause in _CAUSES if isinstance(problem, kind))
            self._drop(cause, f"dropped a report of {metric!r}: {problem}")

    def _report(self, metric: Any, value: Any) -> None:
        self._check_process()
        metrics = self._metrics
        try:
            spec, encoder = metrics.prepared[metric]
        except (KeyError, TypeError):
            prepared = self._prepare(metrics, metric, value)
            if prepared is None:
                return
            spec, encoder = prepared
        try:
            key = encoder.memo_key(value)
        except ParameterError as problem:
            raise ParameterError("value", f"metric {metric!r}: value {problem.message}") from None
        wire = make_report(secrets.token_hex(16), spec.name, encoder.cohort,
                           encoder.finish(encoder.memoized(key)), spec.params.fingerprint)
        validate_report(wire, metrics.registry)
        body = _JSON.encode(wire)
        with self._lock:
            if self._ledger.saturated(spec, key):
                # costs nothing more: a single autocommitted insert (evicting needs a transaction)
                queued, evicted = self._queue(body, atomic=False)
            else:
                with transaction(self._connection):
                    queued, evicted = self._queue(body, atomic=True)
                    charge = self._ledger.charge(spec, key) if queued else None
                    if charge is not None:
                        if self.budget is not None:
                            total = self._ledger.total_after(charge)
                            if total > self.budget:
                                raise BudgetExceededError(
                                    spec.name, self._ledger.spent().total, total, self.budget,
                                    self._budget_note(),
                                )
                        self._ledger.write(charge)
                if charge is not None:
                    self._ledger.committed(charge)
            self._note_outbox(evicted + (not queued))
        if queued and self._worker is not None:
            self._worker.nudge()

    def _queue(self, body: str, *, atomic: bool) -> tuple[bool, int]:
        """Insert ``body`` into the outbox, if it has room or (``drop-oldest``) the oldest ready
        report makes room; return whether it was queued, and how many reports were evicted.

        Call it holding the lock; ``atomic``: inside the caller's transaction, else
        the eviction opens one (the insert alone needs none).
        """
        if self._outbox.insert(body, self.max_outbox):
            return True, 0
        if not self._drop_oldest:
            return False, 0
        with contextlib.nullcontext() if atomic else transaction(self._connection):
            evicted = self._outbox.evict_oldest(self.max_outbox)
            return self._outbox.insert(body, self.max_outbox), evicted

    def _prepare(
        self, metrics: _Metrics, metric: Any, value: Any
    ) -> tuple[Metric, Encoder[Any]] | None:
        """The first report of ``metric``: the metric its reports go out as (itself, or the
        discovery channel this installation reports a string metric through:
        :func:`reporting_channel`) and that one's encoder, or ``None`` when the value waits for
        the registry or that metric is refused (dropped); unknown metrics, and a channel
        named directly, raise."""
        registry = metrics.registry
        if not isinstance(metric, str) or metric not in registry:
            if not metrics.loaded or self._fetching:
                self._wait_for_registry(metrics, metric, value)
                return None
            raise UnknownMetricError(metric, [name for name, spec in registry.items()
                                              if not spec.of])
        owner = registry[metric].of
        if owner:
            raise UnknownMetricError(
                metric, [],
                f"metric {metric!r} is the discovery channel of {owner!r}, not a metric to "
                f"report to: report to {owner!r} (each installation reports it through one "
                "channel, chosen from its secret)")
        spec = reporting_channel(registry, metric, self._secret)
        why = metrics.refused.get(spec.name)
        if why is not None:
            self._drop("privacy_limit", f"dropped a report of {metric!r}: {why}")
            return None
        with self._lock:
            layout = self._ledger.stream_layout(spec)
        prepared = (spec, make_encoder(spec, self._secret, self._cohort_seed, layout=layout))
        metrics.prepared[metric] = prepared
        return prepared

    def _budget_note(self) -> str:
        """Why the spend is what it is, for :class:`BudgetExceededError` after a ledger loss."""
        if self._ledger.lost_at is None:
            return ""
        return (
            f" (the privacy ledger was lost, noticed {self._ledger.lost_at}: the spend before "
            "that is unknown and counts as the whole budget)"
        )

    def _note_outbox(self, dropped: int) -> None:
        """Count the reports a full outbox dropped (the new one, or the oldest it evicted); log
        once when the outbox starts dropping reports, and once when it has room again."""
        if dropped:
            self._outbox.count_dropped("outbox_full", dropped)
            if not self._outbox_full_drops:
                which = ("new reports are dropped" if not self._drop_oldest
                         else "the oldest queued reports are dropped to make room")
                log.warning(
                    "the outbox holds max_outbox=%d reports that the collector has not taken: "
                    "%s (counted in client.drops['outbox_full']) until an upload makes room",
                    self.max_outbox, which,
                )
            self._outbox_full_drops += dropped
        elif self._outbox_full_drops:
            log.warning(
                "the outbox has room again; %d reports were dropped while it was full",
                self._outbox_full_drops,
            )
            self._outbox_full_drops = 0

    def _drop(self, cause: str, message: str, count: int = 1, *, warn: bool = False) -> None:
        """Count ``count`` reports dropped for ``cause`` and log it (WARNING the first time, or
        with ``warn``).

        The count is durable, unless the client is closed or the state database fails:
        then it is kept in memory.
        """
        with self._lock:
            if self._closed:
                self._unsaved[cause] += count
            else:
                try:
                    self._outbox.count_dropped(cause, count)
                except sqlite3.Error:
                    self._unsaved[cause] += count
        self._log_drop(cause, message, warn=warn)

    def _log_drop(self, cause: str, message: str, *, warn: bool = False) -> None:
        """Log a drop: at WARNING level the first time for ``cause`` (or with ``warn``), at DEBUG
        afterwards."""
        with self._lock:
            first = cause not in self._warned or warn
            self._warned.add(cause)
        if not first:
            log.debug("%s", message)
            return
        log.warning(
            "%s. Further drops of this kind are counted in client.drops[%r] and logged at debug "
            "level%s", message, cause, "" if self.debug else " (debug=True shows them)",
        )

    def privacy_spent(self) -> PrivacySpent:
        """The worst-case epsilon spent so far, per metric and in total.

        A string metric with a discovery channel charges the channel this installation
        reports it through (:func:`reporting_channel`): the spend shows under that metric's
        name, ``homepage`` or ``homepage.discovery``."""
        if self.disabled:
            return PrivacySpent({}, 0.0, self.budget)
        self._check_process()
        with self._lock:
            return self._ledger.spent()

    @property
    def pending(self) -> int:
        """Reports waiting to be uploaded: in the outbox, or in memory waiting for the registry."""
        if self.disabled:
            return 0
        self._check_process()
        return self._pending()

    def _pending(self) -> int:
        """The outbox's reports and the values waiting for the registry, counted while no value
        moves from one to the other (so none is counted twice or not at all)."""
        with self._waiting.settling, self._lock:
            return self._outbox.pending() + len(self._waiting)

    @property
    def dropped(self) -> int:
        """Reports dropped over the installation's lifetime, whatever the cause (see :attr:`drops`)."""
        return sum(self.drops.values())

    @property
    def drops(self) -> dict[str, int]:
        """Reports dropped over the installation's lifetime, per cause (still readable after
        :meth:`close`; all zero when disabled).

        ``rejected`` (refused for good by the collector), ``outbox_full``,
        ``privacy_limit`` (a refused metric), ``invalid_value``, ``unknown_metric``,
        ``budget``, ``no_registry`` (waited in memory for a registry that did not
        come), ``closed`` (reported after :meth:`close`; counted in memory only)
        and ``state`` (the state database failed).
        """
        if self.disabled:
            return dict.fromkeys(DROP_CAUSES, 0)
        if self._closed:
            durable = self._drops_at_close
        else:
            self._check_process()
            with self._lock:
                durable = self._outbox.drops()
        return {cause: durable[cause] + self._unsaved[cause] for cause in DROP_CAUSES}

    @property
    def cohort_seed(self) -> int | None:
        """The installation's cohort seed, derived from its secret (each string metric uses it
        modulo ``m``; a state database from an SDK older than that keeps its random one).
        ``None`` when the client is disabled."""
        return None if self.disabled else self._cohort_seed

    # ---------------------------------------------------------------- uploading

    def flush(self, timeout: float | None = DEFAULT_FLUSH_TIMEOUT) -> FlushResult:
        """Upload every queued report in batches; ``timeout`` bounds the whole call (seconds,
        retries and waits included; ``None``: no bound).

        Reports leave the outbox only once the collector acknowledged them
        (accepted or duplicate) or refused them for good (counted as dropped).
        On network failure they stay queued and ``error`` says why; so it does
        when another thread or process holds some of them (``held``), or values
        still wait for the registry. A disabled client returns an empty result;
        a closed one returns one whose ``error`` says so (``strict=True``:
        :class:`ClientClosedError`).
        """
        if timeout is not None:
            _positive("timeout", timeout)
        if self.disabled:
            return FlushResult()
        if self._closed and not self.strict:
            return FlushResult(error="this Client is closed")
        self._check_process()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._flush_safely(deadline, None, self.retry_policy)

    def _flush_safely(
        self, deadline: float | None, stop: threading.Event | None, policy: RetryPolicy,
        *, closing: bool = False,
    ) -> FlushResult:
        """:meth:`_flush`, with a failing state database reported in the result (non-strict)."""
        try:
            return self._flush(deadline, stop, policy, closing=closing)
        except sqlite3.Error as problem:
            if self.strict:
                raise
            log.error("the state database failed during an upload: %s", problem)
            try:
                remaining = self._pending()
            except sqlite3.Error:
                remaining = len(self._waiting)  # at least these are not uploaded
            return FlushResult(remaining=remaining, error=f"the state database failed: {problem}")

    def _flush(
        self, deadline: float | None, stop: threading.Event | None, policy: RetryPolicy,
        *, closing: bool = False,
    ) -> FlushResult:
        """Upload until the outbox is empty, an upload fails, or ``deadline``; ``stop`` set:
        the background worker's (it does not wait for the registry); ``closing``: fetch the
        registry in this thread (the last chance, and at exit no thread may start)."""
        if stop is None:
            self._await_registry(deadline, inline=closing)
        elif not self._metrics.loaded:
            self._start_fetch()
        totals = {"batches": 0, "sent": 0, "accepted": 0, "duplicates": 0, "rejected": 0}
        error: str | None = None
        while True:
            limit = self._batch_limit
            with self._lock:
                rows = self._outbox.claim(limit, self.max_batch_bytes)
                if not rows:
                    break
            seqs = [seq for seq, _ in rows]
            body = join_batch(secrets.token_hex(16), [text for _, text in rows]).encode()
            try:
                outcome = self.transport.send(
                    self._url, body, len(rows), token=self.token, timeout=self.timeout,
                    policy=policy, deadline=deadline, stop=stop,
                )
            except BaseException:
                with self._lock:
                    self._outbox.release(seqs)
                raise
            if outcome.kind == "acknowledged":
                answer = outcome.answer or {}
                rejected = answer["rejected"]
                with self._lock:
                    self._outbox.delete(seqs)
                    if rejected:
                        self._outbox.count_dropped("rejected", rejected)
                for item in answer.get("errors", [])[:20]:
                    self._log_drop("rejected", f"the collector refused a report: {item}")
                self._note_upload(None, outcome.kind)
                totals["batches"] += 1
                totals["sent"] += len(rows)
                totals["accepted"] += answer["accepted"]
                totals["duplicates"] += answer["duplicates"]
                totals["rejected"] += rejected
                continue
            if outcome.kind == "too_large" and len(rows) == 1:
                with self._lock:
                    self._outbox.delete(seqs)
                    self._outbox.count_dropped("rejected")
                self._log_drop(
                    "rejected", f"the collector refuses a report as too large: {outcome.message}"
                )
                totals["batches"] += 1
                totals["sent"] += 1
                totals["rejected"] += 1
                continue
            with self._lock:
                self._outbox.release(seqs)
            if outcome.kind == "too_large":
                # the collector's limit holds for later flushes too
                self._batch_limit = max(1, len(rows) // 2)
                continue
            error = outcome.message
            self._note_upload(error, outcome.kind)
            break
        with self._waiting.settling, self._lock:
            remaining = self._outbox.pending()
            held = self._outbox.held() if remaining else 0
            waiting = len(self._waiting)
        if error is None and waiting:
            error = (f"{_values(waiting)} waiting in memory for the metric registry: "
                     f"{self._registry_problem or 'the fetch is still under way'}")
        elif error is None and held:
            error = (f"{held} reports are held by another upload in progress (another thread, "
                     "or another process sharing the state directory)")
        return FlushResult(remaining=remaining + waiting, error=error, held=held, **totals)

    def _note_upload(self, error: str | None, kind: str) -> None:
        """Log an upload failure once per outage (then at DEBUG level), and the recovery."""
        with self._lock:
            was_failing, self._upload_failing = self._upload_failing, error is not None
        if error is None:
            if was_failing:
                log.info("uploads to the collector succeed again")
            return
        if was_failing:
            log.debug("upload failed; the reports stay queued: %s", error)
            return
        if kind == "refused":
            log.error("the collector refused a batch; the reports stay queued: %s (further "
                      "failures are logged at debug level until an upload succeeds)", error)
        else:
            log.warning("upload failed; the reports stay queued: %s (further failures are "
                        "logged at debug level until an upload succeeds)", error)

    def _flush_in_background(self, stop: threading.Event) -> None:
        """The background worker's flush: retries as configured, waits end when ``stop`` is set."""
        self._flush_safely(None, stop, self.retry_policy)

    # ---------------------------------------------------------------- closing

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> FlushResult | None:
        """Stop the background uploader, then try one final flush of at most ``timeout`` seconds.

        The final flush fetches the registry if values still wait for it, and
        makes one attempt per batch (no backoff waits), so closing is quick when
        the collector is down. Undelivered reports stay in the outbox for the
        next start (``remaining`` counts them); values still waiting in memory
        for the registry are dropped (``dropped`` counts them; counted as
        ``no_registry`` and logged as a WARNING). Returns that flush's result,
        or ``None`` if the client was already closed (or is disabled) or an
        upload in progress outlived ``timeout``.
        """
        if self.disabled or self._closed:
            return None
        _positive("timeout", timeout)
        return self._close(timeout, f"in close(timeout={timeout:g})")

    def _close_at_exit(self) -> None:
        """At interpreter exit: close within ``shutdown_timeout``, unless already closed or
        inherited through a fork unused."""
        if not self.disabled and not self._closed and self._pid == os.getpid():
            self._close(self.shutdown_timeout,
                        f"at exit, within shutdown_timeout={self.shutdown_timeout:g} s")

    def _close(self, timeout: float, when: str) -> FlushResult | None:
        """:meth:`close` with ``timeout`` seconds (0: no upload); ``when`` says in log lines
        which of close() and the exit hook it was."""
        if self._exit_hook is not None:
            self._exit_hook.cancel()
        if self._pid != os.getpid():
            # a forked child that never used the client: the parent's connection is not ours
            self._closed = True
            return None
        deadline = time.monotonic() + timeout
        stopped = self._worker is None or self._worker.stop(timeout)
        if not stopped:
            if timeout > 0:
                log.warning("closing while an upload is still in progress; its reports stay "
                            "queued")
            self._stop_reporting(when)
            return None
        policy = dataclasses.replace(self.retry_policy, max_retries=0)
        result = FlushResult(remaining=len(self._waiting))
        try:
            if timeout > 0:
                result = self._flush_safely(deadline, None, policy, closing=True)
        finally:
            lost, queued = self._stop_reporting(when)
            with self._lock:
                self._connection.close()
            self.transport.close()
        if not lost:
            return result
        error = (f"dropped {_values(lost)} that waited in memory for the metric registry: "
                 f"{self._registry_problem or 'the fetch was still under way'}")
        return dataclasses.replace(
            result, dropped=lost, error=error,
            remaining=result.remaining - lost if queued is None else queued,
        )

    def _stop_reporting(self, when: str) -> tuple[int, int | None]:
        """At close: drop the values still waiting for the registry (counted, and logged as a
        WARNING), then mark the client closed and keep the drop counts readable (later drops
        are counted in memory). Returns how many values were dropped, and how many reports the
        outbox keeps for the next start (``None`` if the state database cannot say)."""
        queued: int | None = None
        with self._waiting.settling:
            with self._waiting.lock:
                lost = len(self._waiting.take())
                self._hold_for_exit()
            if lost:
                problem = self._registry_problem or "the fetch was still under way"
                self._drop(
                    "no_registry",
                    f"lost {_values(lost)} reported before the metric registry arrived: it "
                    f"could not be fetched {when} ({problem}); they are counted in "
                    "client.drops['no_registry']",
                    lost, warn=True,
                )
            try:
                with self._lock:
                    self._closed = True
                    self._drops_at_close = self._outbox.drops()
                    queued = self._outbox.pending()
            except sqlite3.Error as problem:
                log.warning("cannot read the drop counts at close: %s", problem)
        return lost, queued

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "disabled" if self.disabled else f"state_dir={str(self.state_dir)!r}"
        return f"Client(url={self.url!r}, {where})"
