"""How a process is secured, as a server and as a client: TLS files and tokens.

``ServerSecurity`` is what a server is started with (its TLS files, the token
files it accepts, whether it serves reflection); ``ClientSecurity`` is what a
client presents. Both hold paths, never secrets, so a config that holds them
can be logged. ``open_channel`` and ``ServerSecurity.bind`` are the only places
that choose between plaintext and TLS. See docs/security.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from heraldps.auth import BearerToken, RoleCheck, Tokens, read_token
from heraldps.permissions import check_private
from heraldps.ports import bind_grpc
from heraldps.tls import TlsFiles


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: TLS files (to verify servers and, for mutual TLS, its
    own certificate) and a bearer token for its role, from ``token_file`` or given
    as ``token`` (from Python)."""

    tls: TlsFiles = field(default_factory=TlsFiles)
    token_file: str | None = None
    token: str | None = field(default=None, repr=False)
    strict_permissions: bool = False  # refuse, not warn, when a secret file is too open

    def check(self) -> None:
        """At start: warn about (strict: refuse) a token or key file others could read."""
        files = [(self.token_file, "--token-file"), (self.tls.key, "--tls-key")]
        check_private(files, self.strict_permissions)

    def bearer(self) -> str | None:
        """The token to send, if any (read from ``token_file`` each time it is asked)."""
        if self.token:
            return self.token
        return read_token(self.token_file, "--token-file") if self.token_file else None


PLAIN = ClientSecurity()


def open_channel(
    address: str, options: Sequence[tuple[str, Any]] = (), security: ClientSecurity = PLAIN
) -> grpc.Channel:
    """A channel to ``address``: TLS when ``security.tls`` is enabled, and every call
    carrying the bearer token when one is set."""
    tls = security.tls
    if tls.enabled:
        channel = grpc.secure_channel(
            address, tls.channel_credentials(), options=[*options, *tls.channel_options()]
        )
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    token = security.bearer()
    if token:
        channel = grpc.intercept_channel(channel, BearerToken(token))
    return channel


@dataclass(frozen=True)
class ServerSecurity:
    """What a server is started with. The default is today's: plaintext, no tokens,
    reflection on (for a trusted network only)."""

    tls: TlsFiles = field(default_factory=TlsFiles)
    admin_token_file: str | None = None
    worker_token_file: str | None = None
    reflection: bool = True
    strict_permissions: bool = False  # refuse, not warn, when a secret file is too open

    def tokens(self) -> Tokens:
        return Tokens.from_files(self.admin_token_file, self.worker_token_file)

    def check(self) -> None:
        """Read every file now, so a bad one fails the start with the flag's name; warn
        about (strict: refuse) a token or key file others could read."""
        check_private(
            [(self.admin_token_file, "--admin-token-file"),
             (self.worker_token_file, "--worker-token-file"), (self.tls.key, "--tls-key")],
            self.strict_permissions,
        )  # fmt: skip
        self.tokens()
        if self.tls.enabled:
            self.tls.server_credentials()

    def interceptors(self, admin_methods: Sequence[str]) -> list[grpc.ServerInterceptor]:
        """The role check, when tokens are configured."""
        tokens = self.tokens()
        return [RoleCheck(tokens, admin_methods)] if tokens.enabled else []

    def bind(
        self, server: grpc.Server, host: str, port: int, what: str, flag: str = "--port"
    ) -> int:
        """Add a TLS or plaintext port to ``server`` (made with ``ports.NO_REUSEPORT``);
        the port bound. OSError naming the port when it is in use (``heraldps.ports``)."""
        if self.tls.enabled:
            credentials = self.tls.server_credentials()
            return bind_grpc(
                lambda a: server.add_secure_port(a, credentials), host, port, what, flag
            )
        return bind_grpc(server.add_insecure_port, host, port, what, flag)


OPEN = ServerSecurity()
