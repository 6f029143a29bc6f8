"""The :class:`Client` applications embed: report values, flush them, see the privacy spent.

The client is a facade over its parts, each in a module of its own:
:class:`~veil.client.options.ClientOptions` checks and freezes the keyword
arguments; a :class:`~veil.client.recorder.Recorder` encodes values and queues
the reports in the state database (the outbox, the privacy ledger and the drop
counts); its :class:`~veil.client.registry_source.RegistryLoader` holds the
metric registry, fetches it, and keeps the values that wait for it; an
:class:`~veil.client.uploader.Uploader` carries batches to the collector
through a :class:`~veil.client.transport.Transport`, from a
:class:`~veil.client.worker.BackgroundWorker`'s daemon thread when
``background=True``; an :class:`~veil.client.worker.ExitHook` closes the
client at interpreter exit.

It lives inside other people's applications, so by default it never blocks
them on the network and never raises into them: the constructor reads the
registry from its cache and fetches it in a background thread, and a report
that cannot be queued is dropped, counted (:attr:`Client.drops`) and logged
once per cause. ``strict=True`` raises instead, for tests and development.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

import requests

from veil.client.accounting import PrivacySpent
from veil.client.errors import StateError
from veil.client.options import (
    DEFAULT_MAX_OUTBOX,
    DEFAULT_SHUTDOWN_TIMEOUT,
    ClientOptions,
    call_timeout,
)
from veil.client.outage import Outage
from veil.client.outbox import DROP_CAUSES
from veil.client.privacy_limits import DEFAULT_MAX_EPSILON_PER_VALUE
from veil.client.recorder import Recorder
from veil.client.registry_source import read_cache, resolve_registry
from veil.client.state_dir import open_state, prepare_directory
from veil.client.transport import RequestsTransport, RetryPolicy, Transport
from veil.client.uploader import FlushResult, Uploader
from veil.client.worker import ExitHook
from veil.shared.errors import ParameterError
from veil.shared.registry import Registry

__all__ = ["Client", "FlushResult"]

log = logging.getLogger("veil.client")

#: seconds :meth:`Client.flush` takes at most by default, retries and waits included
DEFAULT_FLUSH_TIMEOUT = 2.0
#: seconds :meth:`Client.close` takes at most by default
DEFAULT_CLOSE_TIMEOUT = 1.0
#: what disables a client when it starts (``strict=True``: raises): the machine, not the code
_START_PROBLEMS = (ParameterError, StateError, OSError, sqlite3.Error)
_Value = TypeVar("_Value")


class _Option(Generic[_Value]):
    """A read-only attribute of the client: its option of the same name
    (:class:`~veil.client.options.ClientOptions`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, client: None, owner: type) -> _Option[_Value]: ...
    @overload
    def __get__(self, client: Client, owner: type | None = None) -> _Value: ...

    def __get__(self, client: Client | None, owner: type | None = None) -> Any:
        return self if client is None else getattr(client._options, self.name)


def _enable_debug_logging() -> None:
    """``debug=True``: log on ``veil.client`` at DEBUG level, to stderr unless the application
    has a handler for it."""
    log.setLevel(logging.DEBUG)
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)


def _exit_holder(client: Client) -> Callable[[bool], None]:
    """What the registry loader calls while values wait in ``client``'s memory only: the exit
    hook then keeps the client alive (it refers to it weakly otherwise, and so does this)."""
    reference = weakref.ref(client)

    def hold(keep: bool) -> None:
        owner = reference()
        if owner is not None and owner._exit_hook is not None:
            owner._exit_hook.hold(owner if keep else None)

    return hold


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
    what it drops); on Python 3.12 and later, where no thread starts at exit, the
    upload's bound there is ``requests``' timeout of each read (docs/client.md).

    ``budget`` caps what the installation is charged (``privacy_spent().charged``: the
    worst case over every value its reports could carry);
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

    strict = _Option[bool]()
    debug = _Option[bool]()
    budget = _Option[float | None]()
    background = _Option[bool]()
    batch_size = _Option[int]()
    timeout = _Option[float]()
    flush_interval = _Option[float]()
    shutdown_timeout = _Option[float]()
    max_batch_bytes = _Option[int]()
    max_outbox = _Option[int]()
    outbox_policy = _Option[str]()
    retry_policy = _Option[RetryPolicy]()

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
        self._options = ClientOptions.checked(
            url=url, state_dir=state_dir, app_name=app_name, registry=registry, token=token,
            budget=budget, background=background, batch_size=batch_size, timeout=timeout,
            max_retries=max_retries, flush_interval=flush_interval,
            shutdown_timeout=shutdown_timeout, max_batch_bytes=max_batch_bytes,
            backoff_base=backoff_base, backoff_cap=backoff_cap, transport=transport,
            max_outbox=max_outbox, outbox_policy=outbox_policy,
            max_epsilon_per_value=max_epsilon_per_value,
            max_epsilon_per_report=max_epsilon_per_report, pinned=pinned, strict=strict,
            debug=debug, disabled=disabled,
        )
        if self.debug:
            _enable_debug_logging()
        self.disabled = self._options.disabled
        #: the bearer token: the argument, else (once started) ``VEIL_UPLOAD_TOKEN``
        self.token = token
        self.transport: Transport = RequestsTransport() if transport is None else transport
        self._own_transport = transport is None
        self._exit_hook: ExitHook[Client] | None = None
        #: the calls whose timeout was no number, logged once each as a WARNING
        self._bad_timeouts: set[str] = set()
        if self.disabled:
            log.debug("Veil is disabled: reports are neither stored nor sent")
            return
        self._start()

    def _start(self) -> None:
        """Read the environment, open the state directory and find the registry, or disable the
        client (non-strict) when the URL, the token or the state directory is missing or bad."""
        options, connection = self._options, None
        try:
            location = options.locate()
            directory = prepare_directory(location.state_dir)
            connection, secret = open_state(directory)
            recorder = Recorder(options, location, self.transport, directory, connection,
                                secret, _exit_holder(self))
            given = options.registry
            if given is None and options.strict:
                given = resolve_registry(location.url, directory, self.transport,
                                         token=location.token, timeout=options.timeout)
        except BaseException as problem:
            if connection is not None:
                connection.close()
            if options.strict or not isinstance(problem, _START_PROBLEMS):
                if self._own_transport:  # one the caller passed in stays theirs
                    self.transport.close()
                raise
            log.error("Veil is disabled: %s", problem)
            self.disabled = True
            return
        self.token, self._location, self._recorder = location.token, location, recorder
        self._exit_hook = ExitHook(self, Client._close_at_exit)
        loader = recorder.loader
        if given is not None:
            loader.install(given)
        else:
            cached = read_cache(directory)
            if cached is not None:
                loader.install(cached)
            loader.start_fetch()
        self._uploader = Uploader(recorder, self.transport, options, location)

    @property
    def url(self) -> str | None:
        """The collector's base URL: ``url``, else ``VEIL_URL`` (``None`` when disabled)."""
        return None if self.disabled else self._location.url

    @property
    def state_dir(self) -> Path | None:
        """The installation's state directory (``None`` when disabled)."""
        return None if self.disabled else self._recorder.directory

    @property
    def session(self) -> requests.Session:
        """The default transport's ``requests.Session``: set proxies, CA bundles or headers there."""
        if not isinstance(self.transport, RequestsTransport):
            raise AttributeError(
                f"this client sends through {type(self.transport).__name__}; "
                "only the default RequestsTransport has a session"
            )
        return self.transport.session

    @property
    def registry(self) -> Registry | None:
        """The metric registry in use, or ``None`` while it is not loaded yet."""
        if self.disabled:
            return None
        metrics = self._recorder.loader.metrics
        return metrics.registry if metrics.loaded else None

    @property
    def refused_metrics(self) -> dict[str, str]:
        """Metrics this application's limits refuse, with why: never encoded, reports dropped."""
        return {} if self.disabled else self._recorder.loader.metrics.refused

    @property
    def cohort_seed(self) -> int | None:
        """The installation's cohort seed, derived from its secret (each string metric uses it
        modulo ``m``; a state database from an SDK older than that keeps its random one).
        ``None`` when the client is disabled."""
        return None if self.disabled else self._recorder.cohort_seed

    @property
    def _closed(self) -> bool:
        return self._recorder.closed

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
        self._recorder.submit(metric, value, strict=self.strict)

    def privacy_spent(self) -> PrivacySpent:
        """The worst-case epsilon spent so far, per metric and in total.

        A string metric with a discovery channel charges the channel this installation
        reports it through (:func:`~veil.client.recorder.reporting_channel`): the spend shows
        under that metric's name, ``homepage`` or ``homepage.discovery``."""
        if self.disabled:
            return PrivacySpent({}, 0.0, self.budget)
        return self._recorder.spent()

    @property
    def pending(self) -> int:
        """Reports waiting to be uploaded: in the outbox, or in memory waiting for the registry."""
        if self.disabled:
            return 0
        self._recorder.check_process()
        return self._recorder.pending()

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
        return self._recorder.drop_counts()

    @property
    def outage(self) -> Outage | None:
        """The collector's outage under way, as this installation saw it, or ``None``.

        It begins with the first upload or registry fetch that cannot reach the
        collector and ends when the collector answers; ``since`` (UTC) and
        ``failures`` (failed attempts) are kept in the state database, so a
        program that runs once a minute continues the outage of its previous run.
        Its first failure is logged as one WARNING, later ones at DEBUG level, and
        its end as one INFO line. Still readable after :meth:`close`; ``None``
        when disabled.
        """
        return None if self.disabled else self._recorder.outage()

    def flush(self, timeout: float | None = DEFAULT_FLUSH_TIMEOUT) -> FlushResult:
        """Upload every queued report in batches; ``timeout`` bounds the whole call (seconds,
        retries and waits included; ``None``: no bound; 0 or less: no waiting, so nothing is
        uploaded and the result only counts what is pending).

        Reports leave the outbox only once the collector acknowledged them
        (accepted or duplicate) or refused them for good (counted as dropped).
        On network failure they stay queued and ``error`` says why; so it does
        when another thread or process holds some of them (``held``), or values
        still wait for the registry. A disabled client returns an empty result;
        a closed one returns one whose ``error`` says so (``strict=True``:
        :class:`ClientClosedError`). A ``timeout`` that is no number is the
        default, with a WARNING (``strict=True``: :class:`ParameterError`).
        """
        seconds = call_timeout("flush", timeout, DEFAULT_FLUSH_TIMEOUT, strict=self.strict,
                               warned=self._bad_timeouts)
        if self.disabled:
            return FlushResult()
        if self._closed and not self.strict:
            return FlushResult(error="this Client is closed")
        self._recorder.check_process()
        deadline = None if seconds is None else time.monotonic() + seconds
        return self._uploader.flush(deadline, None, self.retry_policy, upload=seconds != 0)

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> FlushResult | None:
        """Stop the background uploader, then try one final flush of at most ``timeout`` seconds.

        The final flush fetches the registry if values still wait for it, and
        makes one attempt per batch (no backoff waits), so closing is quick when
        the collector is down. Undelivered reports stay in the outbox for the
        next start (``remaining`` counts them); values still waiting in memory
        for the registry are dropped (``dropped`` counts them; counted as
        ``no_registry`` and logged as a WARNING). A ``timeout`` of 0 or less
        uses no network at all (nor waits for the background uploader); one
        that is no number is the default, with a WARNING (``strict=True``:
        :class:`ParameterError`). Returns that flush's result, or ``None`` if
        the client was already closed (or is disabled) or an upload in progress
        outlived ``timeout``.
        """
        if self.disabled or self._closed:
            return None
        seconds = call_timeout("close", timeout, DEFAULT_CLOSE_TIMEOUT, strict=self.strict,
                               warned=self._bad_timeouts)
        assert seconds is not None
        return self._close(seconds, f"in close(timeout={seconds:g})")

    def _close_at_exit(self) -> None:
        """At interpreter exit: close within ``shutdown_timeout``, unless already closed or
        inherited through a fork unused."""
        if not self.disabled and not self._closed and not self._recorder.forked:
            self._close(self.shutdown_timeout,
                        f"at exit, within shutdown_timeout={self.shutdown_timeout:g} s")

    def _close(self, timeout: float, when: str) -> FlushResult | None:
        """:meth:`close` with ``timeout`` seconds (0: no upload; see :meth:`Uploader.close
        <veil.client.uploader.Uploader.close>`); ``when`` says in log lines which of close()
        and the exit hook it was."""
        if self._exit_hook is not None:
            self._exit_hook.cancel()
        recorder = self._recorder
        if recorder.forked:
            # a forked child that never used the client: the parent's connection is not ours
            recorder.closed = True
            return None
        return self._uploader.close(timeout, when)

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
