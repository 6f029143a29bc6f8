"""How the client talks to the collector: the :class:`Transport` interface and its default.

A transport uploads one batch (``POST /v1/reports``) and says how that ended
(an :class:`Outcome`), and fetches the metric registry (``GET /v1/metrics``).
Everything else (which reports go in a batch, what an outcome does to the
outbox) stays in the client, so a transport is only the way bytes travel, as a
``requests`` adapter is for a ``Session``.

:class:`RequestsTransport`, the default, retries only where resending can
help: network errors, 408, 429 and 5xx. The delay before retry ``n`` (from 0)
is drawn uniformly from ``[0, min(backoff_base * 2**n, backoff_cap)]`` ("full
jitter", so that many clients coming back after an outage do not retry in
lockstep), or is the collector's ``Retry-After`` when it sends one. Resending
a batch is safe: the collector deduplicates reports by id.
"""

from __future__ import annotations

import dataclasses
import email.utils
import functools
import logging
import math
import os
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import requests

from veil.client.errors import RegistryUnavailableError
from veil.shared.errors import ParameterError
from veil.shared.registry import Registry

log = logging.getLogger("veil.client")

RETRY_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
#: jitter from the OS's generator: a ``random.Random`` is copied by ``os.fork()``, and forked
#: processes would then wait and retry in lockstep
_jitter = random.SystemRandom()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one batch upload ended.

    ``kind`` is ``"acknowledged"`` (HTTP 200 with a well-formed answer in
    ``answer``: the counts ``accepted``, ``duplicates`` and ``rejected``, and
    optionally ``errors``, the list of refused reports), ``"too_large"`` (413,
    or 400 ``too_many``: split the batch), ``"refused"`` (another 4xx: the
    collector will not take this batch as sent) or ``"unreachable"`` (retries
    exhausted, deadline reached or stopped); ``message`` says why for the last three.
    ``retry_after``: seconds the collector asked the client to wait that the transport did
    not wait out (longer than the policy's ``backoff_cap``, or asked on the last attempt);
    the uploader waits them before its next upload.
    """

    kind: str
    status: int | None = None
    answer: dict[str, Any] | None = None
    message: str = ""
    retry_after: float | None = None


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How many times and how long to wait between attempts."""

    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_cap: float = 30.0

    def delay(self, retry: int) -> float:
        """Full-jitter delay before retry number ``retry`` (from 0)."""
        return _jitter.uniform(0.0, min(self.backoff_base * 2.0**retry, self.backoff_cap))


def retry_after(response: requests.Response) -> float | None:
    """Seconds the collector asked us to wait (``Retry-After``: seconds or an HTTP date)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def answer_json(response: requests.Response) -> Any:
    """The answer's JSON; ``None`` when it is none, or nested deeper than Python's parser goes
    (``RecursionError``: a hostile collector or proxy must not raise into the application)."""
    try:
        return response.json()
    except (ValueError, RecursionError):
        return None


def _acknowledgement(response: requests.Response, sent: int) -> dict[str, Any] | None:
    """The parsed 200 answer if it has the contract's shape, else ``None``."""
    answer = answer_json(response)
    if not isinstance(answer, dict):
        return None
    counts: list[int] = [
        value for key in ("accepted", "duplicates", "rejected")
        if isinstance(value := answer.get(key), int) and not isinstance(value, bool) and value >= 0
    ]
    if len(counts) != 3:
        return None
    if not isinstance(answer.get("errors", []), list):
        return None
    if sum(counts) != sent:
        log.warning(
            "the collector acknowledged a batch of %d reports with counts %s that do not add up",
            sent, counts,
        )
    return answer


def _batch_error(response: requests.Response) -> tuple[str, str]:
    """``(code, message)`` from a collector error body (``{"error": {...}}``)."""
    answer = answer_json(response)
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return "", response.text[:200]
    return str(error.get("code", "")), f"{error.get('field', '')}: {error.get('message', '')}"


#: seconds :meth:`RequestsTransport.within` waits past its limit, so that a request whose
#: socket timed out says so itself (a ``ReadTimeout``, a refused connection)
GRACE = 0.1


def _copy_settings(source: requests.Session, target: requests.Session) -> None:
    """Every setting of ``source`` (the state ``requests.Session`` pickles) onto ``target``,
    but its adapters, which hold pooled connections. Called in a forked child, whose copy of
    the parent's objects is its own, so the values are shared, not copied."""
    for name in requests.Session.__attrs__:
        if name != "adapters":
            setattr(target, name, getattr(source, name))


def network_problem(exc: requests.RequestException) -> str:
    """A one-line account of a failed request: the exception's class and its root cause
    (``ConnectionError (connection refused)``), not urllib3's nested descriptions."""
    cause: BaseException | None = exc
    reason = ""
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror
        inner = getattr(cause, "reason", None)
        if not isinstance(inner, BaseException):
            first = cause.args[0] if cause.args else None
            inner = first if isinstance(first, BaseException) else None
        cause = inner or cause.__cause__ or cause.__context__
    if not reason:
        reason = "timed out" if isinstance(exc, requests.Timeout) else "no further detail"
    return f"{exc.__class__.__name__} ({reason.lower()})"


def _authorization(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


class Transport(ABC):
    """The way a :class:`~veil.client.Client` reaches its collector; subclass it to plug your own.

    The client may call :meth:`send` from two threads at once (a ``flush()``
    while the background uploader runs), and after ``os.fork()`` a child calls
    the same object: a transport holding connections opens new ones there.
    The client calls :meth:`close` when it closes.
    """

    @abstractmethod
    def send(
        self,
        url: str,
        body: bytes,
        reports: int,
        *,
        token: str | None,
        timeout: float,
        policy: RetryPolicy,
        deadline: float | None = None,
        stop: threading.Event | None = None,
    ) -> Outcome:
        """Upload one batch (``body``: the JSON of ``reports`` reports) to ``{url}/v1/reports``.

        ``token`` is the bearer token (``None``: none), ``timeout`` bounds each
        request, ``policy`` says how often and how long to retry, ``deadline`` (a
        :func:`time.monotonic` instant) bounds the whole call and ``stop`` ends
        waiting early. Failures are returned as an :class:`Outcome`, not raised.
        """

    def fetch_registry(self, url: str, *, token: str | None, timeout: float) -> Registry:
        """The collector's metric registry (``GET {url}/v1/metrics``).

        Raises :class:`~veil.client.RegistryUnavailableError`, with
        ``unreachable=True`` when the collector did not answer (the client counts
        that in the outage under way); this default always does, so the client
        falls back to its cached copy or ``registry=``.
        """
        raise RegistryUnavailableError(f"{type(self).__name__} does not fetch the registry")

    def close(self) -> None:
        """Release connections and other resources (this default holds none)."""
        return None


class RequestsTransport(Transport):
    """The default transport: HTTP with ``requests``, retries with backoff, ``Retry-After``."""

    def __init__(self) -> None:
        self._session: requests.Session | None = None
        self._pid = os.getpid()
        #: a request given up at its deadline whose thread still waits for the answer
        self._overrun: threading.Thread | None = None

    def within(self, limit: float, request: Callable[[], requests.Response]) -> requests.Response:
        """Make ``request`` and read its whole answer within ``limit`` seconds of wall-clock
        time (and :data:`GRACE`).

        ``requests``' timeout bounds each socket operation, not the request: an answer sent a
        byte at a time, or a slow name lookup, took as long as it liked, and with it
        ``flush()``, ``close()`` and the exit. The request runs in a thread of its own. One
        that overruns is given up (a batch sent again is acknowledged as duplicates), and
        its thread waits on until the answer ends; while it does, no other request starts
        (each would leave a thread behind): they count as timeouts. Where no thread can
        start (at interpreter shutdown, Python 3.12 and later), the request runs in the
        caller's, bounded by ``requests``' timeout of each socket operation only.
        """
        if self._overrun is not None and self._overrun.is_alive():
            raise requests.Timeout("an earlier request given up at its deadline still waits "
                                   "for the collector's answer")
        outcome: list[requests.Response | Exception] = []

        def run() -> None:
            try:
                response = request()
                _ = response.content  # the body too, under the same bound
                outcome.append(response)
            except Exception as exc:  # handed to the caller
                outcome.append(exc)

        thread = threading.Thread(target=run, name="veil-request", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            run()
        else:
            thread.join(max(limit, 0.0) + GRACE)
        if not outcome:
            self._overrun = thread
            raise requests.Timeout(f"no complete answer within {limit:.3g} s")
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    @property
    def session(self) -> requests.Session:
        """This process's ``requests.Session``: created on first use, and anew after a fork,
        with the settings the application gave the parent's (headers, cookies, proxies, auth,
        hooks, TLS verification and client certificate, environment trust, parameters,
        redirects); adapters it mounted are not carried over (they hold the parent's pooled
        connections)."""
        if self._session is None or self._pid != os.getpid():
            # a forked child must not share the parent's pooled connections
            inherited, self._pid = self._session, os.getpid()
            self._session = requests.Session()
            if inherited is not None:
                _copy_settings(inherited, self._session)
        return self._session

    def send(
        self,
        url: str,
        body: bytes,
        reports: int,
        *,
        token: str | None,
        timeout: float,
        policy: RetryPolicy,
        deadline: float | None = None,
        stop: threading.Event | None = None,
    ) -> Outcome:
        """POST the batch until it is acknowledged, refused for good, or retrying must end."""
        address = f"{url}/v1/reports"
        headers = {"Content-Type": "application/json", **_authorization(token)}
        attempt = 0
        while True:
            limit = timeout if deadline is None else min(timeout, deadline - time.monotonic())
            if limit <= 0:
                return Outcome("unreachable", message="flush deadline reached")
            wait: float | None = None
            try:
                response = self.within(limit, functools.partial(
                    self.session.post, address, data=body, headers=headers, timeout=limit))
            except requests.RequestException as exc:
                problem, status = f"POST {address} failed: {network_problem(exc)}", None
            else:
                status = response.status_code
                if status == 200:
                    answer = _acknowledgement(response, reports)
                    if answer is not None:
                        return Outcome("acknowledged", status, answer)
                    problem = (
                        f"POST {address}: HTTP 200 with an answer that does not match the batch"
                    )
                elif status in RETRY_STATUSES:
                    problem = f"POST {address}: HTTP {status}"
                    wait = retry_after(response)
                else:
                    code, message = _batch_error(response)
                    if status == 413 or (status == 400 and code == "too_many"):
                        return Outcome("too_large", status, message=message)
                    return Outcome(
                        "refused", status, message=f"HTTP {status} {code} {message}".strip()
                    )
            if attempt >= policy.max_retries:
                tries = f"{attempt + 1} attempts" if attempt else "1 attempt"
                return Outcome("unreachable", status, message=f"{problem} (gave up after {tries})",
                               retry_after=wait)
            delay = policy.delay(attempt) if wait is None else wait
            if wait is not None and wait > policy.backoff_cap:
                return Outcome("unreachable", status, message=f"{problem}; the collector asked "
                               f"to retry after {wait:.0f} s", retry_after=wait)
            if deadline is not None and time.monotonic() + delay >= deadline:
                return Outcome("unreachable", status, message=f"{problem} (flush deadline reached)")
            log.debug("%s; retrying in %.2f s", problem, delay)
            if stop is not None:
                if stop.wait(delay):
                    return Outcome("unreachable", status, message=f"{problem} (client closing)")
            else:
                time.sleep(delay)
            attempt += 1

    def fetch_registry(self, url: str, *, token: str | None, timeout: float) -> Registry:
        """``GET {url}/v1/metrics`` and parse it; raise :class:`RegistryUnavailableError`."""
        address = f"{url}/v1/metrics"
        try:
            response = self.within(timeout, lambda: self.session.get(
                address, headers=_authorization(token), timeout=timeout))
        except requests.RequestException as exc:
            raise RegistryUnavailableError(
                f"GET {address} failed: {network_problem(exc)}", unreachable=True
            ) from None
        status = response.status_code
        if status != 200:
            raise RegistryUnavailableError(f"GET {address} answered HTTP {status}",
                                           unreachable=status in RETRY_STATUSES)
        document = answer_json(response)
        if document is None:
            raise RegistryUnavailableError(f"GET {address} returned an invalid registry: "
                                           "no JSON document")
        try:
            return Registry.from_dict(document, lenient=True)
        except (ValueError, ParameterError) as exc:
            raise RegistryUnavailableError(
                f"GET {address} returned an invalid registry: {exc}"
            ) from None

    def close(self) -> None:
        """Close this process's session (never one inherited from the parent of a fork)."""
        if self._session is not None and self._pid == os.getpid():
            self._session.close()
        self._session = None
