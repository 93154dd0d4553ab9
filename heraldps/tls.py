"""TLS and mutual TLS for every heraldps gRPC server and client.

One set of three PEM files per process: ``cert`` and ``key`` (this process's
certificate chain and private key) and ``ca`` (the certificates it trusts). A
server with ``cert`` and ``key`` serves TLS; with ``ca`` too it also demands a
client certificate signed by that CA (mutual TLS). A client with ``ca``
verifies the server against it (without, against the system's roots); with
``cert`` and ``key`` it presents them to a server that demands one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


def _read(path: str, flag: str) -> bytes:
    """The bytes of a PEM file, or one message that names the flag and the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or exc
        raise ValueError(f"{flag} {path!r} cannot be read ({reason}); give a PEM file") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path!r} is not a PEM file (no '-----BEGIN' line)")
    return data


@dataclass(frozen=True)
class TlsFiles:
    """Paths of this process's certificate, key and trusted CA (each may be unset).

    ``server_name`` is for clients only: the name to check the server's certificate
    against when it differs from the host dialled (e.g. dialling an IP address).
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("--tls-cert and --tls-key go together: give both or neither")

    @property
    def enabled(self) -> bool:
        """True when any file is given: the process speaks TLS."""
        return bool(self.cert or self.ca)

    @property
    def mutual(self) -> bool:
        """As a server: clients must present a certificate signed by ``ca``."""
        return bool(self.ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS for a server; mutual TLS when ``ca`` is set."""
        if not (self.cert and self.key):
            raise ValueError(
                "a TLS server needs --tls-cert and --tls-key (its certificate and key); "
                "--tls-ca alone only makes it check clients"
            )
        chain = _read(self.cert, "--tls-cert")
        key = _read(self.key, "--tls-key")
        ca = _read(self.ca, "--tls-ca") if self.ca else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS for a client: verify the server with ``ca``; present ``cert`` if given."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "--tls-ca") if self.ca else None,
            private_key=_read(self.key, "--tls-key") if self.key else None,
            certificate_chain=_read(self.cert, "--tls-cert") if self.cert else None,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """The server-name override, when one is set."""
        if not self.server_name:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]
