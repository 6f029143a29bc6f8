"""README.md's five-minute tour, run as written: README and code cannot drift apart.

The tour's fenced blocks run in order in one empty directory, through the
installed ``veil`` command, with two substitutions only: a free port for 8080
(another program may hold it) and a state directory inside that directory for
the client (a test must not write into the user's home). The TOML block is
written to the file its first line names; bash blocks run in one bash session
(so ``export`` carries over), with ``veil serve`` started in the background and
waited for; Python blocks run as scripts, and a line ending in a comment that
starts with a number (``...epsilon_inf   # 4.39``) must print that number.

The privacy figures the tour's registry states in its comments (``4 x 2 = 8``) are
checked against the parameters :meth:`Registry.load` reads from that registry.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from veil.shared.registry import Registry

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: an expression line whose comment states its value, e.g. ``...epsilon_inf   # 4.39 (= 4 ln 3)``
CLAIM = re.compile(r"^(?P<expr>[^#\s].*?)\s+#\s*(?P<value>-?\d+(?:\.\d+)?)\b")
SERVE_WAIT = """
ready=no
for _ in $(seq 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/readyz', timeout=1)" \\
    2>/dev/null && {{ ready=yes; break; }}
  sleep 0.1
done
if [ "$ready" != yes ]; then
  echo "veil serve did not become ready; its log:" >&2
  cat serve.log >&2
  exit 1
fi
"""


#: what the tour says of the dashboard: the page it names shows the top strings with their
#: intervals to the read token, and nothing without it
DASHBOARD_CHECK = """
python3 - <<'CHECK'
import json, os, urllib.error, urllib.request
url = "http://127.0.0.1:{port}/metric/homepage?format=json"
try:
    urllib.request.urlopen(url, timeout=30)
    raise SystemExit("the dashboard answered without a token")
except urllib.error.HTTPError as error:
    assert error.code == 401, error.code
request = urllib.request.Request(url, headers={{"Authorization": "Bearer " + os.environ["VEIL_READ_TOKEN"]}})
page = json.load(urllib.request.urlopen(request, timeout=120))
(estimates,) = [table for table in page["tables"] if table["name"] == "estimates"]
assert len(estimates["rows"]) >= 3, page["notes"]
assert {{"prop_low_95", "prop_high_95"}} <= set(estimates["columns"])
print("dashboard: %d strings with intervals" % len(estimates["rows"]))
CHECK
"""


def tour_blocks() -> list[tuple[str, str]]:
    """The (language, text) of each fenced block in the README's tour section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## A five-minute tour")
    end = text.find("\n## ", start + 1)
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text[start:end if end > 0 else None])]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def metric_comments(toml: str) -> dict[str, str]:
    """Each metric's comments in a registry's TOML, joined into one line of text."""
    comments: dict[str, list[str]] = {}
    name = None
    for line in toml.splitlines():
        header = re.fullmatch(r"\[metrics\.(\w+)\]", line.strip())
        if header:
            name = header[1]
            comments[name] = []
        elif name is not None and "#" in line:
            comments[name].append(line.split("#", 1)[1].strip())
    return {name: " ".join(lines) for name, lines in comments.items()}


def comment_says(comment: str, pattern: str) -> re.Match[str]:
    """Where ``comment`` states ``pattern``; fails saying what the comment no longer states."""
    match = re.search(pattern, comment)
    assert match, f"the README's comment no longer states {pattern!r}: {comment}"
    return match


def assert_shown(shown: str, value: float) -> None:
    """``shown`` is ``value`` rounded up to as many decimals as ``shown`` has, as
    :func:`veil.shared.privacy.format_epsilon` writes a cost: never below it."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    assert value * (1 - 1e-9) <= float(shown) < value + 10.0**-decimals, (shown, value)


def python_script(block: str) -> str:
    """The block, each value-stating line turned into a print the test compares."""
    lines = []
    for line in block.splitlines():
        claim = CLAIM.match(line)
        if claim and not line.lstrip().startswith(("from ", "import ")) and "=" not in claim["expr"]:
            lines.append(f"print('CLAIM', {claim['value']!r}, repr({claim['expr']}))")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def bash_script(block: str, port: int, dashboard_port: int) -> str:
    """The block with ``veil serve`` and ``veil dashboard`` in the background, each waited
    for until it answers."""
    logical = block.replace("\\\n", " ")
    out = []
    for line in logical.splitlines():
        if line.strip().startswith("veil serve "):
            out.append(f"{line} > serve.log 2>&1 &")
            out.append("echo $! > serve.pid")
            out.append(SERVE_WAIT.format(port=port))
        elif line.strip().startswith("veil dashboard "):
            out.append(f"{line} > dashboard.log 2>&1 &")
            out.append("echo $! > dashboard.pid")
            out.append(SERVE_WAIT.replace("/readyz", "/signin").replace("serve.log", "dashboard.log")
                       .replace("veil serve", "veil dashboard").format(port=dashboard_port))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("veil") is None:
        pytest.skip("the veil command is not installed (pip install -e '.[dev]')")
    blocks = tour_blocks()
    assert [language for language, _ in blocks].count("bash") >= 3, "the tour lost its commands"
    port, dashboard_port = free_port(), free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path / "home")
    env["XDG_STATE_HOME"] = str(tmp_path / "home" / "state")
    script = ["set -euo pipefail",
              "trap 'kill $(cat serve.pid) $(cat dashboard.pid) 2>/dev/null || true' EXIT"]
    claims = 0
    for number, (language, text) in enumerate(blocks):
        text = text.replace("8080", str(port)).replace("8050", str(dashboard_port))
        if language == "toml":
            name = text.splitlines()[0].lstrip("# ").strip()
            (tmp_path / name).write_text(text, encoding="utf-8")
        elif language == "bash":
            script.append(bash_script(text, port, dashboard_port))
            if "veil dashboard " in text:
                script.append(DASHBOARD_CHECK.format(port=dashboard_port))
        elif language == "python":
            path = tmp_path / f"block{number}.py"
            path.write_text(python_script(text), encoding="utf-8")
            claims += python_script(text).count("print('CLAIM'")
            script.append(f"python3 {path.name} | tee -a claims.txt")
    completed = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600, check=False)
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert completed.returncode == 0, (
        f"the tour failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}\n"
        f"collector log:\n{log[-2000:]}"
    )

    # what the tour says it writes is there and says what the tour says
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["detected"] >= 3, summary
    with open(tmp_path / "results" / "results.csv", newline="") as table:
        rows = list(csv.DictReader(table))
    assert len(rows) == summary["detected"]
    for column in ("string", "estimate", "std_error", "prop_low_95", "prop_high_95", "p_value",
                   "log10_p_value"):
        assert column in rows[0], column
    with open(tmp_path / "candidates.txt") as listed:
        assert {row["string"] for row in rows} <= set(listed.read().split())
    assert (tmp_path / "results" / "estimates.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "regression" / "report.html").exists()
    stated = [line.split(" ", 2) for line in (tmp_path / "claims.txt").read_text().splitlines()
              if line.startswith("CLAIM ")]
    assert len(stated) == claims > 0
    for _, value, shown in stated:
        assert_shown(value.strip("'"), float(shown))


def test_the_registry_comments_state_its_privacy(tmp_path: Path) -> None:
    (toml,) = [text for language, text in tour_blocks() if language == "toml"]
    path = tmp_path / toml.splitlines()[0].lstrip("# ").strip()
    path.write_text(toml, encoding="utf-8")
    registry = Registry.load(path)
    comments = metric_comments(toml)
    assert set(comments) == set(registry)

    homepage = registry["homepage"].params
    claim = comment_says(comments["homepage"],
                         r"privacy: ([\d.]+) \(= (\d+) ln (\d+)\) per distinct string")
    assert_shown(claim[1], homepage.epsilon_inf)
    assert int(claim[2]) * math.log(int(claim[3])) == pytest.approx(homepage.epsilon_inf)
    claim = comment_says(comments["homepage"],
                         r"n distinct strings from one installation cost n x ([\d.]+)")
    assert_shown(claim[1], homepage.epsilon_inf)
    assert homepage.privacy_map(3) == pytest.approx(3 * homepage.epsilon_inf)

    browser = registry["browser"].params
    comment_says(comments["browser"], r"all reports of one value reveal at most this;")
    assert browser.epsilon_inf == pytest.approx(browser.epsilon)
    assert browser.epsilon_inf <= browser.epsilon
    share = int(comment_says(comments["browser"], r"one report epsilon / (\d+)")[1])
    assert browser.epsilon_1 == pytest.approx(browser.epsilon / share)
    assert browser.epsilon_1 <= browser.epsilon / share
    claim = comment_says(comments["browser"],
                         r"all (\d+) categories spends at most (\d+) x ([\d.]+) = ([\d.]+)")
    assert int(claim[1]) == int(claim[2]) == len(browser.categories)
    assert_shown(claim[3], browser.epsilon_inf)
    assert_shown(claim[4], browser.privacy_map(len(browser.categories)))
    assert browser.privacy_map(len(browser.categories)) <= float(claim[4])

    dark_mode = registry["dark_mode"].params
    claim = comment_says(comments["dark_mode"],
                         r"ln (\d+) = ([\d.]+) per answer; true and false together ([\d.]+)")
    assert math.log(int(claim[1])) == pytest.approx(dark_mode.epsilon_inf)
    assert_shown(claim[2], dark_mode.epsilon_inf)
    assert_shown(claim[3], dark_mode.privacy_map(2))

    # a number is memoized per grid point: the decoder's summary (closed_form) and the
    # client's ledger count resolution + 1 possible values from low to high
    load_seconds = registry["load_seconds"].params
    grid_points = load_seconds.resolution + 1
    comment_says(comments["load_seconds"], r"^bounded mean: .* per distinct value;")
    assert load_seconds.epsilon_inf == pytest.approx(load_seconds.epsilon)
    claim = comment_says(comments["load_seconds"], r"rounded to (\d+) grid points from ([\d.]+) "
                         r"to ([\d.]+), so .* up to ([\d.]+)")
    assert int(claim[1]) == grid_points
    assert (float(claim[2]), float(claim[3])) == (load_seconds.low, load_seconds.high)
    assert_shown(claim[4], load_seconds.privacy_map(grid_points))
