"""The ``veil`` command line.

Each package registers its group of subcommands under the ``veil.commands``
entry points (see :mod:`veil.server.cli.commands`), so this package imports
no other package's command module by name.
"""

from __future__ import annotations

import argparse
import sys

from veil.server.cli.commands import iter_commands
from veil.server.cli.errors import EXIT_USAGE, CommandParser, run_command
from veil.shared.version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> CommandParser:
    """The argument parser with every available subcommand (each a :class:`CommandParser`)."""
    parser = CommandParser(
        prog="veil",
        description="Local-differential-privacy telemetry: encode on the device, collect, decode.",
    )
    parser.add_argument("--version", action="version", version=f"veil {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, configure, run in iter_commands():
        command = sub.add_parser(name, help=help_text, description=help_text)
        configure(command)
        command.set_defaults(run=run, command_parser=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``veil`` console script: 0 done, 1 failed, 2 usage error
    (:mod:`veil.server.cli.errors`)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command: argparse.ArgumentParser = getattr(args, "command_parser", parser)
    if unknown:
        # argparse would report them as the top-level parser's ("veil: error:")
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return run_command(args.command, args.run, args)
