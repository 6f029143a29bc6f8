"""Settings a deployment gives every part of the server through the environment.

:data:`ENVIRONMENT` names each setting's variable (by the ``dest`` of the ``veil``
option that overrides it), and :func:`env_value` reads one. The command line
(:mod:`veil.server.cli.options`), the collector's set-up and the analysis read them
here, so a library module never depends on the command line to find ``$VEIL_READ_TOKEN``.
"""

from __future__ import annotations

import os

__all__ = ["ENVIRONMENT", "env_value"]

#: each setting's environment variable, by the ``dest`` of its ``veil`` option
ENVIRONMENT = {
    "config": "VEIL_CONFIG",
    "db": "VEIL_DB",
    "server": "VEIL_URL",
    "token": "VEIL_READ_TOKEN",
    "read_token": "VEIL_READ_TOKEN",
    "upload_token": "VEIL_UPLOAD_TOKEN",
    "metrics_token": "VEIL_METRICS_TOKEN",
    "log_format": "VEIL_LOG_FORMAT",
    "log_level": "VEIL_LOG_LEVEL",
}


def env_value(variable: str) -> str | None:
    """The environment variable's value, or None when it is unset, empty or blank."""
    value = os.environ.get(variable, "").strip()
    return value or None
