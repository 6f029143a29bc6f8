"""The client's settings that may come from the environment, and where its state lives by default.

Explicit arguments win; an argument left at ``None`` is read from its
environment variable, so an application can be configured (or switched off)
where it runs without a code change:

=====================  ====================================================================
``VEIL_URL``           the collector's base URL (``url``)
``VEIL_UPLOAD_TOKEN``  the bearer token for uploads (``token``)
``VEIL_STATE_DIR``     the state directory (``state_dir``)
``VEIL_DISABLED``      ``disabled=True``, unless empty, ``0``, ``false``, ``no`` or ``off``
``VEIL_DEBUG``         the same for ``debug=True``
=====================  ====================================================================

Without ``state_dir``, the state lives in a ``veil`` folder of the platform's
per-user state directory for the application (``platformdirs.user_state_dir``):
``~/.local/state/<app_name>/veil`` on Linux, ``~/Library/Application
Support/<app_name>/veil`` on macOS, ``%LOCALAPPDATA%\\<app_name>\\veil`` on Windows.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

URL_VARIABLE = "VEIL_URL"
TOKEN_VARIABLE = "VEIL_UPLOAD_TOKEN"
STATE_DIR_VARIABLE = "VEIL_STATE_DIR"
DISABLED_VARIABLE = "VEIL_DISABLED"
DEBUG_VARIABLE = "VEIL_DEBUG"

#: the application name used when the application gives neither ``app_name`` nor ``state_dir``
DEFAULT_APP_NAME = "veil"

_FALSE = frozenset({"", "0", "false", "no", "off"})


def environment(variable: str) -> str | None:
    """The environment variable's value, or ``None`` if it is unset or empty."""
    return os.environ.get(variable) or None


def flag(argument: bool | None, variable: str) -> bool:
    """A yes/no setting: ``argument`` (``True``, ``False``), or when it is ``None`` the variable
    (anything but unset, empty, ``0``, ``false``, ``no`` or ``off`` means yes)."""
    if argument is None:
        return os.environ.get(variable, "").strip().lower() not in _FALSE
    return argument


def default_state_dir(app_name: str) -> Path:
    """Where an installation of ``app_name`` keeps Veil's state by default: ``veil`` in the
    application's per-user state directory."""
    return Path(platformdirs.user_state_dir(app_name, appauthor=False)) / "veil"
