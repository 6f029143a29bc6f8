"""One way of writing a privacy cost: every place a person reads an epsilon writes it with
:func:`veil.shared.privacy.format_epsilon` (three significant digits, rounded up), so the
README, ``veil metrics``, ``veil decode``'s statement and the demo say the same 4.40 for
the default string metric's 4 ln 3, and sizes say "1 byte", not "1 bytes"."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

from veil.server.analysis.cost import privacy_cost
from veil.shared.kinds import StringParams
from veil.shared.privacy import format_epsilon
from veil.shared.registry import Registry
from veil.simulations.demo import print_privacy
from veil.simulations.demo_config import DemoConfig

ROOT = Path(__file__).resolve().parents[1]
#: a number as the formatter writes it: three significant digits
THREE_DIGITS = re.compile(r"^(0\.0*[1-9]\d{2}|[1-9]\.\d{2}|[1-9]\d\.\d|[1-9]\d{2,})$")


def test_the_default_string_cost_reads_the_same_everywhere(tmp_path, capsys) -> None:
    shown = format_epsilon(StringParams().epsilon_inf)
    assert shown == "4.40" and 4 * math.log(3) <= float(shown)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"privacy: {shown} (= 4 ln 3) per distinct string, rounded up" in readme and "4.39 " not in readme
    statement = privacy_cost(StringParams(), None, "strings")["statement"]
    registry = DemoConfig().registry()
    print_privacy(DemoConfig(), registry, spent=12.3456)
    printed = capsys.readouterr().out
    for metric in registry.values():
        assert (f"epsilon_inf = {format_epsilon(metric.params.epsilon_inf):>5} per distinct "
                "value") in printed
    assert "epsilon = 12.4 in total" in printed
    assert f"\u03b5\u221e = {shown} per distinct value" in statement


def test_veil_metrics_writes_every_epsilon_with_one_formatter_and_pluralizes(tmp_path) -> None:
    config = tmp_path / "metrics.toml"
    config.write_text(
        "version = 1\n"
        "[metrics.homepage]\nkind = \"string\"\n"
        "[metrics.browser]\nkind = \"category\"\noracle = \"grr\"\ncategories = [\"a\", \"b\"]\n"
        "epsilon = 1.5\n"
        "[metrics.screen]\nkind = \"category\"\noracle = \"oue\"\n"
        "categories = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]\n"
        "epsilon = 4\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "veil.server.cli", "metrics", "--config",
                             str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:4]}
    registry = Registry.load(config)
    for name, row in rows.items():
        params = registry[name].params
        assert row[2:4] == [format_epsilon(params.epsilon_1), format_epsilon(params.epsilon_inf)]
        assert all(THREE_DIGITS.match(value) for value in row[2:4]), row
    assert rows["homepage"][2:4] == ["1.08", "4.40"]
    assert rows["browser"][4:] == ["1", "byte"]
    assert rows["screen"][4:] == ["2", "bytes"]
    total = result.stdout.splitlines()[-1]
    assert f"at most {format_epsilon(registry.epsilon_total())} in all" in total
