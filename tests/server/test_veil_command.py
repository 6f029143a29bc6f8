"""The ``veil`` command: subcommand groups come from the ``veil.commands`` entry points."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points

import pytest

from veil.server import cli
from veil.server.cli import build_parser, commands, main
from veil.server.collector.cli import serve_config
from veil.server.collector.config import DEFAULTS

GROUPS = {
    "analysis": ["assoc", "decode", "discover", "map"],
    "archive": ["archive", "aggregate"],
    "collector": ["metrics", "serve", "export"],
    "dashboard": ["dashboard"],
    "init": ["init"],
    "simulations": ["demo", "experiment", "populate", "simulate"],
    "storage": ["check", "migrate", "stats", "retention", "rebuild-aggregates", "backup"],
}


def fake_entry_point(name: str, module: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"{module}:COMMANDS", group=commands.ENTRY_POINT_GROUP)


def test_each_package_registers_its_commands_and_help_lists_them_by_group_name() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group="veil.commands")}
    assert registered == {
        "analysis": "veil.server.analysis.cli:COMMANDS",
        "archive": "veil.server.archive.cli:COMMANDS",
        "collector": "veil.server.collector.cli:COMMANDS",
        "dashboard": "veil.server.dashboard.cli:COMMANDS",
        "init": "veil.server.collector.bootstrap:COMMANDS",
        "simulations": "veil.simulations.cli:COMMANDS",
        "storage": "veil.server.storage.cli:COMMANDS",
    }
    listed = [name for name, *_ in commands.iter_commands()]
    assert listed == [name for group in sorted(GROUPS) for name in GROUPS[group]]
    result = subprocess.run([sys.executable, "-m", "veil.server.cli", "--help"],
                            capture_output=True, text=True, timeout=60, check=True)
    assert all(name in result.stdout for name in listed)


def test_listing_the_commands_loads_no_other_package_by_name_and_no_heavy_dependency() -> None:
    code = (
        "import sys\n"
        "import veil.server.cli\n"
        "assert 'veil.simulations' not in sys.modules, 'veil.server imports veil.simulations'\n"
        "veil.server.cli.build_parser()\n"
        "heavy = {'numpy', 'scipy', 'sklearn', 'matplotlib', 'flask', 'waitress', 'psycopg',\n"
        "         'pyarrow', 'dask', 'distributed'}\n"
        "assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_group_missing_an_optional_dependency_is_skipped(tmp_path, monkeypatch) -> None:
    (tmp_path / "veil_test_optional_group.py").write_text(
        "import veil_test_absent_dependency\nCOMMANDS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [fake_entry_point("optional", "veil_test_optional_group"),
             fake_entry_point("uninstalled", "veil.server.veil_test_uninstalled.cli"),
             *entry_points(group=commands.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(commands, "entry_points", lambda group: found)
    assert "decode" in [name for name, *_ in commands.iter_commands()]


def test_a_missing_veil_module_is_a_bug_and_is_not_hidden(tmp_path, monkeypatch) -> None:
    (tmp_path / "veil_test_broken_group.py").write_text(
        "import veil.server.veil_test_no_such_module\nCOMMANDS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [fake_entry_point("broken", "veil_test_broken_group")]
    monkeypatch.setattr(commands, "entry_points", lambda group: found)
    with pytest.raises(ModuleNotFoundError, match="veil_test_no_such_module"):
        list(commands.iter_commands())


def test_a_dependency_missing_at_run_time_names_the_extra_to_install(monkeypatch, capsys) -> None:
    def run(args: object) -> int:
        raise ModuleNotFoundError("No module named 'flask'", name="flask")

    monkeypatch.setattr(cli, "iter_commands", lambda: iter([("probe", "", lambda p: None, run)]))
    assert main(["probe"]) == 1
    # Veil is on no package index: the extra is installed from a clone or a wheel
    assert capsys.readouterr().err == (
        "veil probe: error: the optional dependency 'flask' is missing; install Veil's "
        "'server' extra: in a clone, pip install -e '.[server]'; from a wheel, "
        "pip install './veil-VERSION-py3-none-any.whl[server]' (docs/install.md)\n")


def test_serve_takes_its_option_defaults_from_the_collector_table(monkeypatch) -> None:
    for variable in ("VEIL_READ_TOKEN", "VEIL_UPLOAD_TOKEN", "VEIL_METRICS_TOKEN",
                     "VEIL_LOG_FORMAT", "VEIL_LOG_LEVEL"):
        monkeypatch.delenv(variable, raising=False)
    args = build_parser().parse_args(["serve", "--config", "metrics.toml", "--db", "veil.db"])
    config = serve_config(args)
    assert config.pop("REGISTRY") == "metrics.toml" and config.pop("DATABASE") == "veil.db"
    tokens = {key: tuple(config[key]) for key in ("READ_TOKENS", "UPLOAD_TOKEN", "METRICS_TOKENS")}
    assert {**config, **tokens} == DEFAULTS


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path) -> None:
    """``veil map ... | head -1``: the reader closes the pipe; no BrokenPipeError traceback."""
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("".join(f"site{i}.example\n" for i in range(20_000)))
    params = tmp_path / "params.csv"
    params.write_text("k,h,m,p,q,f\n128,2,64,0.5,0.75,0.5\n")
    command = (f"{sys.executable} -m veil.server.cli map --params {params} "
               f"--candidates {candidates} | head -1")
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.count("\n") == 1
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
    assert result.returncode == 0


def test_a_size_beyond_memory_is_one_line_not_a_trace(tmp_path) -> None:
    """Asked for 10^12 reports, the discovery experiment's first array (210 GiB) cannot be
    had: one line saying to ask for less, exit 1. The address space is capped so that the
    allocation fails whatever the machine's overcommit policy."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    result = subprocess.run([sys.executable, "-m", "veil.server.cli", "experiment", "discovery",
                             "--reports", str(10**12), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.startswith("veil experiment: error: not enough memory for what was "
                                    "asked; ask for less")
    assert "Traceback" not in result.stderr
