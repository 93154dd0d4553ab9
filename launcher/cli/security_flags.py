"""The TLS, token and reflection flags, shared by every command that serves or calls gRPC.

Like every flag, each also comes from ``HERALDPS_<FLAG>`` (``HERALDPS_TLS_CERT``,
``HERALDPS_ADMIN_TOKEN_FILE``, ...). What they mean: docs/security.md.
"""

from __future__ import annotations

import argparse

from heraldps.security import ClientSecurity, ServerSecurity
from heraldps.tls import TlsFiles


def add_tls_arguments(
    p: argparse.ArgumentParser, client: bool = True, permissions: bool = True
) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca`` (and, for clients, ``--tls-server-name``;
    with ``permissions``, ``--strict-permissions``)."""
    g = p.add_argument_group("TLS (docs/security.md)")
    g.add_argument(
        "--tls-cert",
        default=None,
        help="PEM certificate chain this process shows (a server's; also its client "
        "certificate for mutual TLS); with --tls-key, the process serves TLS",
    )
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-ca",
        default=None,
        help="PEM CA certificates: clients verify servers with it; a server given it "
        "demands client certificates signed by it (mutual TLS)",
    )
    if permissions:
        g.add_argument(
            "--strict-permissions",
            action="store_true",
            help="refuse to start when a token or key file can be read by other users (by "
            "default a warning naming the file)",
        )
    if client:
        g.add_argument(
            "--tls-server-name",
            default=None,
            help="name to check the servers' certificates against, when it differs from "
            "the host dialled",
        )


def add_token_argument(p: argparse.ArgumentParser, role: str) -> None:
    """``--token-file``: the bearer token this process presents."""
    p.add_argument(
        "--token-file",
        default=None,
        help=f"file holding the bearer token this process presents ({role}); none: no token",
    )


def add_server_security_arguments(p: argparse.ArgumentParser) -> None:
    """TLS, the role tokens a server accepts, and ``--no-reflection``."""
    g = p.add_argument_group("roles (docs/security.md)")
    g.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding the admin token; when set, every RPC but health and reflection "
        "needs a token, and the admin RPCs need this one",
    )
    g.add_argument(
        "--worker-token-file",
        default=None,
        help="file holding the worker token: training RPCs only (needs --admin-token-file)",
    )
    p.add_argument(
        "--no-reflection", action="store_true", help="do not serve gRPC server reflection"
    )


def tls_files(args: argparse.Namespace) -> TlsFiles:
    return TlsFiles(
        args.tls_cert, args.tls_key, args.tls_ca, getattr(args, "tls_server_name", None)
    )


def server_security(args: argparse.Namespace) -> ServerSecurity:
    return ServerSecurity(
        TlsFiles(args.tls_cert, args.tls_key, args.tls_ca),
        args.admin_token_file,
        args.worker_token_file,
        reflection=not args.no_reflection,
        strict_permissions=args.strict_permissions,
    )


def client_security(args: argparse.Namespace) -> ClientSecurity:
    """What the command presents, its secret files checked (``heraldps.permissions``)."""
    security = ClientSecurity(
        tls_files(args),
        getattr(args, "token_file", None),
        strict_permissions=getattr(args, "strict_permissions", False),
    )
    security.check()
    return security
