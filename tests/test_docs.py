"""The documentation site: it builds with every warning an error, with no network, and what
it builds holds together.

The site is built once for this module, as ``make -C docs html`` builds it (``sphinx-build
-n -W``, no intersphinx), into a temporary folder. Sphinx's own ``linkcheck`` needs the
network, so the internal links are checked here over the built HTML: every relative link
and image names a file of the site, every ``#fragment`` an id in its page, and every page
is at most two clicks from the landing page. Marked ``slow``: the build imports every
module for the API reference and takes about a minute on two cores.
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


class _Page(HTMLParser):
    """The links (``href``/``src``) and the ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (tag, url)
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append((tag, value))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _internal(page: Path, url: str, site: Path) -> tuple[Path, str] | None:
    """The file and fragment an internal ``url`` of ``page`` names (``None``: external)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "data:", "javascript:")):
        return None
    target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(site):
        return target, parts.fragment  # outside the site: reported as broken
    return target, parts.fragment


def broken_links(site: Path) -> list[str]:
    """Every internal link of the site that names a missing file or a missing fragment."""
    pages = {path: _parse(path) for path in site.rglob("*.html")}
    broken = []
    for path, page in pages.items():
        for _, url in page.links:
            found = _internal(path, url, site)
            if found is None:
                continue
            target, fragment = found
            where = f"{path.relative_to(site)}: {url}"
            if not target.is_file() or not target.is_relative_to(site):
                broken.append(f"{where} (no such file)")
            elif fragment and target.suffix == ".html" and fragment not in pages[target].ids:
                broken.append(f"{where} (no such anchor)")
    return broken


def clicks_from(site: Path, start: Path) -> dict[Path, int]:
    """The fewest clicks on ``<a>`` links from ``start`` to each page it reaches."""
    depth = {start: 0}
    queue = deque([start])
    while queue:
        page = queue.popleft()
        for tag, url in _parse(page).links:
            found = _internal(page, url, site)
            if tag != "a" or found is None or found[0].suffix != ".html":
                continue
            target = found[0]
            if target.is_file() and target not in depth:
                depth[target] = depth[page] + 1
                queue.append(target)
    return depth


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as CI builds it: nitpicky, warnings as errors, from scratch."""
    out = tmp_path_factory.mktemp("docs")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"the documentation has warnings:\n{result.stderr}"
    return out / "html"


pytestmark = pytest.mark.slow


def test_no_internal_link_is_broken(site: Path) -> None:
    assert broken_links(site) == []


def test_every_page_is_at_most_two_clicks_from_the_landing_page(site: Path) -> None:
    depth = clicks_from(site, site / "index.html")
    pages = {path for path in site.rglob("*.html") if "_static" not in path.parts}
    far = sorted(str(path.relative_to(site)) for path in pages if depth.get(path, 99) > 2)
    assert far == []


def test_the_generated_references_cover_the_code(site: Path) -> None:
    from veil.server.cli import build_parser
    from veil.server.collector.config import DEFAULTS

    cli = _parse(site / "_generated" / "cli.html")
    commands = [action for action in build_parser()._actions if action.dest == "command"]
    for name in commands[0].choices:
        assert f"cli-{name}" in cli.ids, f"veil {name} is missing from the CLI reference"
    settings = (site / "_generated" / "settings.html").read_text(encoding="utf-8")
    assert [name for name in DEFAULTS if name not in settings] == []
    assert (site / "_generated" / "python" / "veil.client.html").is_file()


def test_the_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        '<a href="a.html#there">a</a> <a href="gone.html">gone</a> '
        '<a href="a.html#nowhere">x</a> <a href="https://example.org/">out</a>')
    (tmp_path / "a.html").write_text('<h1 id="there">A</h1><a href="index.html">back</a>')
    assert broken_links(tmp_path) == ["index.html: gone.html (no such file)",
                                      "index.html: a.html#nowhere (no such anchor)"]
    assert clicks_from(tmp_path, tmp_path / "index.html") == {
        tmp_path / "index.html": 0, tmp_path / "a.html": 1}
