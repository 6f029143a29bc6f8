"""Bad input to every public entry point gives the documented error, and nothing is queued.

These clients are ``strict=True``, which raises; by default ``report()`` drops,
counts and logs instead (``tests/client/test_failure_behaviour.py``).
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.client import (
    BudgetExceededError,
    Client,
    ClientClosedError,
    ParameterError,
    RegistryUnavailableError,
    StateError,
    UnknownMetricError,
    VeilError,
)
from veil.client.options import CONSTRAINTS


@pytest.fixture
def client(tmp_path, test_registry, offline_url):
    client = Client(offline_url, tmp_path / "state", registry=test_registry, strict=True)
    yield client
    client.close(timeout=1)


BAD_VALUES = [
    ("homepage", 42, "str"),
    ("homepage", b"example.com", "str"),
    ("homepage", "\udc80", "UTF-8"),
    ("browser", "netscape", "is not one of the 4 categories"),
    ("browser", 1, "must be a str, one of the 4 categories .*; got int"),
    ("dark_mode", "yes", "True or False"),
    ("dark_mode", 1, "True or False"),
    ("load_time", "3.5", "number"),
    ("load_time", True, "number"),
    ("load_time", math.nan, "finite"),
    ("load_time", math.inf, "finite"),
    ("load_time", None, "number"),
]


@pytest.mark.parametrize(("metric", "value", "message"), BAD_VALUES)
def test_bad_values_are_refused_and_nothing_is_queued(client, metric, value, message):
    with pytest.raises(ParameterError, match=message) as raised:
        client.report(metric, value)
    assert raised.value.field == "value"
    assert f"metric {metric!r}: value" in str(raised.value)
    assert client.pending == 0
    assert client.privacy_spent().total == 0.0


@pytest.mark.parametrize("name", ["homepgae", "", None, 3])
def test_unknown_metric_names_the_known_ones(client, name):
    with pytest.raises(UnknownMetricError, match="homepage") as raised:
        client.report(name, "example.com")
    assert isinstance(raised.value, VeilError) and isinstance(raised.value, KeyError)
    assert raised.value.field == "metric"
    assert client.pending == 0


BAD_ARGUMENTS = [
    ({"url": "ftp://collector"}, "url"),
    ({"url": "collector.example.org"}, "url"),
    ({"url": 8080}, "url"),
    ({"registry": 42}, "registry"),
    ({"token": ""}, "token"),
    ({"token": 123}, "token"),
    ({"token": "upload\nsecret"}, "token"),
    ({"budget": 0}, "budget"),
    ({"budget": -1.0}, "budget"),
    ({"budget": "5"}, "budget"),
    ({"budget": math.nan}, "budget"),
    ({"background": "yes"}, "background"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"batch_size": 10**6}, "batch_size"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": math.inf}, "timeout"),
    ({"timeout": None}, "timeout"),
    ({"max_retries": -1}, "max_retries"),
    ({"max_retries": True}, "max_retries"),
    ({"flush_interval": 0}, "flush_interval"),
    ({"max_batch_bytes": 0}, "max_batch_bytes"),
    ({"backoff_base": -1}, "backoff_base"),
    ({"backoff_cap": 0}, "backoff_cap"),
    ({"transport": "https"}, "transport"),
    ({"outbox_policy": "drop-random"}, "outbox_policy"),
    ({"app_name": "my/app"}, "app_name"),
    ({"app_name": ""}, "app_name"),
    ({"strict": "yes"}, "strict"),
    ({"debug": 1}, "debug"),
    ({"disabled": "no"}, "disabled"),
    ({"max_outbox": 0}, "max_outbox"),
    ({"max_outbox": 1.5}, "max_outbox"),
    ({"max_epsilon_per_value": 0}, "max_epsilon_per_value"),
    ({"max_epsilon_per_value": math.nan}, "max_epsilon_per_value"),
    ({"max_epsilon_per_value": "10"}, "max_epsilon_per_value"),
    ({"max_epsilon_per_report": -1.0}, "max_epsilon_per_report"),
    ({"pinned": "homepage"}, "pinned"),
    ({"pinned": {"homepage": "not-a-fingerprint"}}, "pinned"),
    ({"pinned": {"homepage": "4304110A10D8A531"}}, "pinned"),
]


@pytest.mark.parametrize(("arguments", "field"), BAD_ARGUMENTS)
def test_bad_constructor_arguments_name_the_argument(tmp_path, test_registry, offline_url,
                                                     arguments, field):
    options = {"url": offline_url, "registry": test_registry, **arguments}
    url = options.pop("url")
    with pytest.raises(ParameterError, match=field) as raised:
        Client(url, tmp_path / "state", **options)
    assert raised.value.field == field


@pytest.mark.parametrize(("arguments", "field"), BAD_ARGUMENTS)
def test_a_bad_argument_is_named_with_its_rule_and_value_in_one_form(
    tmp_path, test_registry, offline_url, arguments, field
):
    """Every argument is checked against one table, as the metric parameters are, so every
    message reads the same: the argument, what it must be, what it got (the token excepted: a
    secret is never shown). Each check was written by hand before, each message its own."""
    options = {"url": offline_url, "registry": test_registry, **arguments}
    url = options.pop("url")
    with pytest.raises(ParameterError) as raised:
        Client(url, tmp_path / "state", **options)
    message = str(raised.value)
    if field == "token":
        assert message.startswith("token must be ")
        assert repr(arguments["token"]) not in message
    else:
        assert message.startswith(f"The {field!r} parameter of Client must be "), message
        assert message.endswith(f" Got {arguments[field]!r} instead."), message
    assert not (tmp_path / "state").exists()  # nothing was created for a rejected client


def test_every_argument_of_the_constructor_has_a_rule():
    """A new keyword argument cannot skip the check: the table names every one of them but
    ``state_dir`` (checked with the directory) and ``token`` (checked apart: a secret)."""
    arguments = set(inspect.signature(Client).parameters) - {"state_dir", "token"}
    assert arguments == set(CONSTRAINTS)


def test_flush_and_close_timeouts_are_named_in_the_same_form(client):
    with pytest.raises(ParameterError, match=r"^The 'timeout' parameter of Client\.flush must "
                       r"be a number of seconds \(0 or less: no waiting\), or None \(no "
                       r"bound\)\. Got '2' instead\.$"):
        client.flush(timeout="2")
    with pytest.raises(ParameterError, match=r"^The 'timeout' parameter of Client\.close must "
                       r"be .+\. Got None instead\.$"):
        client.close(timeout=None)


def test_registry_file_problems_are_parameter_errors(tmp_path, offline_url):
    with pytest.raises(ParameterError, match="cannot read registry file"):
        Client(offline_url, tmp_path / "state", registry=tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[metrics.homepage\nkind = 'string'")
    with pytest.raises(ParameterError, match="not valid TOML"):
        Client(offline_url, tmp_path / "state", registry=broken)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[metrics.homepage]\nkind = 'string'\nk = 0\n")
    with pytest.raises(ParameterError, match="'k' parameter"):
        Client(offline_url, tmp_path / "state", registry=wrong)


def test_no_registry_anywhere_is_a_clear_error(tmp_path, offline_url):
    with pytest.raises(RegistryUnavailableError, match="no cached copy"):
        Client(offline_url, tmp_path / "state", strict=True)


@pytest.mark.parametrize("state_dir", ["", 42])
def test_a_bad_state_dir_disables_the_client_or_raises_when_strict(state_dir, test_registry,
                                                                  offline_url):
    """``state_dir`` is checked with the directory it names, when the client opens it."""
    assert Client(offline_url, state_dir, registry=test_registry).disabled
    with pytest.raises(StateError, match="state_dir"):
        Client(offline_url, state_dir, registry=test_registry, strict=True)


def test_flush_and_close_timeouts_are_checked(client):
    """Numbers up to 0 mean "no waiting", even with ``strict``; what is no number raises."""
    with pytest.raises(ParameterError, match="timeout"):
        client.flush(timeout=math.nan)
    with pytest.raises(ParameterError, match="timeout"):
        client.close(timeout="0")


def test_a_closed_client_refuses_work(client):
    client.close(timeout=1)
    for call in (lambda: client.report("dark_mode", True), client.flush, client.privacy_spent,
                 lambda: client.pending):
        with pytest.raises(ClientClosedError, match="closed"):
            call()
    assert client.close() is None  # closing twice is harmless


def test_every_error_class_is_a_veil_error():
    for error in (BudgetExceededError, ClientClosedError, RegistryUnavailableError, StateError,
                  UnknownMetricError, ParameterError):
        assert issubclass(error, VeilError)


def test_huge_integers_are_clipped_like_other_numbers(client):
    client.report("load_time", 10**400)
    client.report("load_time", -(10**400))
    assert client.pending == 2


def test_any_real_number_type_is_accepted(client):
    client.report("load_time", Fraction(7, 2))
    client.report("load_time", np.float32(2.5))
    client.report("load_time", np.int64(3))
    assert client.pending == 3


def test_any_text_is_queued_or_refused_cleanly(tmp_path, test_registry, offline_url):
    """Arbitrary strings (lone surrogates, NULs, huge ones) never crash report()."""
    client = Client(offline_url, tmp_path / "state", registry=test_registry, strict=True)

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.text(max_size=300) | st.text(alphabet=st.characters(), min_size=1000, max_size=3000))
    def check(value: str) -> None:
        before = client.pending
        try:
            client.report("homepage", value)
        except ParameterError as error:
            assert error.field == "value"
            assert client.pending == before
        else:
            assert client.pending == before + 1

    check()
    client.close(timeout=1)
