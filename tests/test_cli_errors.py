"""Every ``veil`` subcommand fails the same way: exit 1 when the operation failed, 2 for a
usage error, and one line ``veil <command>: error: ...`` on stderr, never a traceback nor
a library's own wording.

The subcommands come from the ``veil.commands`` entry points (through
:func:`veil.server.cli.build_parser`), so a command added by any package is run through
the usage failures below without a line here: an unknown option, every typed or choice
option given a value it cannot take, the command with its required arguments left out,
and, for a command that reads a database, a collector or a registry, that source missing.
The named failures of operators and analysts (a collector that does not answer, a
PostgreSQL password that is wrong or a server that is down) run as real processes against
real servers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from veil.server.cli import build_parser, main

#: what no error line may contain: a traceback or a library's wording of an expected error
INTERNALS = ("Traceback", "HTTPConnectionPool", "NewConnectionError", "Max retries",
             "psycopg", "connection to server at", "Is the server running", "urllib3")
#: options a command reads its data from, and what the tests give them
SOURCES = ("--db", "--server", "--config", "--archive")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Every registered subcommand's parser, by name."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


COMMANDS = subparsers()


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``VEIL_*`` variable of the run's shell reaches the command."""
    for variable in [name for name in os.environ if name.startswith("VEIL_")]:
        monkeypatch.delenv(variable)


def assert_one_error_line(command: str, err: str) -> str:
    """The one ``veil <command>: error:`` line of ``err``, with no internals; returns it."""
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(f"veil {command}: error: "), err
    assert not any(word in err for word in INTERNALS), err
    return lines[0]


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``veil ARGV`` through :func:`main`: its exit code (argparse's too) and its stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def typed_options(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """``(option, value it cannot take)`` for each option with a type or choices."""
    bad = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        if action.choices is not None:
            bad.append((action.option_strings[0], "no-such-choice"))
        elif action.type in (int, float) or getattr(action.type, "__module__",
                                                    "").startswith("veil."):
            bad.append((action.option_strings[0], "not-a-number"))
    return bad


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_usage_errors_are_one_line_naming_the_command_and_exit_2(command, capsys,
                                                                 monkeypatch) -> None:
    clean_environment(monkeypatch)
    code, err = run_in_process([command, "--no-such-option"], capsys)
    assert code == 2
    line = assert_one_error_line(command, err)
    # the parser reports a missing required argument before an unknown one
    assert "--no-such-option" in line or "required" in line, line
    assert f"veil {command} --help" in line
    parser = COMMANDS[command]
    for option, value in typed_options(parser):
        code, err = run_in_process([command, option, value], capsys)
        assert code == 2, (option, err)
        assert_one_error_line(command, err)
    required = [action for action in parser._actions if action.required]
    if required:
        code, err = run_in_process([command], capsys)
        assert code == 2
        line = assert_one_error_line(command, err)
        for action in required:
            variable = getattr(action, "environment_variable", None)
            if variable and action.option_strings:
                assert f"${variable}" in line, line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_exits_0(command, capsys) -> None:
    code, _ = run_in_process([command, "--help"], capsys)
    assert code == 0


def missing_sources_argv(parser: argparse.ArgumentParser, root: Path,
                         offline: str) -> list[str] | None:
    """The command's required arguments, its data sources pointing where nothing is (a
    database or archive in a missing directory, a missing registry file, a collector that
    does not answer); None for a command that reads none of :data:`SOURCES`."""
    nowhere = root / "missing"
    given = {"--db": str(nowhere / "veil.db"), "--config": str(nowhere / "metrics.toml"),
             "--server": offline, "--archive": str(nowhere / "archive")}
    options = {action.option_strings[0]: action for action in parser._actions
               if action.option_strings}
    sources = [name for name in SOURCES if name in options]
    if not sources:
        return None
    argv: list[str] = []
    for action in parser._actions:
        if not action.required:
            continue
        if not action.option_strings:
            argv.append(str(next(iter(action.choices)) if action.choices else "x"))
            continue
        name = action.option_strings[0]
        argv += [name, given.get(name, str(root / "out") if name == "--out" else "homepage")]
    if not any(name in argv for name in sources):
        argv += [sources[0], given[sources[0]]]
    return argv


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_source_is_one_line_and_no_traceback(command, tmp_path, offline_url) -> None:
    """Run as a process: the console script's exit code and everything it writes."""
    argv = missing_sources_argv(COMMANDS[command], tmp_path, offline_url)
    if argv is None:
        pytest.skip(f"veil {command} reads no database, collector, registry or archive")
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    result = subprocess.run([sys.executable, "-m", "veil.server.cli", command, *argv],
                            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode in (1, 2), (argv, result.stdout, result.stderr)
    assert_one_error_line(command, result.stderr)


def veil(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``veil ARGV`` as a process without the run's ``VEIL_*`` variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    return subprocess.run([sys.executable, "-m", "veil.server.cli", *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


def test_bare_veil_prints_the_help_and_exits_2() -> None:
    result = veil()
    assert result.returncode == 2
    assert "usage: veil" in result.stderr and "decode" in result.stderr


def test_a_collector_that_does_not_answer_is_named_with_the_fix(offline_url, tmp_path) -> None:
    for argv in (["stats", "--server", offline_url],
                 ["decode", "--server", offline_url, "--metric", "homepage", "--out",
                  str(tmp_path / "out")]):
        result = veil(*argv)
        assert result.returncode == 1, result.stderr
        line = assert_one_error_line(argv[0], result.stderr)
        assert f"cannot reach the collector at {offline_url} (Connection refused)" in line
        assert "--server or $VEIL_URL" in line


def test_a_missing_config_names_its_variable() -> None:
    result = veil("metrics")
    assert result.returncode == 2
    line = assert_one_error_line("metrics", result.stderr)
    assert "--config (or $VEIL_CONFIG)" in line


def test_an_unknown_option_is_the_subcommand_s_error() -> None:
    result = veil("decode", "--out", "out", "--no-such-option")
    assert result.returncode == 2
    line = assert_one_error_line("decode", result.stderr)
    assert "unrecognized arguments: --no-such-option" in line


def test_a_missing_optional_dependency_says_how_to_install_its_extra_without_an_index(
        tmp_path) -> None:
    """scipy hidden from a real ``veil decode``: the extra that brings it, installed from a
    clone or a wheel (``pip install 'veil[all]'`` needs an index Veil is not on)."""
    (tmp_path / "scipy.py").write_text("raise ModuleNotFoundError(\"No module named 'scipy'\", "
                                       "name='scipy')\n")
    params = tmp_path / "params.csv"
    params.write_text("k,h,m,p,q,f\n8,2,2,0.5,0.75,0.5\n")
    counts = tmp_path / "counts.csv"
    counts.write_text("10,1,2,3,4,5,6,7,8\n10,1,2,3,4,5,6,7,8\n")
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("a\nb\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("VEIL_")}
    env["PYTHONPATH"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "veil.server.cli", "decode", "--params", str(params), "--counts",
         str(counts), "--candidates", str(candidates), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stderr
    line = assert_one_error_line("decode", result.stderr)
    assert "'scipy' is missing; install Veil's 'analysis' extra" in line
    assert "pip install -e '.[analysis]'" in line and "whl[analysis]" in line


@pytest.fixture
def password_role(postgres_server):
    """A role ``veil_pw`` with password ``right`` that must give it over TCP (the test
    server trusts everyone else); removed afterwards."""
    hba = postgres_server.datadir / "pg_hba.conf"
    original = hba.read_text()
    with postgres_server.connect() as conn:
        conn.execute("CREATE ROLE veil_pw LOGIN PASSWORD 'right'")
        hba.write_text("host all veil_pw 127.0.0.1/32 scram-sha-256\n" + original)
        conn.execute("SELECT pg_reload_conf()")
    yield "veil_pw"
    if not postgres_server.running:
        postgres_server.start()
    with postgres_server.connect() as conn:
        hba.write_text(original)
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("DROP ROLE veil_pw")


def test_postgresql_failures_say_why_in_one_line(postgres_server, postgres_url,
                                                 password_role) -> None:
    wrong = postgres_url.replace("postgresql://postgres@", f"postgresql://{password_role}:no@")
    result = veil("stats", "--db", wrong)
    assert result.returncode == 1
    line = assert_one_error_line("stats", result.stderr)
    assert f'password authentication failed for user "{password_role}"' in line
    assert "check the user name and password" in line and ":no@" not in line
    missing = postgres_server.database_url("veil_no_such_database")
    line = assert_one_error_line("stats", veil("stats", "--db", missing).stderr)
    assert 'database "veil_no_such_database" does not exist' in line
    postgres_server.stop()
    result = veil("stats", "--db", postgres_url)
    assert result.returncode == 1
    line = assert_one_error_line("stats", result.stderr)
    assert "Connection refused; check that PostgreSQL is running" in line


@pytest.mark.parametrize(("setup", "message"), [
    ("CREATE TABLE veil_meta (name text)", "has a veil_meta table Veil did not write"),
    ("CREATE TABLE veil_meta (key text PRIMARY KEY, value text NOT NULL); INSERT INTO "
     "veil_meta VALUES ('schema_version', 'x2')", "records schema version 'x2' in veil_meta"),
])
def test_a_postgresql_database_veil_did_not_write_is_named_in_one_line(postgres_url, setup,
                                                                       message) -> None:
    """``veil check``, ``veil stats`` and ``veil migrate`` on a foreign ``veil_meta`` (its
    columns, or a version Veil never writes) gave a traceback."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for statement in setup.split("; "):
            conn.execute(statement)
    for command in ("check", "stats", "migrate"):
        result = veil(command, "--db", postgres_url)
        assert result.returncode == 1, result.stderr
        assert message in assert_one_error_line(command, result.stderr)


def test_veil_retention_inside_the_replay_window_is_refused_from_the_command_line(
        postgres_url) -> None:
    """``veil retention --keep-days 1`` dropped today's and yesterday's raw reports, whose ids
    keep a resent batch from counting twice: refused, naming the least ``--keep-days``."""
    from veil.server.storage import open_storage
    from veil.shared.registry import Registry

    open_storage(postgres_url, Registry.from_dict({"metrics": {"flag": {"kind": "boolean"}}}),
                 create=True).close()
    for keep in ("1", "6"):
        result = veil("retention", "--db", postgres_url, "--keep-days", keep)
        assert result.returncode == 1, result.stderr
        assert "within the 7-day replay window" in assert_one_error_line("retention",
                                                                           result.stderr)
    result = veil("retention", "--db", postgres_url, "--keep-days", "7")
    assert result.returncode == 0, result.stderr


def test_veil_check_on_an_empty_postgresql_database_is_a_usage_error(postgres_url) -> None:
    """As on SQLite (exit 2, with the fix); it exited 1 without one."""
    result = veil("check", "--db", postgres_url)
    assert result.returncode == 2, result.stderr
    assert "start the collector with this --db first" in assert_one_error_line("check",
                                                                               result.stderr)


def test_a_postgresql_payload_changed_outside_veil_is_named_not_misread(postgres_url,
                                                                         tmp_path) -> None:
    """A raw report's payload of the wrong length gave a traceback to ``veil check``,
    ``rebuild-aggregates`` and ``archive``; two whose lengths offset each other would have
    shifted every row after them into a wrong one. Each names the metric and the day."""
    import datetime as dt

    import psycopg

    from veil.server.storage import open_storage
    from veil.shared.registry import Registry
    from veil.shared.wire import make_report, validate_report

    registry = Registry.from_dict({"metrics": {"level": {
        "kind": "category", "oracle": "grr", "categories": ["a", "b", "c"], "epsilon": 1.0}}})
    fingerprint = registry["level"].params.fingerprint
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    with open_storage(postgres_url, registry, create=True) as storage:
        storage.insert([validate_report(make_report(os.urandom(16).hex(), "level", None,
                                                    index % 3, fingerprint), registry)
                        for index in range(20)], yesterday)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE veil_reports SET payload = '\\x0102'::bytea WHERE ctid = "
                     "(SELECT ctid FROM veil_reports LIMIT 1)")
    for command in (["check"], ["rebuild-aggregates"], ["archive", "--out", str(tmp_path / "a")]):
        result = veil(command[0], "--db", postgres_url, *command[1:])
        assert result.returncode == 1, result.stderr
        line = assert_one_error_line(command[0], result.stderr)
        assert "a stored payload has 2 bytes where the others have 8 (metric 'level', " \
               f"{yesterday})" in line


@pytest.mark.parametrize(("content", "message"), [
    ('[metrics.x]\nkind = "boolean"\ndescription = "caf\xe9"\n'.encode("latin-1"),
     "not UTF-8 (byte 0xe9 at offset 47, line 3); save the registry as UTF-8"),
    (b"[metrics.x]\nkind = 'category'\ncategories = " + b"[" * 5000 + b"]" * 5000,
     "not valid TOML: arrays or tables are nested too deeply"),
    (b"[metrics.x]\nkind = 'boolean'\nmin_reports = 0\n",
     "metrics.x.min_reports must be an integer"),
])
def test_a_bad_registry_is_a_usage_error_naming_the_file(tmp_path, content, message) -> None:
    """``veil metrics`` and ``veil serve`` (before it listens) refuse it: exit 2, one line."""
    path = tmp_path / "metrics.toml"
    path.write_bytes(content)
    for argv in (["metrics", "--config", str(path)],
                 ["serve", "--config", str(path), "--db", str(tmp_path / "veil.db"),
                  "--port", "0"]):
        result = veil(*argv)
        assert result.returncode == 2, result.stderr
        line = assert_one_error_line(argv[0], result.stderr)
        assert f"{path}: " in line and message in line, line
        assert "listening" not in result.stdout


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_registry_file_is_refused_at_the_size_limit() -> None:
    result = veil("metrics", "--config", "/dev/zero")
    assert result.returncode == 2, result.stderr
    line = assert_one_error_line("metrics", result.stderr)
    assert "/dev/zero: larger than 16 MiB, the most a registry file may hold" in line


@pytest.mark.parametrize(("argv", "option"), [
    (["--workers", "100000"], "--workers"),
    (["--threads", "100000"], "--threads"),
    (["--port", "70000"], "--port"),
    (["--port", "-1"], "--port"),
    (["--max-reports", "0"], "--max-reports"),
    (["--network-rate", "nan"], "--network-rate"),
    (["--burst-seconds", "inf"], "--burst-seconds"),
    (["--read-token", "has space"], "--read-token"),
    (["--token-daily-cap", "-1"], "--token-daily-cap"),
    (["--proxy-hops", "1.5"], "--proxy-hops"),
])
def test_serve_refuses_what_its_workers_could_not_take_before_it_listens(
        tmp_path: Path, argv: list[str], option: str) -> None:
    """Each of these printed "listening" first: a worker count of 10**30 then forked until
    the machine gave out (ignoring SIGTERM), the others failed in every worker with a
    traceback or an internal setting's name. Refused up front, exit 2, naming the option."""
    registry = tmp_path / "metrics.toml"
    registry.write_text('version = 1\n[metrics.flag]\nkind = "boolean"\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "veil.server.cli", "serve", "--config", str(registry), "--db",
         str(tmp_path / "veil.db"), "--port", "0", *argv],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert option in result.stderr and "Traceback" not in result.stderr
    assert "listening" not in result.stdout + result.stderr
    assert not (tmp_path / "veil.db").exists()


def test_retention_refuses_a_cutoff_after_today_before_it_opens_anything(tmp_path: Path) -> None:
    """--before 9999-12-31 dropped the raw reports of today (they still arrive) and said their
    days were refused from then on, which was not so; --keep-days past the calendar was a
    traceback. Refused by name (exit 2) before any store is opened; the calendar's bound
    keeps everything."""
    import datetime as dt

    tomorrow = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()
    for before in (tomorrow, "9999-12-31"):
        result = veil("retention", "--db", str(tmp_path / "none.db"), "--before", before)
        assert result.returncode == 2 and "--before" in result.stderr, result.stderr
    for before in ("2026-02-30", "20260101", "2026-W01-1"):  # read as every command reads days
        result = veil("retention", "--db", str(tmp_path / "none.db"), "--before", before)
        assert result.returncode == 2 and "--before must be a day written YYYY-MM-DD" \
            in result.stderr, result.stderr
    result = veil("retention", "--db", str(tmp_path / "none.db"), "--keep-days", "10" * 15)
    assert "Traceback" not in result.stderr and "keep" not in result.stderr.lower(), result.stderr
    assert not (tmp_path / "none.db").exists()


def test_dashboard_refuses_a_port_it_would_wrap(tmp_path: Path) -> None:
    """--port 70000 listened on 4464 (waitress takes the port modulo 65536), -1 was a
    traceback: refused by name, exit 2."""
    for port in ("70000", "-1"):
        result = veil("dashboard", "--db", str(tmp_path / "veil.db"), "--read-token", "t" * 32,
                      "--port", port)
        assert result.returncode == 2 and "--port" in result.stderr, result.stderr


def test_map_refuses_to_overwrite_its_own_input(tmp_path: Path) -> None:
    """veil map --out PARAMS (or the candidates file) replaced the input with the map."""
    params = tmp_path / "params.csv"
    params.write_text("k,h,m,p,q,f\n16,2,4,0.25,0.75,0.5\n", encoding="utf-8")
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("a\nb\n", encoding="utf-8")
    for target in (params, candidates):
        before = target.read_bytes()
        result = veil("map", "--params", str(params), "--candidates", str(candidates),
                      "--out", str(target))
        assert result.returncode == 2 and "--out" in result.stderr, result.stderr
        assert target.read_bytes() == before


@pytest.mark.parametrize("command", [["simulate", "--reports", "100", "--values", "5"],
                                     ["experiment", "strings", "--quick", "--out", "x"]])
def test_a_negative_seed_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    """NumPy's generators take seeds from 0: -1 was a traceback from deep inside."""
    result = veil(*command, "--seed", "-1", cwd=tmp_path)
    assert result.returncode == 2 and "--seed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_dashboard_refuses_a_token_no_header_can_carry(tmp_path: Path) -> None:
    """veil serve refused --read-token 'has space' and veil dashboard took it (nobody could
    then sign in with it): both read tokens through one check now."""
    result = veil("dashboard", "--db", str(tmp_path / "veil.db"), "--read-token", "has space")
    assert result.returncode == 2 and "--read-token" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
