"""Reference pages written from the code at every build, so they cannot drift from it.

At ``builder-inited`` this extension writes reStructuredText pages into ``_generated/``
(ignored by git) before Sphinx reads the sources:

- ``cli.rst``: every ``veil`` subcommand, its usage and options, from the argparse parser
  the command itself builds (:func:`veil.server.cli.build_parser`);
- ``settings.rst``: the collector's settings with their defaults, from
  :data:`veil.server.collector.config.DEFAULTS` and the descriptions in that module's
  docstring (a setting without a description stops the build);
- ``rest-api.rst``: the HTTP endpoints and schemas, from the OpenAPI document the collector
  serves at ``GET /v1/openapi.json``;
- ``python/``: one autodoc page per module, found by walking the four packages, so a module
  added, split or renamed is documented without an edit here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from docutils.nodes import Element
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.errors import ExtensionError

#: the import packages the API reference covers, in the order the site lists them
PACKAGES = ("veil.client", "veil.shared", "veil.server", "veil.simulations")
GENERATED = "_generated"
#: the module whose ``DEFAULTS`` and docstring make the settings page
SETTINGS_MODULE = "veil.server.collector.config"
#: the module whose ``openapi_document`` makes the HTTP API page
OPENAPI_MODULE = "veil.server.collector.openapi"
NOTE = ("This page is generated from the code at every build of the documentation; "
        "edit the code, not this page.")


def escape(text: str) -> str:
    """``text`` as literal reStructuredText (help strings hold ``*``, backquotes, ``_``)."""
    return re.sub(r"([\\*`_|])", r"\\\1", text)


def title(text: str, underline: str) -> list[str]:
    """A section title's lines: ``text`` underlined to its length."""
    return [text, underline * len(text), ""]


def indent(text: str, prefix: str = "   ") -> list[str]:
    """``text``'s lines indented into the body of a directive."""
    return [prefix + line if line else "" for line in text.splitlines()]


# -- the command line ---------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(name, help) of each subcommand of ``parser``, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield choice.dest, choice.help or ""


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _options(parser: argparse.ArgumentParser, program: str) -> list[str]:
    """``.. option::`` entries for every argument, under the group headings of ``--help``."""
    formatter = parser._get_formatter()
    lines = [f".. program:: {program}", ""]
    for group in parser._action_groups:
        actions = [action for action in group._group_actions
                   if action.help != argparse.SUPPRESS
                   and not isinstance(action, argparse._SubParsersAction)]
        if not actions:
            continue
        lines += [f"**{escape(group.title or '')}**", ""]
        for action in actions:
            if action.option_strings:
                metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
                names = ", ".join(f"{flag} {metavar}".strip() for flag in action.option_strings)
            else:
                names = formatter._format_args(action, action.dest)
            lines += [f".. option:: {names}", ""]
            lines += indent(escape(formatter._expand_help(action) if action.help else ""))
            lines.append("")
    return lines


def _command_section(parser: argparse.ArgumentParser, program: str, depth: int) -> list[str]:
    """One subcommand's section (and its own subcommands' below it)."""
    underline = "-~^"[min(depth, 2)]
    lines = title(program, underline)
    if parser.description:
        lines += [escape(parser.description), ""]
    lines += [".. code-block:: text", "", *indent(parser.format_usage().strip()), ""]
    lines += _options(parser, program)
    for name, _ in _subcommands(parser):
        lines += _command_section(_subparser(parser, name), f"{program} {name}", depth + 1)
    return lines


def cli_page() -> str:
    """The command-line reference: a table of the subcommands, then each one's options."""
    from veil.server.cli import build_parser

    parser = build_parser()
    lines = [*title("Command line: ``veil``", "="), NOTE, ""]
    lines += [escape(parser.description or ""), ""]
    lines += [".. list-table::", "   :header-rows: 1", "", "   * - command", "     - what it does"]
    for name, help_text in _subcommands(parser):
        lines += [f"   * - :ref:`veil {name} <cli-{name}>`", f"     - {escape(help_text)}"]
    lines += ["", *_options(parser, "veil")]
    for name, _ in _subcommands(parser):
        lines += [f".. _cli-{name}:", ""]
        lines += _command_section(_subparser(parser, name), f"veil {name}", 0)
    return "\n".join(lines) + "\n"


# -- the collector's settings -------------------------------------------------------------

_SETTING = re.compile(r"^((?:``[A-Z_]+``(?:, )?)+)\s+(.*)$")


def _described_settings(docstring: str) -> dict[str, str]:
    """Each setting's description from a docstring whose lines read ``NAME``  text,
    continued on lines indented to the text."""
    described: dict[str, str] = {}
    names: list[str] = []
    for line in docstring.splitlines():
        match = _SETTING.match(line)
        if match:
            names = re.findall(r"``([A-Z_]+)``", match.group(1))
            for name in names:
                described[name] = match.group(2).strip()
        elif names and line.startswith(" ") and line.strip():
            for name in names:
                described[name] += " " + line.strip()
        else:
            names = []
    return described


def settings_page() -> str:
    """The settings table; every key of ``DEFAULTS`` must be described in the docstring."""
    config = importlib.import_module(SETTINGS_MODULE)
    described = _described_settings(config.__doc__ or "")
    missing = sorted(set(config.DEFAULTS) - set(described))
    if missing:
        raise ExtensionError(f"settings in {config.__name__}.DEFAULTS without a description in "
                             f"its docstring: {', '.join(missing)}")
    lines = [*title("Collector settings", "="), NOTE, ""]
    lines += [
        "The collector's settings, as ``create_app`` reads them and ``veil serve`` takes its "
        f"option defaults from them (:mod:`{SETTINGS_MODULE}`). A setting without "
        "a default is required.", "",
        ".. list-table::", "   :header-rows: 1", "   :widths: 25 15 60", "",
        "   * - setting", "     - default", "     - meaning",
    ]
    for name, description in described.items():
        default = f"``{config.DEFAULTS[name]!r}``" if name in config.DEFAULTS else "(required)"
        lines += [f"   * - ``{name}``", f"     - {default}", f"     - {description}"]
    return "\n".join(lines) + "\n"


# -- the HTTP API -------------------------------------------------------------------------


def _schema_name(content: dict[str, Any] | None) -> str:
    """A link to the schema a JSON body refers to (``JSON`` for an inline one)."""
    schema = ((content or {}).get("application/json") or {}).get("schema") or {}
    reference = schema.get("$ref", "")
    if reference:
        name = reference.rsplit("/", 1)[-1]
        return f":ref:`{name} <schema-{name.lower()}>`"
    return "JSON" if schema else ""


def rest_page() -> str:
    """Each endpoint's parameters and responses, then the schemas, from the OpenAPI document."""
    config = importlib.import_module(SETTINGS_MODULE)
    openapi = importlib.import_module(OPENAPI_MODULE)
    document = openapi.openapi_document(config.DEFAULTS["MAX_CONTENT_LENGTH"],
                                        config.DEFAULTS["MAX_REPORTS_PER_BATCH"])
    lines = [*title("HTTP API (OpenAPI)", "="), NOTE, ""]
    lines += [
        f"The endpoints of the collector's OpenAPI {document['openapi']} document, which every "
        "collector serves at ``GET /v1/openapi.json`` with its own limits filled in (here the "
        "defaults). :doc:`../api` explains them in prose.", "",
    ]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            lines += title(f"{method.upper()} {path}", "-")
            lines += [escape(operation.get("summary", "")), ""]
            if operation.get("description"):
                lines += [escape(operation["description"]), ""]
            parameters = operation.get("parameters", [])
            if parameters:
                lines += [".. list-table:: Parameters", "   :header-rows: 1", "",
                          "   * - name", "     - in", "     - required", "     - meaning"]
                for parameter in parameters:
                    lines += [f"   * - ``{parameter['name']}``", f"     - {parameter['in']}",
                              f"     - {'yes' if parameter.get('required') else 'no'}",
                              f"     - {escape(parameter.get('description', ''))}"]
                lines.append("")
            body = operation.get("requestBody")
            if body:
                lines += [f"Request body: {_schema_name(body.get('content'))}", ""]
            lines += [".. list-table:: Responses", "   :header-rows: 1", "",
                      "   * - status", "     - meaning", "     - body"]
            for status, response in operation.get("responses", {}).items():
                lines += [f"   * - {status}", f"     - {escape(response.get('description', ''))}",
                          f"     - {_schema_name(response.get('content'))}"]
            lines.append("")
    lines += title("Schemas", "-")
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += [f".. _schema-{name.lower()}:", "", *title(name, "~")]
        lines += [".. code-block:: json", "", *indent(json.dumps(schema, indent=2)), ""]
    return "\n".join(lines) + "\n"


# -- the Python API -----------------------------------------------------------------------


def packages(root: str) -> dict[str, list[str]]:
    """Every package from ``root`` down, with the plain modules directly in it, found by
    walking the installed tree (``__main__`` modules, which run on import, left out)."""
    found: dict[str, list[str]] = {root: []}
    for info in pkgutil.walk_packages(importlib.import_module(root).__path__, root + "."):
        parent, _, leaf = info.name.rpartition(".")
        if info.ispkg:
            found[info.name] = []
        elif leaf != "__main__":
            found[parent].append(info.name)
    return found


def python_pages() -> dict[str, str]:
    """One page per package: its docstring and members, then each of its modules'."""
    pages: dict[str, str] = {}
    index = [*title("Python API", "="), NOTE, ""]
    index += ["Every package of Veil with its modules, from their docstrings. The public entry "
              "points are :class:`veil.client.Client`, :class:`veil.shared.Registry` and "
              ":func:`veil.server.analysis.decode_metric`.", "",
              ".. toctree::", "   :maxdepth: 1", ""]
    for root in PACKAGES:
        for package, names in sorted(packages(root).items()):
            index.append(f"   {package}")
            page = [*title(escape(package), "="), f".. automodule:: {package}", ""]
            for name in sorted(names):
                page += [*title(escape(name), "-"), f".. automodule:: {name}", ""]
            pages[f"python/{package}.rst"] = "\n".join(page)
    pages["python/index.rst"] = "\n".join(index) + "\n"
    return pages


def _settings_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                        lines: list[str]) -> None:
    """The settings module's docstring is a plain-text table that :func:`settings_page`
    renders; on its API page it becomes a pointer to that page."""
    if what == "module" and name == SETTINGS_MODULE:
        summary = lines[0] if lines else ""
        lines[:] = [summary, "", "Every setting, its default and meaning: :doc:`/_generated/settings`."]


def _lookup(path: str) -> tuple[bool, Any]:
    """The object a dotted ``veil.`` path names, importing its longest module prefix."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False, None
        return True, obj
    return False, None


def _public_path(app: Sphinx, env: BuildEnvironment, node: pending_xref,
                 contnode: Element) -> Element | None:
    """Resolve a reference by the path users import (``veil.client.Client``) to where the
    object is defined and documented (``veil.client.client.Client``).

    A ``veil.`` path that names a real object that no page documents (a type variable, a
    private helper) is shown as plain text; one that names nothing stays unresolved, so the
    nitpicky build fails on it.
    """
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("veil."):
        return None
    found, obj = _lookup(target)
    if not found:
        return None
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and f"{module}.{qualname}" != target:
        domain = env.get_domain("py")
        resolved = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       f"{module}.{qualname}", node, contnode)
        if resolved is not None:
            return resolved
    return contnode


def generate(app: Sphinx) -> None:
    """Write every generated page, rewriting only those that changed and removing the rest."""
    out = Path(app.srcdir) / GENERATED
    pages = {"cli.rst": cli_page(), "settings.rst": settings_page(), "rest-api.rst": rest_page(),
             **python_pages()}
    for relative, text in pages.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for path in out.rglob("*.rst"):
        if path.relative_to(out).as_posix() not in pages:
            path.unlink()


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the page generation and the two autodoc hooks."""
    app.connect("builder-inited", generate)
    app.connect("autodoc-process-docstring", _settings_docstring)
    app.connect("missing-reference", _public_path)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
