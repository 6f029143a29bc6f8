"""Sphinx configuration of Veil's documentation site.

Build it with ``make -C docs html`` (or ``sphinx-build -n -W -b html docs docs/_build/html``);
it needs the ``docs`` extra and no network: no intersphinx, every reference is internal.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

from veil.shared.version import __version__

project = "Veil"
author = "The Veil authors"
copyright = "the Veil authors, Apache License 2.0"
release = __version__
version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "veil_reference",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures/README*"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4

# each object once, on the page of the module that defines it (not again where a package
# re-exports it through __all__)
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_preserve_defaults = True

# -n checks every reference. Docstrings also name objects for their readers with short or
# external names (``kind``, numpy.ndarray) that no page documents and, with no intersphinx,
# cannot link: only those are let go. A full ``veil.`` path that resolves nowhere (a module
# renamed under a docstring) still fails the build.
nitpick_ignore_regex = [(r"py:.*", r"(?!veil\.).*")]

html_theme = "furo"
html_title = f"Veil {version}"
html_static_path: list[str] = []

# option names keep their two hyphens (--dry-run, not an en dash)
smartquotes = False
