"""Small things people trip on: ``veil demo``'s default output is ignored by git (it used to
stay in the checkout as an untracked folder), and the README says what the "(small)" of
``veil experiment regression`` means."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from veil.simulations.demo_config import DemoConfig
from veil.simulations.experiments import regression

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and a clone")
def test_the_demo_s_default_output_is_ignored_by_git() -> None:
    out = DemoConfig().out
    assert not out.is_absolute()
    for name in ("demo.png", "homepage_results.csv"):
        ignored = subprocess.run(["git", "check-ignore", "-q", str(out / name)], cwd=ROOT,
                                 timeout=30)
        assert ignored.returncode == 0, f"{out / name} is not ignored"


def test_the_readme_says_what_small_means() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "veil experiment regression" in readme
    assert 'prints "(small)": it runs google/rappor\'s reduced\nmatrix' in readme
    assert "(small)" in regression.__doc__ or "'small' size" in (regression.__doc__ or "")
