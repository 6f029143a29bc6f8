"""``veil init``: a starter registry and private tokens, never overwritten unasked, that a
collector starts with."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import requests

from veil.client.encoders import make_encoder
from veil.server.cli import main
from veil.server.collector.starter import METRICS_TOML
from veil.shared.registry import Registry
from veil.shared.wire import make_batch, make_report

#: 32 bytes in hex: a token that began with "-" would read as an option in --read-token X
TOKEN = re.compile(r"[0-9a-f]{64}")


def read_env(path: Path) -> dict[str, str]:
    """The ``NAME=value`` lines of an env file (comments skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_init_writes_the_starter_registry_and_private_fresh_tokens(tmp_path, capsys):
    target = tmp_path / "collector"
    assert main(["init", "--dir", str(target)]) == 0
    out = capsys.readouterr().out
    assert (target / "metrics.toml").read_text(encoding="utf-8") == METRICS_TOML
    assert len(Registry.load(target / "metrics.toml")) > 0
    env_file = target / "veil.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    env = read_env(env_file)
    assert set(env) == {"VEIL_READ_TOKEN", "VEIL_UPLOAD_TOKEN"}
    assert all(TOKEN.fullmatch(token) for token in env.values())
    assert env["VEIL_READ_TOKEN"] != env["VEIL_UPLOAD_TOKEN"]
    assert f"veil serve --config {target / 'metrics.toml'} --db {target / 'veil.db'}" in out
    assert f". {env_file}" in out
    assert "veil stats" in out and "veil metrics" in out


def test_init_keeps_existing_files_unless_forced(tmp_path, capsys):
    (tmp_path / "metrics.toml").write_text("version = 1\n# mine\n", encoding="utf-8")
    assert main(["init", "--dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "metrics.toml already exists" in error and "--force" in error
    assert (tmp_path / "metrics.toml").read_text(encoding="utf-8") == "version = 1\n# mine\n"
    assert not (tmp_path / "veil.env").exists(), "nothing is written when anything exists"

    assert main(["init", "--dir", str(tmp_path), "--force"]) == 0
    first = read_env(tmp_path / "veil.env")
    assert (tmp_path / "metrics.toml").read_text(encoding="utf-8") == METRICS_TOML
    (tmp_path / "veil.env").chmod(0o644)
    assert main(["init", "--dir", str(tmp_path), "--force"]) == 0
    assert read_env(tmp_path / "veil.env")["VEIL_READ_TOKEN"] != first["VEIL_READ_TOKEN"]
    assert stat.S_IMODE((tmp_path / "veil.env").stat().st_mode) == 0o600


def test_init_in_the_current_directory_prints_a_sourceable_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    assert "set -a; . ./veil.env; set +a" in capsys.readouterr().out
    assert (tmp_path / "metrics.toml").is_file()


def test_init_refuses_a_file_as_directory(tmp_path, capsys):
    (tmp_path / "plain").write_text("", encoding="utf-8")
    assert main(["init", "--dir", str(tmp_path / "plain")]) == 2
    assert "--dir" in capsys.readouterr().err


def test_a_collector_started_from_init_takes_its_tokens(tmp_path, capsys, collector_factory):
    """The first hour: init, serve with veil.env, upload with the upload token, see it."""
    assert main(["init", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    tokens = read_env(tmp_path / "veil.env")
    registry = Registry.load(tmp_path / "metrics.toml")
    collector = collector_factory(registry, env=tokens)
    assert "--read-token" not in collector.command()
    assert "--upload-token" not in collector.command()
    metric = registry["dark_mode"]
    encoder = make_encoder(metric, os.urandom(32), 0)
    batch = make_batch(os.urandom(16).hex(), [make_report(
        os.urandom(16).hex(), "dark_mode", encoder.cohort, encoder.encode(True),
        metric.params.fingerprint)])
    url = collector.url
    assert requests.post(url + "/v1/reports", json=batch, timeout=10).status_code == 401
    upload = {"Authorization": f"Bearer {tokens['VEIL_UPLOAD_TOKEN']}"}
    answer = requests.post(url + "/v1/reports", json=batch, headers=upload, timeout=10)
    assert answer.status_code == 200 and answer.json()["accepted"] == 1
    assert main(["stats", "--server", url, "--token", tokens["VEIL_READ_TOKEN"],
                 "--metric", "dark_mode", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "metric,day,reports" and rows[1].startswith("dark_mode,")
    assert rows[1].endswith(",1") and len(rows) == 2
