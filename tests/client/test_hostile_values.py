"""Values that break when they are looked at, values that must not be shown, and timeouts that
mean "do not wait".

* **Hostile values.** A value whose ``__repr__`` raises, a list nested too deep to print, a
  ``str`` whose hash or encoding raises: ``report()`` drops and counts it
  (``invalid_value``) by default, raises a :class:`ParameterError` naming the metric with
  ``strict=True``, and a value that waited for the registry breaks neither the thread that
  fetched it nor the values that waited with it.
* **No raw value in a message.** A drop's log lines and a strict error name the metric, the
  variable and the type, never the value (the docs promise raw values are never written).
* **Real numbers and NumPy booleans** are values of number and boolean metrics (and of a
  joint metric's variables); the client imports no NumPy to accept them.
* **``flush(0)`` and ``close(0)``** use no network; a timeout that is no number is the default
  with one WARNING (``strict=True``: a ``ParameterError``).
"""

from __future__ import annotations

import decimal
import logging
import math
import threading
import time
from fractions import Fraction

import numpy as np
import pytest

from tests.client.conftest import HeldFetchTransport
from tests.conftest import TEST_REGISTRY_TOML
from veil.client import Client, ParameterError, UnknownMetricError
from veil.shared.registry import Registry

REGISTRY = Registry.from_toml(
    TEST_REGISTRY_TOML
    + '\n[metrics.crash_by_browser]\nkind = "joint"\nmin_reports = 1\n'
      'of = ["browser", "crashed", "load"]\n'
      'domains = [["firefox", "chrome", "safari"], "boolean", [0.0, 1.0, 10.0]]\n'
)
CANARY = "canary-7f3a"
QUICK = 0.5


class BadRepr:
    """A value whose ``repr()`` raises."""

    def __repr__(self) -> str:
        raise RuntimeError(f"boom {CANARY}")


class HashBomb(str):
    """A string whose hash raises (a dict lookup of it fails)."""

    def __hash__(self) -> int:
        raise RuntimeError(f"boom {CANARY}")


class EncodeBomb(str):
    """A string whose UTF-8 encoding raises."""

    def encode(self, *args: object, **kwargs: object) -> bytes:
        raise RuntimeError(f"boom {CANARY}")


def deep_list(depth: int = 100_000) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def hostile_reports() -> list[tuple[str, object]]:
    """One report per (metric, hostile value), for every kind of metric."""
    reports: list[tuple[str, object]] = []
    for metric in ("homepage", "browser", "dark_mode", "load_time", "crash_by_browser"):
        reports += [(metric, BadRepr()), (metric, deep_list())]
    for metric in ("browser", "dark_mode", "load_time", "crash_by_browser"):
        reports.append((metric, HashBomb(CANARY)))  # a valid string for "homepage"
    reports += [("homepage", EncodeBomb(CANARY)), ("crash_by_browser", (BadRepr(), True, 1.0)),
                ("crash_by_browser", {"browser": HashBomb("x"), "crashed": True, "load": 1.0}),
                ("crash_by_browser", {BadRepr(): 1, "browser": "chrome", "crashed": True,
                                      "load": 1.0})]
    return reports


@pytest.fixture
def thread_failures(monkeypatch: pytest.MonkeyPatch) -> list[threading.ExceptHookArgs]:
    """What reaches ``threading.excepthook`` during the test."""
    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    return failures


@pytest.fixture
def strict_client(tmp_path, offline_url):
    """A strict client of :data:`REGISTRY` (no network: the registry is given)."""
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY, strict=True)
    yield client
    client.close(timeout=1)


# ---------------------------------------------------------------- hostile values


def test_a_value_that_breaks_while_it_waits_for_the_registry_is_dropped_alone(
    live_collector, tmp_path, thread_failures, caplog
):
    """A bad value among those waiting for the registry killed the ``veil-registry`` thread:
    the values queued after it were never sent and never counted."""
    transport = HeldFetchTransport()
    client = Client(live_collector.url, tmp_path / "state", transport=transport)
    client.report("homepage", "a")
    client.report("browser", BadRepr())
    client.report("browser", deep_list())
    client.report("browser", HashBomb("firefox"))
    client.report("homepage", EncodeBomb("b"))
    client.report("dark_mode", True)
    assert client.pending == 6 and client.registry is None  # all of them wait
    transport.release.set()
    with caplog.at_level(logging.DEBUG, logger="veil.client"):
        result = client.flush(timeout=10)
    assert result.ok, result.error
    assert (result.sent, result.accepted, result.remaining) == (2, 2, 0)
    assert client.drops["invalid_value"] == 4 and client.dropped == 4
    assert thread_failures == []
    assert not [r for r in caplog.records if r.exc_info]  # no traceback in the host's log
    assert CANARY not in caplog.text
    client.close()
    assert live_collector.counts("dark_mode")["reports"] == 1


def test_report_drops_a_hostile_value_instead_of_raising(tmp_path, offline_url, caplog):
    reports = hostile_reports()
    with caplog.at_level(logging.DEBUG, logger="veil.client"), \
            Client(offline_url, tmp_path / "state", registry=REGISTRY) as client:
        for metric, value in reports:
            client.report(metric, value)
        assert client.pending == 0
        assert client.drops["invalid_value"] == len(reports) == client.dropped
    assert CANARY not in caplog.text


def ids(cases: list[tuple]) -> list[str]:
    return [f"{case[0]}-{index}" for index, case in enumerate(cases)]


@pytest.mark.parametrize(("metric", "value"), hostile_reports(), ids=ids(hostile_reports()))
def test_strict_raises_a_parameter_error_naming_the_metric(strict_client, metric, value):
    with pytest.raises(ParameterError, match=f"^metric '{metric}': value ") as raised:
        strict_client.report(metric, value)
    assert CANARY not in str(raised.value)
    assert raised.value.field == "value"
    cause = raised.value.__cause__
    assert cause is None or isinstance(cause, RuntimeError | RecursionError)
    assert strict_client.pending == 0


def test_a_metric_name_that_breaks_is_dropped_or_named_by_its_type(tmp_path, offline_url):
    with Client(offline_url, tmp_path / "state", registry=REGISTRY) as client:
        client.report(HashBomb("homepage"), "example.com")
        client.report(BadRepr(), "example.com")
        assert (client.drops["invalid_value"], client.drops["unknown_metric"]) == (1, 1)
    with Client(offline_url, tmp_path / "state", registry=REGISTRY, strict=True) as client:
        with pytest.raises(UnknownMetricError, match="BadRepr") as raised:
            client.report(BadRepr(), "example.com")
        assert CANARY not in str(raised.value)
        with pytest.raises(ParameterError) as raised:
            client.report(HashBomb("homepage"), "example.com")
        assert CANARY not in str(raised.value)


def test_keyboard_interrupt_is_not_swallowed(tmp_path, offline_url):
    class Interrupting(str):
        def __hash__(self) -> int:
            raise KeyboardInterrupt

    client = Client(offline_url, tmp_path / "state", registry=REGISTRY)
    with pytest.raises(KeyboardInterrupt):
        client.report("browser", Interrupting("chrome"))
    client.close()


# ---------------------------------------------------------------- no raw value in a message

SECRET_VALUES = [
    ("browser", f"{CANARY}-opera"),
    ("browser", CANARY * 1_000_000),  # 11 MB: logged whole, it flooded the log
    ("crash_by_browser", (f"{CANARY}-firefox", True, "oops")),
    ("crash_by_browser", (f"{CANARY}-firefox", True)),
    ("crash_by_browser", {"browser": f"{CANARY}-opera", "crashed": True, "load": 1.0}),
    ("crash_by_browser", {"browser": "chrome", "crashed": CANARY, "load": 1.0}),
    ("crash_by_browser", {"browser": "chrome", "crashed": True, "load": CANARY}),
    ("crash_by_browser", {"browser": "chrome", "crashed": True, "load": 1.0, CANARY: 1}),
    ("crash_by_browser", {"browser": "chrome", CANARY: True}),
    ("crash_by_browser", f"{CANARY}-chrome"),
    ("homepage", [CANARY]),
    ("dark_mode", CANARY),
    ("load_time", CANARY),
    ("load_time", decimal.Decimal("NaN")),
]


def test_drop_messages_name_the_variable_and_the_type_never_the_value(
    tmp_path, offline_url, caplog
):
    """``value ('firefox', True, 'oops') must be a dict of ...``, an unlisted category, an
    unknown dict key and a 10 MB string were logged whole."""
    with caplog.at_level(logging.DEBUG, logger="veil.client"), \
            Client(offline_url, tmp_path / "state", registry=REGISTRY, debug=True) as client:
        for metric, value in SECRET_VALUES:
            client.report(metric, value)
        assert client.drops["invalid_value"] == len(SECRET_VALUES)
    assert CANARY not in caplog.text
    assert max(len(record.getMessage()) for record in caplog.records) < 1_000
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped")]
    assert len(lines) == len(SECRET_VALUES)
    assert "metric 'browser': value is not one of the 4 categories ('firefox', 'chrome', " \
           "'safari', 'other')" in lines[0]
    assert "value browser is not one of its 3 values ('firefox', 'chrome', 'safari')" in lines[4]
    assert "value crashed must be True or False; got str" in lines[5]
    assert "value load must be a number; got str" in lines[6]
    assert "value has 1 key that names no variable" in lines[7]
    assert "value misses 'crashed', 'load' and has 1 key that names no variable" in lines[8]
    assert "value must be a dict of 'browser', 'crashed', 'load' (or a tuple of their values " \
           "in that order); got tuple of 2 values" in lines[3]


@pytest.mark.parametrize(("metric", "value"), SECRET_VALUES, ids=ids(SECRET_VALUES))
def test_strict_errors_name_the_type_never_the_value(strict_client, metric, value):
    with pytest.raises(ParameterError, match=f"^metric '{metric}': value ") as raised:
        strict_client.report(metric, value)
    assert CANARY not in str(raised.value) and len(str(raised.value)) < 1_000
    assert CANARY not in raised.value.field


# ---------------------------------------------------------------- real numbers, NumPy booleans


def test_numpy_booleans_and_decimals_are_values(tmp_path, offline_url, recording_transport):
    with Client(offline_url, tmp_path / "state", registry=REGISTRY, strict=True,
                transport=recording_transport) as client:
        client.report("dark_mode", np.bool_(True))
        client.report("dark_mode", np.True_ == np.True_)
        client.report("load_time", decimal.Decimal("3.25"))
        client.report("load_time", decimal.Decimal("1e999999"))  # finite: clipped to high
        client.report("load_time", Fraction(7, 2))
        client.report("crash_by_browser", ("chrome", np.bool_(False), decimal.Decimal("2.5")))
        client.report("crash_by_browser", ("chrome", False, np.int64(3)))
        client.report("crash_by_browser", ("chrome", False, 10**400))  # clipped to the last
        assert client.pending == 8
        assert client.flush().accepted == 8


REFUSED_TYPES = [
    ("dark_mode", np.float64(1.0), "must be True or False; got numpy.float64"),
    ("dark_mode", 1, "must be True or False; got int"),
    ("load_time", np.bool_(True), f"must be a number; got numpy.{type(np.bool_(True)).__name__}"),
    ("load_time", decimal.Decimal("Infinity"), "must be a finite number; got inf"),
    ("load_time", decimal.Decimal("sNaN"), "must be a finite number; got nan"),
    ("load_time", decimal.Decimal("-Infinity"), "must be a finite number; got -inf"),
    ("homepage", BadRepr(), "must be a str; got tests.client.test_hostile_values.BadRepr"),
    ("crash_by_browser", ("chrome", np.float64(1.0), 1.0),
     "crashed must be True or False; got numpy.float64"),
    ("crash_by_browser", ("chrome", True, decimal.Decimal("NaN")),
     "load must be a finite number; got nan"),
]


@pytest.mark.parametrize(("metric", "value", "message"), REFUSED_TYPES, ids=ids(REFUSED_TYPES))
def test_a_refused_type_is_named_by_its_module_and_name(strict_client, metric, value, message):
    with pytest.raises(ParameterError, match=f"value {message}$"):
        strict_client.report(metric, value)


# ---------------------------------------------------------------- flush(0) and close(0)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("timeout", [0, -1, 0.0, -float("inf")])
def test_a_timeout_of_zero_or_less_uses_no_network(tmp_path, silent_url, caplog, strict,
                                                   timeout):
    """``flush(0)`` and ``close(0)`` raised ParameterError, even by default, and ``close()``
    sits in ``finally`` blocks."""
    state = tmp_path / "state"
    client = Client(silent_url, state, registry=REGISTRY, strict=strict)
    client.report("dark_mode", True)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="veil.client"):
        flushed = client.flush(timeout)
        closed = client.close(timeout)
    assert time.monotonic() - started < QUICK
    assert (flushed.sent, flushed.remaining) == (0, 1)
    assert flushed.error == "1 report not uploaded: a timeout of 0 or less uses no network"
    assert (closed.sent, closed.remaining, closed.dropped) == (0, 1, 0)
    assert "kept for the next start" in closed.error
    assert not caplog.records
    with Client(silent_url, state, registry=REGISTRY) as again:
        assert again.pending == 1
        again.close(0)


def test_close_without_network_closes_a_background_client_too(tmp_path, silent_url):
    """The idle uploader thread ends at once: ``close(0)`` returned ``None`` (as if an upload
    outlived it) and left the state database open."""
    state = tmp_path / "state"
    client = Client(silent_url, state, registry=REGISTRY, background=True, flush_interval=60)
    client.report("dark_mode", True)
    started = time.monotonic()
    result = client.close(0)
    assert time.monotonic() - started < QUICK
    assert result is not None and (result.sent, result.remaining) == (0, 1)
    with Client(silent_url, state, registry=REGISTRY) as again:
        assert again.pending == 1
        again.close(0)


@pytest.mark.parametrize("timeout", [math.inf, 10**400, 1e300], ids=["inf", "10**400", "1e300"])
def test_a_timeout_beyond_what_a_thread_waits_is_no_bound(tmp_path, offline_url,
                                                         recording_transport, timeout):
    """``close(math.inf)`` raised OverflowError from ``Thread.join`` into the application."""
    client = Client(offline_url, tmp_path / "state", registry=REGISTRY, background=True,
                    flush_interval=60, transport=recording_transport)
    client.report("dark_mode", True)
    assert client.flush(timeout).accepted == 1
    client.report("dark_mode", True)
    assert client.close(timeout).accepted == 1


def test_close_without_network_drops_the_values_waiting_for_the_registry(tmp_path, silent_url):
    client = Client(silent_url, tmp_path / "state")
    client.report("dark_mode", True)
    started = time.monotonic()
    result = client.close(0)
    assert time.monotonic() - started < QUICK
    assert (result.remaining, result.dropped) == (0, 1)
    assert client.drops["no_registry"] == 1


@pytest.mark.parametrize("timeout", ["x", float("nan"), True, [1]])
def test_a_timeout_that_is_no_number_is_the_default_with_one_warning(
    tmp_path, offline_url, recording_transport, caplog, timeout
):
    with Client(offline_url, tmp_path / "state", registry=REGISTRY,
                transport=recording_transport) as client:
        client.report("dark_mode", True)
        with caplog.at_level(logging.WARNING, logger="veil.client"):
            assert client.flush(timeout).accepted == 1
            client.report("dark_mode", True)
            assert client.close(timeout).accepted == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("Client.flush(timeout=...): the timeout must be a number of "
                                  "seconds")
    assert "using the default, 2 s" in warnings[0]
    assert warnings[1].startswith("Client.close(timeout=...)")
    assert "using the default, 1 s" in warnings[1]


@pytest.mark.parametrize("call", ["flush", "close"])
@pytest.mark.parametrize("timeout", ["x", float("nan"), True])
def test_strict_refuses_a_timeout_that_is_no_number(strict_client, call, timeout):
    with pytest.raises(ParameterError, match=rf"^The 'timeout' parameter of Client\.{call} "
                       r"must be a number of seconds \(0 or less: no waiting\)"):
        getattr(strict_client, call)(timeout)


# ---------------------------------------------------------------- the unknown metric's line


def test_the_unknown_metric_warning_ends_its_sentence_once(tmp_path, offline_url, caplog):
    with caplog.at_level(logging.WARNING, logger="veil.client"), \
            Client(offline_url, tmp_path / "state", registry=REGISTRY) as client:
        client.report("homepgae", "example.com")
    [line] = [r.getMessage() for r in caplog.records]
    assert "fix the name. Further drops of this kind" in line and ".." not in line
