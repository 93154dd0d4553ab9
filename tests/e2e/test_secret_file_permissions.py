"""Token and key files that other users could read: a warning at start naming the file and
``chmod 600``, or, with ``--strict-permissions`` (HERALDPS_STRICT_PERMISSIONS), a refusal
to start (issue 23, section 3). Real files, real processes."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certs import make_pki
from tests.processes import heraldps, port, start, stop_all
from tests.tools import require_tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    stop_all(started)


def _token(path: Path, mode: int, text: str = TOKEN) -> str:
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def _served_log(
    args: list[str], tmp_path: Path, procs: list[subprocess.Popen[bytes]], env: dict[str, str]
) -> str:
    """Start ``heraldps ARGS`` until it serves; its log so far."""
    port_file = tmp_path / "ps.port"
    proc = start("ps", [*args, "--port", "0", "--port-file", str(port_file)], tmp_path, env)
    procs.append(proc)
    port(port_file, proc, tmp_path, "ps")
    return (tmp_path / "ps.log").read_text()


def _warnings(log: str, path: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line and path in line]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERALDPS_")}
    env.update(extra)
    return env


def test_a_token_readable_by_others_warns_once_and_serves(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    admin = _token(tmp_path / "admin.token", 0o644)
    worker = _token(tmp_path / "worker.token", 0o600, TOKEN[::-1])
    log = _served_log(
        ["ps", "--admin-token-file", admin, "--worker-token-file", worker], tmp_path, procs, _env()
    )
    lines = _warnings(log, admin)
    assert len(lines) == 1, log
    assert "chmod 600" in lines[0] and "--admin-token-file" in lines[0]
    assert not _warnings(log, worker)  # 0600: nothing to say


@pytest.mark.parametrize("how", ["flag", "env"])
def test_strict_permissions_refuse_to_start(tmp_path: Path, how: str) -> None:
    admin = _token(tmp_path / "admin.token", 0o644)
    args = ["ps", "--port", "0", "--admin-token-file", admin]
    env = _env()
    if how == "flag":
        args.append("--strict-permissions")
    else:
        env["HERALDPS_STRICT_PERMISSIONS"] = "1"
    done = subprocess.run(heraldps(*args), capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and admin in lines[0] and "chmod 600" in lines[0], done.stderr
    assert "serving on" not in done.stdout + done.stderr


def test_a_tls_key_readable_by_others_warns_and_strict_refuses(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    pki = make_pki(tmp_path / "pki")
    Path(pki.server_key).chmod(0o644)
    tls = ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key]
    log = _served_log(["ps", *tls], tmp_path, procs, _env())
    lines = _warnings(log, pki.server_key)
    assert len(lines) == 1 and "--tls-key" in lines[0] and "chmod 600" in lines[0], log
    done = subprocess.run(
        heraldps("ps", "--port", "0", *tls, "--strict-permissions"),
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 2 and pki.server_key in done.stderr, done.stderr


def test_a_client_token_is_checked_too(tmp_path: Path) -> None:
    """The scheduler presents --token-file to the shards: the same rule for that file."""
    token = _token(tmp_path / "admin.token", 0o644)
    done = subprocess.run(
        heraldps("scheduler", "--workers", "1", "--cache-rows", "4", "--port", "0",
                 "--ps", "127.0.0.1:1", "--token-file", token, "--strict-permissions"),
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert token in done.stderr and "--token-file" in done.stderr and "chmod 600" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another group")
def test_a_group_other_than_the_process_own_counts_as_others(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """0640 is private when the group is the process's own (a user-private group, or a
    Kubernetes Secret's fsGroup); with any other group its members could read the token."""
    mine = _token(tmp_path / "mine.token", 0o640)
    os.chown(mine, -1, os.getegid())
    theirs = _token(tmp_path / "theirs.token", 0o640, TOKEN[::-1])
    os.chown(theirs, -1, os.getegid() + 1)
    log = _served_log(
        ["ps", "--admin-token-file", mine, "--worker-token-file", theirs], tmp_path, procs, _env()
    )
    assert not _warnings(log, mine), log
    assert len(_warnings(log, theirs)) == 1, log


def test_make_certs_writes_secrets_0600(tmp_path: Path) -> None:
    require_tool("openssl", "install the openssl package (Debian: openssl)")
    done = subprocess.run(["bash", str(DEPLOY / "tls" / "make-certs.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    for secret in ("admin.token", "worker.token", "heraldps.key", "ca.key"):
        assert modes[secret] == 0o600, (secret, oct(modes[secret]))
    for public in ("ca.crt", "heraldps.crt"):
        assert modes[public] == 0o644, (public, oct(modes[public]))
