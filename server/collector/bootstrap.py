"""``veil init``: a starter registry and fresh tokens for a new collector.

Writes ``metrics.toml`` (:data:`~veil.server.collector.starter.METRICS_TOML`, one
commented metric of every kind) and ``veil.env`` (mode 0600: a read token and an
upload token, in the ``NAME=value`` form that a shell, systemd's
``EnvironmentFile=`` and ``docker run --env-file`` all read), then prints the
commands to run next. Existing files are kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
from pathlib import Path

from veil.server.settings import ENVIRONMENT
from veil.shared.errors import ParameterError

#: the files ``veil init`` writes, by role
REGISTRY_FILE = "metrics.toml"
ENV_FILE = "veil.env"
#: bytes of randomness per token (``secrets.token_hex``: 64 hex digits, which never read as a command-line option)
TOKEN_BYTES = 32


def env_text(read_token: str, upload_token: str) -> str:
    """The ``veil.env`` file holding the two tokens."""
    return f"""\
# Secrets of a Veil collector, read from the environment by veil serve and veil stats.
# Keep this file private (mode 0600): the read token releases the counts,
# the upload token admits reports.
#   shell:   set -a; . ./{ENV_FILE}; set +a
#   systemd: EnvironmentFile=/etc/veil/{ENV_FILE}
#   Docker:  docker run --env-file {ENV_FILE} ...
# Rotate a token by giving veil serve the old and the new one, comma-separated, until
# every reader or client has the new one.
{ENVIRONMENT["read_token"]}={read_token}
{ENVIRONMENT["upload_token"]}={upload_token}
"""


def configure_init(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``veil init``."""
    parser.add_argument("--dir", default=".",
                        help=f"directory for {REGISTRY_FILE} and {ENV_FILE} (created if missing; "
                        "default: the current directory)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite existing files (new tokens replace the old ones)")


def run_init(args: argparse.Namespace) -> int:
    """Write the starter registry and the env file, then say what to run next."""
    from veil.server.collector.starter import METRICS_TOML

    directory = Path(args.dir)
    if directory.exists() and not directory.is_dir():
        raise ParameterError("dir", f"--dir {directory} is a file; give a directory")
    registry_path, env_path = directory / REGISTRY_FILE, directory / ENV_FILE
    existing = [path for path in (registry_path, env_path) if path.exists()]
    if existing and not args.force:
        names = " and ".join(str(path) for path in existing)
        raise ParameterError(
            "force", f"{names} already exist{'s' if len(existing) == 1 else ''}; nothing was "
            "written. Keep them, choose another --dir, or pass --force to overwrite them (new "
            "tokens lock out the readers and clients holding the old ones)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        registry_path.write_text(METRICS_TOML, encoding="utf-8")
        _write_private(env_path, env_text(secrets.token_hex(TOKEN_BYTES),
                                          secrets.token_hex(TOKEN_BYTES)))
    except OSError as exc:
        raise ParameterError("dir", f"cannot write to {directory}: {exc.strerror}") from None
    config, db = (shlex.quote(str(path)) for path in (registry_path, directory / "veil.db"))
    # "." searches $PATH for a bare file name: name the file with a directory
    env = shlex.quote(str(env_path) if "/" in str(env_path) else f"./{env_path}")
    print(f"""\
veil init: wrote {registry_path} (one commented metric of every kind: keep what you need)
veil init: wrote {env_path} (mode 0600: a fresh read token and upload token)
Next:
  1. edit {registry_path}, then check each metric's privacy cost:
       veil metrics --config {config}
  2. start the collector with the tokens of {env_path}:
       set -a; . {env}; set +a
       veil serve --config {config} --db {db}
  3. give clients the upload token: Client(url, state_dir, token=<{ENVIRONMENT["upload_token"]}>)
  4. watch the reports arrive, per metric and day:
       veil stats --db {db}
docs/deployment.md shows the same with Docker, systemd and a reverse proxy.""")
    return 0


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, whatever the umask (an existing
    file is truncated and its mode set to 0600 before the secrets go in)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


COMMANDS = [
    ("init", "write a starter metrics.toml and a veil.env with fresh tokens",
     configure_init, run_init),
]
