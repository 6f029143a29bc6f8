"""Every ``veil`` command the README and docs/ show exists, with every option it is shown
with: a reader who copies one gets the command's work, not ``unrecognized arguments``.

Commands are read where a reader copies them from: lines of fenced code blocks (shell
continuations joined) and inline code spans that begin with ``veil``. A subcommand of a
command (``veil experiment strings``) is followed when the parser has one of that name.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from veil.server.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``veil WORD ...`` where a shell command begins: at the start, after a prompt, a pipe,
#: ``&&``, ``;`` or ``(``; the rest runs to the end of that command
_COMMAND = re.compile(r"(?:^|\$ |&& |\|\| |; |\| |\()veil ([a-z][a-z0-9-]*)([^;&|`)]*)")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def shown_commands(text: str) -> list[str]:
    """The ``veil ...`` commands of a Markdown page: each line of its fenced code blocks
    (continuations joined) and each inline code span that begins with ``veil``."""
    out: list[str] = []
    fenced = False
    for line in re.sub(r"\s*\\\n\s*", " ", text).splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.extend(match.group(0).strip(" $(&|;") for match in _COMMAND.finditer(line.strip()))
        else:
            out.extend(span for span in re.findall(r"`([^`\n]+)`", line)
                       if span.startswith("veil "))
    return out


def problems(command: str, root: argparse.ArgumentParser) -> list[str]:
    """What ``veil``'s parser does not know in one shown command."""
    match = _COMMAND.match(command)
    if match is None:
        return []
    name, rest = match.groups()
    commands = _subcommands(root)
    if name not in commands:
        return [f"no command {name!r}"]
    parser = commands[name]
    words = rest.split()
    if words and words[0] in _subcommands(parser):
        parser = _subcommands(parser)[words[0]]
    return [f"{name} has no option {option}" for option in _OPTION.findall(rest)
            if option not in parser._option_string_actions]


def test_every_command_and_option_the_docs_show_exists() -> None:
    root = build_parser()
    found = {f"{page.relative_to(ROOT)}: `{command}`: {problem}"
             for page in PAGES for command in shown_commands(page.read_text(encoding="utf-8"))
             for problem in problems(command, root)}
    assert not found, "\n".join(sorted(found))


def test_the_check_reads_code_blocks_and_spans_and_names_what_is_unknown() -> None:
    page = ("Run `veil serve --db veil.db --no-such-flag` or:\n\n```bash\n"
            "$ veil decode --db veil.db \\\n    --metric home --colour red\n"
            "veil frobnicate --x\npip install veil && veil demo --out demo\n```\n"
            "Prose about veil serve --made-up is not a command.\n")
    commands = shown_commands(page)
    assert commands == ["veil serve --db veil.db --no-such-flag",
                        "veil decode --db veil.db --metric home --colour red",
                        "veil frobnicate --x", "veil demo --out demo"]
    root = build_parser()
    assert [problem for command in commands for problem in problems(command, root)] == [
        "serve has no option --no-such-flag", "decode has no option --colour",
        "no command 'frobnicate'"]
