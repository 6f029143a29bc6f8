"""The distribution as a user gets it, not the editable install the other tests run on.

The wheel built from this tree must hold every module of the four folders mapped into the
``veil`` namespace (client/, server/, shared/, simulations/), each part's ``py.typed`` and the
licence, and nothing else (no tests/, no ``veil/__init__.py``); installed with the extras an
operator and an analyst need into a fresh virtual environment, from the package index pip is
configured with, it must import, answer ``veil --version``, serve ``/healthz``, take an SDK
report and decode it.

The release also passes ``twine check --strict`` and ``check-wheel-contents``, as CI requires.

These tests are marked ``slow``: they build the sdist and the wheel with ``python -m build``
(a few seconds, in an isolated build environment) and one installs the wheel with its
dependencies (about 20 seconds here: NumPy, SciPy, scikit-learn, matplotlib, pandas, Flask).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import TEST_REGISTRY, CollectorHandle

ROOT = Path(__file__).resolve().parent.parent
#: the folders mapped into the ``veil`` namespace by pyproject.toml's package-dir
FOLDERS = ("client", "server", "shared", "simulations")

pytestmark = pytest.mark.slow


def _run(command: list[str], **options: object) -> subprocess.CompletedProcess[str]:
    """Run ``command`` and fail the test with its output if it does not succeed."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, **options)
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``python -m build`` makes from this tree.

    Built from the sdist (the default of ``build``), as a release is: the wheel then comes
    from a clean copy, never from a ``build/`` folder that may still hold modules since renamed.
    """
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    (built,) = out.glob("veil-*.whl")
    return built


def _tree_modules() -> set[str]:
    """Every ``.py`` file under the four folders, as its path inside the wheel."""
    return {
        f"veil/{path.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def _dashboard_files() -> list[str]:
    """The dashboard's templates, script, style and vendored chart library (with its
    licence), as paths inside the wheel: its package data."""
    dashboard = ROOT / "server" / "dashboard"
    return [f"veil/{path.relative_to(ROOT).as_posix()}"
            for folder in ("templates", "static") for path in (dashboard / folder).rglob("*")
            if path.is_file()]


def test_the_wheel_holds_every_module_of_the_tree_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info/"
    package_files = [name for name in names if not name.startswith(dist_info)]

    modules = {name for name in package_files if name.endswith(".py")}
    assert sorted(_tree_modules() - modules) == [], "modules of the tree missing from the wheel"
    assert sorted(modules - _tree_modules()) == [], "modules in the wheel that the tree lacks"
    assert "veil/__init__.py" not in modules, "veil must stay a namespace package"

    others = sorted(name for name in package_files if not name.endswith(".py"))
    assert others == sorted([*(f"veil/{folder}/py.typed" for folder in FOLDERS),
                             *_dashboard_files()])
    assert f"{dist_info}licenses/LICENSE" in names
    assert "Apache License" in zipfile.ZipFile(wheel).read(f"{dist_info}licenses/LICENSE").decode()


def test_the_release_passes_the_checks_an_index_makes(wheel: Path) -> None:
    """``twine check --strict`` reads the metadata and README as an index would render them;
    ``check-wheel-contents`` looks for duplicates, stray top-level modules, empty or
    missing packages and compiled files."""
    (sdist,) = wheel.parent.glob("veil-*.tar.gz")
    _run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
    _run([sys.executable, "-m", "check_wheel_contents", str(wheel)])


class _WheelCollector(CollectorHandle):
    """``veil serve`` run by the console script of the fresh environment."""

    def __init__(self, veil: Path, workdir: Path) -> None:
        super().__init__(workdir, TEST_REGISTRY)
        self.veil = veil

    def command(self) -> list[str]:
        python_m_cli = 3  # sys.executable, "-m", "veil.server.cli"
        return [str(self.veil), *super().command()[python_m_cli:]]


@pytest.fixture
def fresh_environment(wheel: Path, tmp_path: Path) -> Iterator[Path]:
    """A new virtual environment with the wheel and the ``server`` and ``analysis`` extras.

    The environment is made without pip and filled by this interpreter's pip (``--python``),
    which reads the same configuration and index; ``--no-compile`` skips byte-compiling
    the scientific stack, which alone takes longer than the rest.
    """
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
          "--no-compile", f"{wheel}[server,analysis]"])
    yield venv


def test_the_installed_wheel_serves_takes_a_report_and_decodes_it(
    fresh_environment: Path, wheel: Path, tmp_path: Path
) -> None:
    bin_dir = fresh_environment / "bin"
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    env.pop("PYTHONPATH", None)
    outside = {"cwd": tmp_path, "env": env}  # never import the checkout's folders by accident
    expected_version = wheel.name.split("-")[1]

    imported = _run([str(bin_dir / "python"), "-c",
                     "import veil.client, veil.server.collector, veil.shared.version as v; "
                     "print(veil.client.__file__); print(v.__version__)"], **outside)
    module_file, version = imported.stdout.split()
    assert Path(module_file).is_relative_to(fresh_environment), module_file
    assert version == expected_version
    assert _run([str(bin_dir / "veil"), "--version"], **outside).stdout.strip() == (
        f"veil {expected_version}")

    workdir = tmp_path / "collector"
    workdir.mkdir()
    collector = _WheelCollector(bin_dir / "veil", workdir)
    collector.start()
    try:
        assert requests.get(collector.url + "/healthz", timeout=10).status_code == 200
        reported = _run([str(bin_dir / "python"), "-c", (
            "import sys\n"
            "from veil.client import Client\n"
            "client = Client(sys.argv[1], state_dir=sys.argv[2])\n"
            "for _ in range(200):\n"
            "    client.report('dark_mode', True)\n"
            "result = client.flush()\n"
            "print(result.accepted, result.remaining, result.error)\n"
        ), collector.url, str(tmp_path / "state")], **outside)
        assert reported.stdout.split() == ["200", "0", "None"]

        out = tmp_path / "decoded"
        _run([str(bin_dir / "veil"), "decode", "--server", collector.url, "--token",
              collector.token, "--metric", "dark_mode", "--out", str(out)], **outside)
        with (out / "results.csv").open(newline="") as file:
            rows = list(csv.DictReader(file))
        assert sorted(row["value"] for row in rows) == ["false", "true"], rows
        # the two answers' unbiased estimates always add up to the reports received
        assert sum(float(row["estimate"]) for row in rows) == pytest.approx(200)
    finally:
        collector.stop()
