"""Discovery of the ``veil`` subcommands through the ``veil.commands`` entry points.

A package registers its commands in ``pyproject.toml``::

    [project.entry-points."veil.commands"]
    collector = "veil.server.collector.cli:COMMANDS"

``COMMANDS`` is a list of ``(name, help, configure, run)``: ``configure(parser)``
adds the arguments and ``run(args) -> int`` does the work. Command modules
import their heavy dependencies inside ``run``, so listing them stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "veil.commands"

Command = tuple[
    str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]
]


def iter_commands() -> Iterator[Command]:
    """Every registered command, groups in entry-point name order.

    A group whose module needs an optional dependency that is not installed is skipped.
    """
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            commands = entry_point.load()
        except ModuleNotFoundError as exc:
            if not _optional_module_missing(exc, entry_point):
                raise
            continue
        yield from commands


def _optional_module_missing(exc: ModuleNotFoundError, entry_point: EntryPoint) -> bool:
    """Whether ``exc`` names a dependency outside Veil or the entry point's own module.

    Any other missing ``veil`` module is a bug in an installed package: not hidden.
    """
    missing = exc.name or ""
    own = entry_point.module == missing or entry_point.module.startswith(missing + ".")
    return own or missing.partition(".")[0] != "veil"
