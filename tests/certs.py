"""Throwaway certificate authorities and certificates for TLS tests, made with ``openssl``.

``make_pki(dir)`` writes a CA, a server certificate for ``localhost`` and
``127.0.0.1`` (usable as a client certificate too, as the docs advise), a
client certificate, and a second CA with a client certificate of its own: the
stranger a mutual-TLS server must refuse. P-256 keys, valid for one day.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.tools import require_tool

_LEAF_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
)


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    stranger_cert: str  # signed by other_ca
    stranger_key: str


def _run(openssl: str, *args: str) -> None:
    subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)


def _ca(openssl: str, out: Path, name: str) -> tuple[Path, Path]:
    key, cert = out / f"{name}.key", out / f"{name}.crt"
    _run(
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _leaf(openssl: str, out: Path, name: str, ca: tuple[Path, Path]) -> tuple[str, str]:
    key, csr, cert = out / f"{name}.key", out / f"{name}.csr", out / f"{name}.crt"
    extensions = out / f"{name}.ext"
    extensions.write_text(_LEAF_EXTENSIONS)
    _run(
        openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    _run(
        openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(extensions),
    )  # fmt: skip
    return str(cert), str(key)


def make_pki(out: Path) -> Pki:
    openssl = require_tool("openssl", "install the openssl package (Debian: openssl)")
    out.mkdir(parents=True, exist_ok=True)
    ca, other = _ca(openssl, out, "ca"), _ca(openssl, out, "other-ca")
    server = _leaf(openssl, out, "server", ca)
    client = _leaf(openssl, out, "client", ca)
    stranger = _leaf(openssl, out, "stranger", other)
    return Pki(str(ca[0]), *server, *client, str(other[0]), *stranger)
