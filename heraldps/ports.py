"""One process per port: every port a heraldps process listens on is its own.

gRPC sets ``SO_REUSEPORT`` on the sockets it listens on by default, so a second
shard started on a port another shard serves would bind it too and take some of
its new clients (an empty duplicate, silently). Our servers turn that off
(``NO_REUSEPORT``), probe the port first so the refusal is one line of ours, and
check the port gRPC reports; /metrics (``serve_metrics``) is checked the same way.
A port outside 0..65535 is refused before anything binds (gRPC would take it
modulo 65536). See docs/operations.md ("Ports").
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable
from http.server import HTTPServer

from prometheus_client import CollectorRegistry, start_http_server

MAX_PORT = 65535
# Server option: no second process may bind a port this server listens on.
NO_REUSEPORT = [("grpc.so_reuseport", 0)]


def check_port(port: int | None, flag: str) -> None:
    """ValueError naming ``flag`` for a port outside 0..65535 (None: not set)."""
    if port is not None and not 0 <= port <= MAX_PORT:
        raise ValueError(f"{flag} {port} is outside 0..{MAX_PORT}; give a port in that range")


class PortInUse(OSError):
    """A port another process (or socket) holds; the message names it and says what to do."""

    def __init__(self, what: str, host: str, port: int, flag: str) -> None:
        super().__init__(
            errno.EADDRINUSE,
            f"{what}: port {port} on {host} is in use by another process; stop that "
            f"process or pick another {flag} (0: a free one)",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def _probe(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now, as a server without SO_REUSEPORT would."""
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return True  # an unresolvable host: gRPC's own bind reports it
    for family, kind, proto, _, address in infos:
        with contextlib.closing(socket.socket(family, kind, proto)) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's own
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
    return True


def bind_grpc(
    add_port: Callable[[str], int], host: str, port: int, what: str, flag: str = "--port"
) -> int:
    """Bind a server (made with ``NO_REUSEPORT``) to ``host:port`` with ``add_port`` (its
    ``add_insecure_port``, or a TLS equivalent taking the address); the port bound.

    PortInUse when the port is taken; OSError when gRPC binds nothing (it returns 0 or
    raises RuntimeError, by version)."""
    check_port(port, flag)
    if port and not _probe(host, port):
        raise PortInUse(what, host, port, flag)
    address = f"{host}:{port}"
    try:
        bound = int(add_port(address))
    except RuntimeError:
        bound = 0
    if bound == 0:
        if port and not _probe(host, port):
            raise PortInUse(what, host, port, flag)
        raise OSError(f"{what}: cannot listen on {address}; check --host and {flag}")
    return bound


def serve_metrics(
    port: int, host: str, registry: CollectorRegistry, what: str, flag: str = "--metrics-port"
) -> HTTPServer:
    """Serve /metrics of ``registry`` on ``host:port`` (0: a free port); PortInUse when
    another process holds the port."""
    check_port(port, flag)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(what, host, port, flag) from None
        raise OSError(f"{what}: cannot serve /metrics on {host}:{port} ({exc})") from None
    return server
