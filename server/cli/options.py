"""Options that every ``veil`` command spells the same way, with their environment variables.

An option left off the command line takes its environment variable
(:data:`veil.server.settings.ENVIRONMENT`), so a deployment sets ``VEIL_DB`` or
``VEIL_READ_TOKEN`` once for every command:

======================  ======================  ==================================================
option                  variable                commands
======================  ======================  ==================================================
``--config``            ``VEIL_CONFIG``         serve, metrics, export, aggregate
``--db``                ``VEIL_DB``             serve, export, rebuild-aggregates, backup, check,
                                                migrate, retention, stats, decode, discover,
                                                archive, aggregate
``--server``            ``VEIL_URL``            stats, decode, discover, populate
``--token``             ``VEIL_READ_TOKEN``     stats, decode, discover
``--read-token``        ``VEIL_READ_TOKEN``     serve
``--upload-token``      ``VEIL_UPLOAD_TOKEN``   serve, populate
``--metrics-token``     ``VEIL_METRICS_TOKEN``  serve
``--log-format``        ``VEIL_LOG_FORMAT``     serve
``--log-level``         ``VEIL_LOG_LEVEL``      serve
======================  ======================  ==================================================

An empty or blank variable counts as unset, except the token variables of
``serve`` (:func:`token_list`): these hold comma-separated lists (several
tokens, for rotation), and one that is set but empty or blank, or holds an
empty entry, is refused, so that an emptied ``VEIL_UPLOAD_TOKEN`` cannot open
uploads unnoticed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator

from veil.server.settings import ENVIRONMENT, env_value
from veil.server.tokens import checked_tokens
from veil.shared.errors import ParameterError, VeilError

__all__ = [
    "add_config_option",
    "add_db_option",
    "add_range_options",
    "add_server_options",
    "token_list",
]


def _add(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, name: str,
         help_text: str, required: bool) -> None:
    variable = ENVIRONMENT[name]
    default = env_value(variable)
    action = parser.add_argument(
        flag, dest=name, default=default, required=required and default is None,
        help=f"{help_text} (default: ${variable})",
    )
    # read by CommandParser.error, which names the variable when the option is missing
    action.environment_variable = variable  # type: ignore[attr-defined]


def add_db_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                  required: bool = True,
                  help_text: str = "the collector's database: a file path, sqlite:///path or "
                                   "postgresql://...") -> None:
    """``--db``, defaulting to ``$VEIL_DB``; required when neither is given and ``required``."""
    _add(parser, "--db", "db", help_text, required)


def add_config_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                      required: bool = True,
                      help_text: str = "metric registry TOML file") -> None:
    """``--config``, defaulting to ``$VEIL_CONFIG``."""
    _add(parser, "--config", "config", help_text, required)


def add_server_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--server`` (``$VEIL_URL``) and ``--token`` (``$VEIL_READ_TOKEN``), both optional."""
    _add(parser, "--server", "server", "collector base URL, e.g. https://telemetry.example.org",
         False)
    _add(parser, "--token", "token", "read token for --server", False)


def add_range_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                      metric: bool = True,
                      end_help: str = "last UTC day, YYYY-MM-DD (inclusive)") -> None:
    """``--metric`` (optional: every metric by default; left out without ``metric``, for a
    command that adds its own), ``--start`` and ``--end``: which metric and UTC days a
    command reads."""
    if metric:
        parser.add_argument("--metric", help="only this metric (default: every metric)")
    parser.add_argument("--start", help="first UTC day, YYYY-MM-DD (inclusive)")
    parser.add_argument("--end", help=end_help)


#: tokens shorter than this are warned about (``veil init`` writes 32 hex digits, 128 bits)
MIN_TOKEN_CHARACTERS = 16


def token_list(given: list[str] | None, variable: str, option: str) -> list[str]:
    """Tokens from repeated ``option`` flags, else from ``variable`` (comma-separated).

    Raises :class:`ParameterError` naming the option when a token is empty or
    blank (``--read-token "$VEIL_READ_TOKEN"`` with the variable unset), and so
    when ``variable`` is set but empty: unlike :func:`env_value`, an empty
    variable is not taken as unset; and when a token holds what no ``Authorization:
    Bearer`` header can carry (:func:`~veil.server.tokens.checked_tokens`). A collector
    must never start with a token nobody can present, nor with open uploads because a
    token variable was emptied.
    """
    field = option.lstrip("-").replace("-", "_")
    if given is None:
        raw = os.environ.get(variable)
        if raw is None:
            return []
        values = raw.split(",")
        where = f"${variable}"
    else:
        values = given
        where = option
    tokens = [value.strip() for value in values]
    if any(not token for token in tokens):
        raise ParameterError(
            field,
            f"{where} holds an empty token (an unset shell variable?); give a non-empty token "
            f"(veil init generates some) or leave {option} out",
        )
    try:
        return checked_tokens(tokens, where)
    except VeilError as exc:  # a token no Authorization header can carry
        raise ParameterError(field, str(exc)) from None


def short_token_warning(tokens: list[str], option: str) -> str | None:
    """What to say when ``option`` gave a token shorter than :data:`MIN_TOKEN_CHARACTERS`:
    neither the API nor the dashboard's sign-in slows down wrong guesses, so a short token
    is a guessable one. ``None`` if every token is long enough."""
    short = [token for token in tokens if len(token) < MIN_TOKEN_CHARACTERS]
    if not short:
        return None
    return (f"{option} holds a {len(short[0])}-character token, which can be guessed; use at "
            f"least {MIN_TOKEN_CHARACTERS} random characters (veil init writes 32 hex digits)")


def whole_number(least: int, most: int | None = None, *,
                 shown: str | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``least`` to ``most`` (none: no upper bound),
    whose refusal is a usage error naming the option; ``shown`` says the range in words."""
    if shown is None:
        shown = f"at least {least}" if most is None else f"from {least} to {most}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number; got {text[:40]!r}") from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"must be {shown}; got {text[:40]}")
        return value

    return parse


def output_directory(text: str) -> str:
    """An argparse type: a directory to write into, never the empty path (which names the
    current directory, where a run then wrote its files)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("names no directory; give one, such as results/")
    return text


#: a ``--port``: 0 (any free port) to 65535 (a server library would take a larger one
#: modulo 65536, or fail with a traceback)
port_number = whole_number(0, 65535, shown="0 (any free port) to 65535")
#: the most worker processes or threads a command starts on this machine
MAX_WORKERS = 256
#: a ``--workers`` of processes or threads on this machine: 1 to :data:`MAX_WORKERS` (a
#: larger one would start that many before anything failed)
worker_count = whole_number(1, MAX_WORKERS)
#: the most threads per process a server command starts (and at most MAX_WORKERS processes:
#: each worker is a process of its own, so a mistyped count would fork until the machine
#: gives out)
MAX_THREADS = 1024
#: a ``--threads`` of a server process: 1 to :data:`MAX_THREADS`
thread_count = whole_number(1, MAX_THREADS)


@contextlib.contextmanager
def print_log(name: str, prefix: str) -> Iterator[None]:
    """Print the records of logger ``name`` from INFO up to stdout while the block runs."""
    logger = logging.getLogger(name)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
