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
from typing import Any

import platformdirs

from veil.shared.errors import ParameterError

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


def flag(name: str, argument: Any, variable: str) -> bool:
    """A yes/no setting: ``argument`` (``True``, ``False``), or when it is ``None`` the variable
    (anything but unset, empty, ``0``, ``false``, ``no`` or ``off`` means yes)."""
    if argument is None:
        return os.environ.get(variable, "").strip().lower() not in _FALSE
    if not isinstance(argument, bool):
        raise ParameterError(
            name, f"{name} must be True, False or None (read {variable}); got {argument!r}"
        )
    return argument


def check_app_name(app_name: Any) -> None:
    """Raise :class:`ParameterError` unless ``app_name`` is usable as one folder name."""
    if (not isinstance(app_name, str) or not app_name.strip() or app_name in (".", "..")
            or "/" in app_name or os.sep in app_name):
        raise ParameterError(
            "app_name",
            f"app_name must be the application's name, usable as one folder name (no path "
            f"separators), like 'myapp'; got {app_name!r}",
        )


def default_state_dir(app_name: str) -> Path:
    """Where an installation of ``app_name`` keeps Veil's state by default: ``veil`` in the
    application's per-user state directory."""
    return Path(platformdirs.user_state_dir(app_name, appauthor=False)) / "veil"
