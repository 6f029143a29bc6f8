"""deploy/: the systemd unit parses, and the Dockerfile, the unit and the nginx snippet use
options, paths and limits the collector really has."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from veil.server.collector.config import DEFAULTS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
HARDENING = ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
             "CapabilityBoundingSet", "RestrictAddressFamilies", "SystemCallFilter")
SIZES = {"k": 1024, "m": 1024**2, "g": 1024**3}


@pytest.fixture(scope="module")
def serve_help() -> str:
    """``veil serve --help``."""
    return subprocess.run([sys.executable, "-m", "veil.server.cli", "serve", "--help"],
                          capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.fixture(scope="module")
def serve_options(serve_help) -> set[str]:
    """The options ``veil serve --help`` describes, each where its entry begins a line."""
    return set(re.findall(r"^ {2}(?:-\w, )?(--[a-z][a-z-]*)", serve_help, re.MULTILINE))


def unit() -> configparser.ConfigParser:
    """deploy/veil.service as sections of keys (repeated keys keep the last value)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None,
                                       comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEPLOY / "veil.service").read_text(encoding="utf-8"))
    return parser


def defaults_of(help_text: str) -> set[str]:
    """The ``(default: $VARIABLE)`` notes of a command's help, however its lines wrap."""
    return set(re.findall(r"\(default: \$\w+\)", " ".join(help_text.split())))


def options_of(command: str) -> list[str]:
    """The long options in ``command``, whole: ``--db`` in ``--db x``, nothing in ``--db-x``."""
    return re.findall(r"(?<![\w-])(--[a-z][a-z-]*)(?![\w-])", command)


def test_the_systemd_unit_is_complete_and_hardened(serve_help, serve_options):
    service = unit()
    assert {"Unit", "Service", "Install"} <= set(service.sections())
    settings = service["Service"]
    assert settings["EnvironmentFile"] == "/etc/veil/veil.env"
    assert settings["Restart"] == "on-failure"
    assert settings["StateDirectory"] == "veil"
    assert settings.get("User") or settings.get("DynamicUser") == "yes"
    for key in HARDENING:
        assert key in settings, key
    assert settings["ProtectSystem"] == "strict"
    start = settings["ExecStart"]
    assert re.match(r"\S+/veil serve ", start)
    for option in options_of(start):
        assert option in serve_options, option
    # --config and --db come from the unit's environment, which veil serve reads
    text = (DEPLOY / "veil.service").read_text(encoding="utf-8")
    assert "Environment=VEIL_DB=/var/lib/veil/" in text
    assert "Environment=VEIL_CONFIG=/etc/veil/" in text
    assert {"(default: $VEIL_DB)", "(default: $VEIL_CONFIG)"} <= defaults_of(serve_help)
    assert "--db" not in start and "--config" not in start


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_every_line_of_the_unit(tmp_path):
    veil = Path(sys.executable).with_name("veil")
    text = (DEPLOY / "veil.service").read_text(encoding="utf-8")
    copy = tmp_path / "veil.service"  # the unit with this machine's veil in ExecStart
    copy.write_text(text.replace("/opt/veil/bin/veil", str(veil)), encoding="utf-8")
    verified = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                              text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def test_the_dockerfile_runs_veil_serve_as_a_user_with_a_volume_and_a_health_check(
        serve_help, serve_options, client):
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line for line in re.sub(r"\\\n", " ", text).splitlines()
                    if line and not line.startswith("#")]
    first = {line.split()[0]: line.split(None, 1)[1] for line in reversed(instructions)}
    assert first["FROM"] == "python:3.11-slim"
    assert '".[server]"' in first["RUN"]
    assert first["USER"] not in ("root", "0")
    assert json.loads(first["VOLUME"]) == ["/var/lib/veil"]
    assert "VEIL_DB=/var/lib/veil/" in text and "VEIL_CONFIG=" in text
    assert {"(default: $VEIL_DB)", "(default: $VEIL_CONFIG)"} <= defaults_of(serve_help)

    entrypoint, command = json.loads(first["ENTRYPOINT"]), json.loads(first["CMD"])
    assert entrypoint[:2] == ["veil", "serve"]
    serve = " ".join(entrypoint)
    for option in options_of(serve) + [arg for arg in command if arg.startswith("--")]:
        assert option in serve_options, option
    health = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", first["HEALTHCHECK"])
    assert health and f"--port {health.group(1)}" in serve
    assert client.get(health.group(2)).status_code == 200


def test_the_nginx_snippet_matches_the_collector(serve_options):
    text = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    size = re.search(r"client_max_body_size\s+(\d+)([kmg]?);", text)
    assert size
    limit = int(size.group(1)) * SIZES.get(size.group(2), 1)
    assert DEFAULTS["MAX_CONTENT_LENGTH"] <= limit <= 2 * DEFAULTS["MAX_CONTENT_LENGTH"]
    assert re.search(r"proxy_set_header X-Forwarded-For \$remote_addr;", text)
    assert "--proxy-hops 1" in unit()["Service"]["ExecStart"] and "--proxy-hops" in serve_options
    assert re.search(r"location = /v1/reports \{\s+access_log off;", text)
    for log_format in re.findall(r"log_format\s+\w+\s+([^;]+);", text):
        assert "remote_addr" not in log_format and "forwarded_for" not in log_format
        assert "user_agent" not in log_format
    upstream = re.search(r"server 127\.0\.0\.1:(\d+);", text)
    assert upstream and f"--port {upstream.group(1)}" in unit()["Service"]["ExecStart"]
    assert "ssl_certificate " in text and "listen 443 ssl" in text
