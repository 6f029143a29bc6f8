"""The ``veil`` command line.

Each group of subcommands lives in its own module, which exposes
``COMMANDS``: a list of ``(name, help, configure, run)`` where
``configure(parser)`` adds arguments and ``run(args) -> int`` does the work.
Command modules import their heavy dependencies inside ``run``, so
``veil --help`` works with the light client install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from veil.shared.errors import VeilError

COMMAND_MODULES = (
    "veil.simulations.cli",
    "veil.server.collector_cli",
    "veil.server.analysis.cli",
)


def _version() -> str:
    try:
        return version("veil")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="veil",
        description="Local-differential-privacy telemetry: encode on the device, collect, decode.",
    )
    parser.add_argument("--version", action="version", version=f"veil {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        for name, help_text, configure, run in module.COMMANDS:
            command = sub.add_parser(name, help=help_text, description=help_text)
            configure(command)
            command.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``veil`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return int(args.run(args) or 0)
    except VeilError as exc:
        print(f"veil {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(
            f"veil {args.command}: error: the optional dependency {exc.name!r} is missing; "
            "install it with: pip install 'veil[all]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
