"""The ``veil`` command line.

Each package registers its group of subcommands under the ``veil.commands``
entry points (see :mod:`veil.server.cli.commands`), so this package imports
no other package's command module by name.
"""

from __future__ import annotations

import argparse
import os
import sys

from veil.server.cli.commands import iter_commands
from veil.shared.errors import VeilError
from veil.shared.version import __version__

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="veil",
        description="Local-differential-privacy telemetry: encode on the device, collect, decode.",
    )
    parser.add_argument("--version", action="version", version=f"veil {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, configure, run in iter_commands():
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
    except BrokenPipeError:
        # whoever read the output stopped early (veil stats | head): not a failure of the
        # command; point stdout at /dev/null so that the interpreter's final flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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
