"""One voice for every ``veil`` subcommand's failures: exit codes and one-line errors.

Every subcommand, whichever package registers it, runs through :func:`run_command`
and parses its arguments with :class:`CommandParser`, so it gets the same shape
without doing anything:

- exit code 0 when the command did its work, 1 when the operation failed (a
  collector that does not answer, a database that refuses the connection, a file
  that cannot be written), 2 for a usage error (an unknown option, a missing or
  invalid argument, an input that the command cannot use: nothing was done);
- one line on standard error, ``veil <command>: error: <cause>; <fix>``, never a
  traceback nor a library's own wording for an error Veil expects.

A :class:`~veil.shared.errors.ParameterError` is a usage error (it names a field the
person gave); any other :class:`~veil.shared.errors.VeilError` and an ``OSError`` are
failed operations. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from veil.shared.errors import ParameterError, VeilError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "CommandParser", "run_command"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

#: what to do about an operating system error, by errno, where "check the path and its
#: permissions" would send the reader the wrong way
_OS_FIXES = {
    errno.ENOSPC: "free some space on that filesystem, or write somewhere else",
    errno.EDQUOT: "free some space within your disk quota, or write somewhere else",
    errno.EROFS: "that filesystem is mounted read-only: write somewhere else",
}

#: what argparse says before the options it found missing
_REQUIRED = "the following arguments are required: "


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the fix.

    An option that takes its default from an environment variable records it in the
    action's ``environment_variable`` (:mod:`veil.server.cli.options`); when such an
    option is missing, the error names the variable too.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>; see <prog> --help`` and exit with 2."""
        if message.startswith(_REQUIRED):
            variables = {"/".join(action.option_strings): variable
                         for action in self._actions
                         if (variable := getattr(action, "environment_variable", None))}
            names = [f"{name} (or ${variables[name]})" if name in variables else name
                     for name in message[len(_REQUIRED):].split(", ")]
            message = _REQUIRED + ", ".join(names)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def run_command(command: str, run: Callable[[argparse.Namespace], int],
                args: argparse.Namespace) -> int:
    """Run a subcommand and turn the errors Veil expects into one line and an exit code."""
    try:
        return int(run(args) or 0)
    except BrokenPipeError:
        # whoever read the output stopped early (veil stats | head): not a failure of the
        # command; point stdout at /dev/null so that the interpreter's final flush is quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except ParameterError as exc:
        return _fail(command, str(exc), EXIT_USAGE)
    except VeilError as exc:
        return _fail(command, str(exc), EXIT_FAILED)
    except MemoryError:
        return _fail(command, "not enough memory for what was asked; ask for less (fewer "
                     "reports, installations, candidates or days) or run it on a machine with "
                     "more memory", EXIT_FAILED)
    except ModuleNotFoundError as exc:
        return _fail(command, missing_dependency(exc.name or str(exc)), EXIT_FAILED)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        reason = exc.strerror or type(exc).__name__
        fix = _OS_FIXES.get(exc.errno or 0, "check the path and its permissions")
        return _fail(command, f"{where}{reason}; {fix}", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


def _fail(command: str, message: str, code: int) -> int:
    """Print ``veil <command>: error: <message>`` on one line; return ``code``."""
    from veil.server.collector.logs import one_line

    print(f"veil {command}: error: {one_line(message)}", file=sys.stderr)
    return code


def missing_dependency(module: str) -> str:
    """The error for a missing optional ``module``: which extra brings it, and how to install
    that extra from a clone or from a wheel (Veil is on no package index)."""
    extra = _extra_of(module.partition(".")[0])
    return (f"the optional dependency {module!r} is missing; install Veil's {extra!r} extra: "
            f"in a clone, pip install -e '.[{extra}]'; from a wheel, "
            f"pip install './veil-VERSION-py3-none-any.whl[{extra}]' (docs/install.md)")


#: import names whose distribution is spelled otherwise
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "psycopg_pool": "psycopg"}


def _extra_of(module: str) -> str:
    """The first of Veil's extras whose own requirements name ``module``, else ``all``."""
    from importlib.metadata import PackageNotFoundError, requires

    wanted = _normal(_DISTRIBUTIONS.get(module, module))
    try:
        lines = requires("veil") or []
    except PackageNotFoundError:
        return "all"
    for line in lines:
        requirement, _, marker = line.partition(";")
        name = re.match(r"[A-Za-z0-9._-]*", requirement.strip())
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)", marker)
        if name and extra and _normal(name.group()) == wanted:
            return extra.group(1)
    return "all"


def _normal(name: str) -> str:
    """A distribution name compared as PEP 503 does (case and ``-_.`` ignored)."""
    return name.lower().replace("_", "-").replace(".", "-")
