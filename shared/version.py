"""Veil's version, read from the installed distribution's metadata.

``veil`` itself is a namespace package (the four top-level folders are mapped into it), so
it has no module of its own to hold a ``__version__``: the version lives here, beside the
contract everything imports, and is typed once, in pyproject.toml.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]


def _installed_version() -> str:
    """The version of the installed ``veil`` distribution; ``"unknown"`` when the folders are
    imported without being installed (for example from a bare checkout on ``PYTHONPATH``)."""
    try:
        return version("veil")
    except PackageNotFoundError:
        return "unknown"


__version__: str = _installed_version()
