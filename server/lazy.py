"""Lazy public names for a package: each name's module is imported on first use.

A package lists ``{name: module}`` and sets its module-level ``__getattr__``
(PEP 562) from :func:`lazy_getattr`, so importing the package stays cheap (the
``veil`` command imports packages to list their subcommands without Flask,
NumPy or SciPy)::

    _EXPORTS = {"create_app": "veil.server.collector.app"}
    __all__ = sorted(_EXPORTS)
    __getattr__ = lazy_getattr(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that loads ``exports[name]`` and returns
    its ``name``; :class:`AttributeError` for any name not in ``exports``.

    It also gives the package a ``__dir__`` (PEP 562) that lists the lazy names beside
    those already defined, so ``dir(package)`` and tab completion show them.
    """
    module = sys.modules[package]

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(exports))

    module.__dir__ = __dir__  # type: ignore[method-assign]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
