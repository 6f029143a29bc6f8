"""Options that every ``veil`` command spells the same way, with their environment variables.

An option left off the command line takes its environment variable, so a
deployment sets ``VEIL_DB`` or ``VEIL_READ_TOKEN`` once for every command:

=================  ======================  =============================================
option             variable                commands
=================  ======================  =============================================
``--config``       ``VEIL_CONFIG``         serve, metrics, migrate, export, ...
``--db``           ``VEIL_DB``             serve, decode, export, stats, backup, check, ...
``--server``       ``VEIL_URL``            decode, stats
``--token``        ``VEIL_READ_TOKEN``     decode, stats (serve: ``--read-token``)
=================  ======================  =============================================

An empty or blank variable counts as unset. Token variables may hold a
comma-separated list (``serve`` accepts several tokens, for rotation).
"""

from __future__ import annotations

import argparse
import os

from veil.shared.errors import ParameterError

__all__ = [
    "ENVIRONMENT",
    "add_config_option",
    "add_db_option",
    "add_server_options",
    "env_value",
    "token_list",
]

#: each shared option's environment variable
ENVIRONMENT = {
    "config": "VEIL_CONFIG",
    "db": "VEIL_DB",
    "server": "VEIL_URL",
    "token": "VEIL_READ_TOKEN",
    "read_token": "VEIL_READ_TOKEN",
    "upload_token": "VEIL_UPLOAD_TOKEN",
}


def env_value(variable: str) -> str | None:
    """The environment variable's value, or None when it is unset, empty or blank."""
    value = os.environ.get(variable, "").strip()
    return value or None


def _add(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, name: str,
         help_text: str, required: bool) -> None:
    variable = ENVIRONMENT[name]
    default = env_value(variable)
    parser.add_argument(
        flag, dest=name, default=default, required=required and default is None,
        help=f"{help_text} (default: ${variable})",
    )


def add_db_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                  required: bool = True,
                  help_text: str = "the collector's database: a file path or sqlite:///path") -> None:
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


def token_list(given: list[str] | None, variable: str, option: str) -> list[str]:
    """Tokens from repeated ``option`` flags, else from ``variable`` (comma-separated).

    Raises :class:`ParameterError` naming the option when a token is empty or
    blank (``--read-token "$VEIL_READ_TOKEN"`` with the variable unset): a
    collector must never start with a token nobody can present.
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
    return tokens
