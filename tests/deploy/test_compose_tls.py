"""deploy/docker-compose.tls.yml on top of deploy/docker-compose.yml: accepted by
docker-compose, every variable a flag of its role, each container holding only the token
of its role, and deploy/tls/make-certs.sh's files serving real mutual TLS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from heraldps.client import PSClient
from heraldps.errors import PermissionDenied
from heraldps.optim import SGD
from heraldps.security import ClientSecurity, ServerSecurity
from heraldps.tls import TlsFiles
from launcher.cli import build_parser
from launcher.cli.env_parser import flag_actions, subcommands
from ps_server.server import PSConfig, PSServer
from tests.deploy.compose import COMPOSE_FILE, DEPLOY
from tests.tools import require_tool

TLS_FILE = DEPLOY / "docker-compose.tls.yml"
MAKE_CERTS = DEPLOY / "tls" / "make-certs.sh"
WRITTEN = {"ca.crt", "heraldps.crt", "heraldps.key", "admin.token", "worker.token"}
TOKENS = "/etc/heraldps/tokens/"


def merged() -> dict[str, Any]:
    compose = require_tool("docker-compose", "apt-get install docker-compose (Debian, v1.29)")
    result = subprocess.run(
        [compose, "-f", str(COMPOSE_FILE), "-f", str(TLS_FILE), "config"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_the_override_secures_every_heraldps_service() -> None:
    services = {
        name: spec
        for name, spec in merged()["services"].items()
        if str(spec.get("image", "")).startswith("heraldps")
    }
    assert set(services) == {"ps-0", "ps-1", "scheduler", "worker-0", "worker-1", "feed"}
    parser = build_parser()
    for name, spec in services.items():
        role = spec["command"][0]
        env = {k: str(v) for k, v in spec["environment"].items()}
        known = {n for n, _ in flag_actions(parser)}
        known |= {n for n, _ in flag_actions(subcommands(parser)[role])}
        assert {k for k in env if k.startswith("HERALDPS_")} <= known, name
        binds = [str(v).split(":")[:2] for v in spec["volumes"]]  # v1 prints short syntax
        sources = {Path(src).name: target for src, target in binds if "/tls/" in src}
        assert set(sources) <= WRITTEN, name
        mounted = set(sources.values())
        for key in ("HERALDPS_TLS_CERT", "HERALDPS_TLS_KEY", "HERALDPS_TLS_CA"):
            assert env[key] in mounted, f"{name}: {key} is not mounted"
        if role in ("ps", "scheduler"):
            assert env["HERALDPS_NO_REFLECTION"] == "true"
            assert {env["HERALDPS_ADMIN_TOKEN_FILE"], env["HERALDPS_WORKER_TOKEN_FILE"]} <= mounted
        if role == "worker":
            assert env["HERALDPS_TOKEN_FILE"] == TOKENS + "worker.token"
            assert "admin.token" not in sources, f"{name} must not hold the admin token"
        if role in ("scheduler", "feed"):
            assert env["HERALDPS_TOKEN_FILE"] == TOKENS + "admin.token"


def test_make_certs_files_serve_mutual_tls_with_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_tool("openssl", "install the openssl package (Debian: openssl)")
    out = subprocess.run(["bash", str(MAKE_CERTS), str(tmp_path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert {p.name for p in tmp_path.iterdir()} >= WRITTEN
    files = {n: str(tmp_path / n) for n in WRITTEN}
    tls = TlsFiles(files["heraldps.crt"], files["heraldps.key"], files["ca.crt"])
    security = ServerSecurity(tls, files["admin.token"], files["worker.token"], reflection=False)
    server = PSServer(PSConfig(port=0, grace_seconds=0, security=security))
    server.start()
    try:
        address = f"127.0.0.1:{server.port}"
        # The compose healthcheck, with the variables the override sets.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERALDPS_")}
        env.update(HERALDPS_TLS_CERT=tls.cert or "", HERALDPS_TLS_KEY=tls.key or "",
                   HERALDPS_TLS_CA=tls.ca or "")  # fmt: skip
        health = subprocess.run(
            [sys.executable, "-m", "launcher", "health", "--timeout", "5", address],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert health.returncode == 0, health.stderr
        # The certificate names the compose services: dial one by its compose name.
        named = TlsFiles(tls.cert, tls.key, tls.ca, server_name="ps-1")
        with PSClient([address], security=ClientSecurity(named, files["admin.token"])) as admin:
            admin.create_table("emb", dim=2, optimizer=SGD(lr=0.1))
        with PSClient([address], security=ClientSecurity(tls, files["worker.token"])) as worker:
            assert worker.pull("emb", [1])[0].shape == (1, 2)
            with pytest.raises(PermissionDenied):
                worker.save("snap")
    finally:
        server.stop(grace=0)
