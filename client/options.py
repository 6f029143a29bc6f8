"""The client's options: the keyword arguments of :class:`~veil.client.Client`, checked once and
frozen, completed from the ``VEIL_*`` environment variables when the client starts.

The arguments are checked declaratively, as the parameter classes of :mod:`veil.shared.kinds`
are: :data:`CONSTRAINTS` gives each argument one constraint, and
:func:`~veil.shared.validation.check_fields` raises :class:`~veil.shared.errors.ParameterError`
naming the first bad one, in scikit-learn's form: ``The 'batch_size' parameter of Client must be
an integer in (0, 10000]. Got 0 instead.`` A bad argument is a mistake in the application's code,
so it raises even without ``strict`` and with ``disabled=True``. The token is checked apart
(:func:`check_token`): its message never shows the value, a secret.

What the machine supplies is read when the client starts (:meth:`ClientOptions.locate`): a
missing or bad ``VEIL_URL`` or ``VEIL_UPLOAD_TOKEN`` is a :class:`ParameterError` there, which
disables the client unless it is strict. ``VEIL_DEBUG`` and ``VEIL_DISABLED`` are read at once:
they decide whether the client starts at all.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from veil.client import settings
from veil.client.privacy_limits import PrivacyLimits, valid_pins
from veil.client.registry_source import given_registry
from veil.client.transport import RetryPolicy, Transport
from veil.shared.errors import ParameterError, type_name
from veil.shared.registry import Registry
from veil.shared.validation import Interval, OneOf, check_fields

log = logging.getLogger("veil.client")

#: the most reports one upload request may carry (``batch_size``)
MAX_BATCH_SIZE = 10_000
#: default cap of the outbox, in reports (115 to 520 bytes each on disk, by kind and k)
DEFAULT_MAX_OUTBOX = 100_000
#: what a full outbox drops: the new report (the default) or the oldest queued one
OUTBOX_POLICIES = ("drop-newest", "drop-oldest")
#: seconds the client may take at interpreter exit, by default, to fetch the registry, encode the
#: values that waited for it and upload (``shutdown_timeout``)
DEFAULT_SHUTDOWN_TIMEOUT = 2.0


@dataclasses.dataclass(frozen=True)
class Rule:
    """A constraint for :func:`~veil.shared.validation.check_fields` that the numeric and
    one-of constraints do not cover: ``test`` decides, ``description`` completes "must be"."""

    description: str
    test: Callable[[Any], bool]

    def __str__(self) -> str:
        return self.description

    def accepts(self, value: Any) -> bool:
        return self.test(value)


def _positive(value: Any) -> bool:
    """A number greater than 0; infinity (no bound) included."""
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def _flag(variable: str | None = None) -> Rule:
    """``True`` or ``False``; with ``variable``, also ``None`` (read that variable)."""
    if variable is None:
        return Rule("True or False", lambda value: isinstance(value, bool))
    return Rule(f"True, False or None (read {variable})",
                lambda value: value is None or isinstance(value, bool))


def _cap(meaning: str) -> Rule:
    """A number greater than 0 (infinity included), or ``None``, which means ``meaning``."""
    return Rule(f"a number greater than 0, or None ({meaning})",
                lambda value: value is None or _positive(value))


def _collector_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def _folder_name(value: Any) -> bool:
    return (isinstance(value, str) and bool(value.strip()) and value not in (".", "..")
            and "/" not in value and os.sep not in value)


def _seconds(value: Any) -> bool:
    """A number, not NaN (0 or less: no waiting; infinity: no bound)."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and not (isinstance(value, float) and math.isnan(value)))


#: seconds for :meth:`Client.close <veil.client.Client.close>` ...
SECONDS = Rule("a number of seconds (0 or less: no waiting)", _seconds)
#: ... and for :meth:`Client.flush <veil.client.Client.flush>`
SECONDS_OR_NONE = Rule("a number of seconds (0 or less: no waiting), or None (no bound)",
                       lambda value: value is None or _seconds(value))


def call_timeout(
    call: str, timeout: Any, default: float, *, strict: bool, warned: set[str]
) -> float | None:
    """The ``timeout`` given to ``Client.<call>`` (``flush`` takes ``None``, no bound): a
    number of seconds, 0 for any number up to 0 (no waiting: no network at all). One that is
    no number raises :class:`ParameterError` with ``strict``; else it is ``default``, with a
    WARNING the first time for ``call`` in ``warned`` (DEBUG after): ``close()`` sits in
    ``finally`` blocks, and a mistake there must not break the application."""
    rule = SECONDS_OR_NONE if call == "flush" else SECONDS
    if rule.accepts(timeout):
        if timeout is None:
            return None
        # the longest wait a thread or a lock takes (about 292 years): no bound, in effect
        return 0.0 if timeout <= 0 else float(min(timeout, threading.TIMEOUT_MAX))
    if strict:
        check_fields(f"Client.{call}", {"timeout": timeout}, {"timeout": rule})
    level = logging.DEBUG if call in warned else logging.WARNING
    warned.add(call)
    log.log(level, "Client.%s(timeout=...): the timeout must be %s; got %s: using the default, "
            "%g s", call, rule, type_name(timeout), default)
    return default


#: one constraint per argument of :class:`~veil.client.Client` but ``token`` (a secret, checked
#: by :func:`check_token`) and ``state_dir`` (checked with the directory, when it is opened)
CONSTRAINTS: Mapping[str, Any] = {
    "strict": _flag(),
    "debug": _flag(settings.DEBUG_VARIABLE),
    "disabled": _flag(settings.DISABLED_VARIABLE),
    "budget": _cap("no budget"),
    "background": _flag(),
    "batch_size": Interval(int, 0, MAX_BATCH_SIZE, "right"),
    "timeout": Interval(float, 0, 3600, "right"),
    "flush_interval": Interval(float, 0, 86400, "right"),
    "shutdown_timeout": Interval(float, 0, 3600),
    "max_batch_bytes": Interval(int, 0, None, "neither"),
    "backoff_base": Interval(float, 0, 3600, "right"),
    "backoff_cap": Interval(float, 0, 3600, "right"),
    "max_retries": Interval(int, 0, None, "left"),
    "max_outbox": Interval(int, 0, None, "neither"),
    "outbox_policy": OneOf(OUTBOX_POLICIES),
    "max_epsilon_per_report": _cap("no limit"),
    "max_epsilon_per_value": _cap("no limit"),
    "pinned": Rule(
        "None or a mapping of metric names to parameter fingerprints of 16 lowercase hex digits "
        "(registry[name].params.fingerprint), like {'homepage': '4304110a10d8a531'}",
        lambda value: value is None or valid_pins(value),
    ),
    "transport": Rule(
        "a veil.client.Transport, or None for the default RequestsTransport",
        lambda value: value is None or isinstance(value, Transport),
    ),
    "app_name": Rule(
        "None or the application's name, usable as one folder name (no path separators), "
        "like 'myapp'",
        lambda value: value is None or _folder_name(value),
    ),
    "registry": Rule(
        "a Registry, a path to a TOML file, or None (fetch it from the collector)",
        lambda value: value is None or isinstance(value, Registry | str | os.PathLike),
    ),
    "url": Rule(
        f"the collector's base URL, like 'https://veil.example.org', or None (read "
        f"{settings.URL_VARIABLE})",
        lambda value: value is None or _collector_url(value),
    ),
}


def check_token(token: Any, source: str) -> str:
    """``token`` checked (``source`` names where it came from); the message never shows it."""
    if not isinstance(token, str) or not token or "\n" in token:
        raise ParameterError(
            "token",
            f"{source} must be a non-empty string without line breaks (leave it out for "
            "collectors open to uploads)",
        )
    return token


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a client's reports go and its state lives, found when it starts
    (:meth:`ClientOptions.locate`)."""

    url: str
    token: str | None
    state_dir: str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """Every setting of a client, checked (:meth:`checked`); see :class:`~veil.client.Client`
    for what each means. ``url``, ``token`` and ``state_dir`` are the arguments (the client
    completes them from the environment when it starts: :meth:`locate`); ``debug`` and
    ``disabled`` are resolved already; ``registry`` is the one the application gave, loaded
    (``None``: fetch the collector's)."""

    url: str | None
    state_dir: str | os.PathLike[str] | None
    app_name: str | None
    registry: Registry | None
    token: str | None
    budget: float | None
    background: bool
    batch_size: int
    timeout: float
    max_retries: int
    flush_interval: float
    shutdown_timeout: float
    max_batch_bytes: int
    backoff_base: float
    backoff_cap: float
    transport: Transport | None
    max_outbox: int
    outbox_policy: str
    limits: PrivacyLimits
    strict: bool
    debug: bool
    disabled: bool

    @classmethod
    def checked(cls, **arguments: Any) -> ClientOptions:
        """The options from :class:`~veil.client.Client`'s keyword arguments (every one of
        them); the first bad one raises :class:`ParameterError` naming it."""
        if arguments["token"] is not None:
            check_token(arguments["token"], "token")
        check_fields("Client", arguments, CONSTRAINTS)
        given = dict(arguments)
        per_report = given.pop("max_epsilon_per_report")
        per_value = given.pop("max_epsilon_per_value")
        limits = PrivacyLimits(
            max_epsilon_per_report=None if per_report is None else float(per_report),
            max_epsilon_per_value=None if per_value is None else float(per_value),
            pinned=dict(given.pop("pinned") or {}),
        )
        for name in ("timeout", "flush_interval", "shutdown_timeout", "backoff_base",
                     "backoff_cap"):
            given[name] = float(given[name])
        if given["url"] is not None:
            given["url"] = given["url"].rstrip("/")
        given["registry"] = given_registry(given["registry"])
        given["debug"] = settings.flag(given["debug"], settings.DEBUG_VARIABLE)
        given["disabled"] = settings.flag(given["disabled"], settings.DISABLED_VARIABLE)
        return cls(limits=limits, **given)

    @property
    def retry_policy(self) -> RetryPolicy:
        """How uploads retry: ``max_retries``, ``backoff_base`` and ``backoff_cap``."""
        return RetryPolicy(self.max_retries, self.backoff_base, self.backoff_cap)

    @property
    def drop_oldest(self) -> bool:
        """Whether a full outbox drops its oldest report (else the new one)."""
        return self.outbox_policy == "drop-oldest"

    def locate(self) -> Location:
        """Where the client's reports go and its state lives: each argument, else its
        ``VEIL_*`` variable (else no token, and the default state directory of ``app_name``).
        A missing URL or a bad variable raises :class:`ParameterError` naming it; so does a
        missing ``app_name`` when strict."""
        url, token = self._located_url(), self.token
        if token is None:
            found = settings.environment(settings.TOKEN_VARIABLE)
            token = None if found is None else check_token(found, settings.TOKEN_VARIABLE)
        return Location(url, token, self._located_state_dir())

    def _located_url(self) -> str:
        if self.url is not None:
            return self.url
        found = settings.environment(settings.URL_VARIABLE)
        if found is None:
            raise ParameterError(
                "url", f"no collector URL: pass url= or set {settings.URL_VARIABLE}"
            )
        if not _collector_url(found):
            raise ParameterError(
                "url",
                f"{settings.URL_VARIABLE} must be the collector's base URL, like "
                f"'https://veil.example.org'; got {found!r}",
            )
        return found.rstrip("/")

    def _located_state_dir(self) -> str | os.PathLike[str]:
        if self.state_dir is not None:
            return self.state_dir
        found = settings.environment(settings.STATE_DIR_VARIABLE)
        if found is not None:
            return found
        app_name = self.app_name
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
