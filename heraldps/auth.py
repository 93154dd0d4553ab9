"""Roles and bearer tokens: who may call which RPC.

Two roles. ``worker`` may call the training RPCs (pull, push, write-back,
versions, plans, reports); ``admin`` may call everything, including the RPCs
that replace or end a model (Save, Load, CreateTable, DropTable, Commit,
ExportIncremental, the scheduler's SubmitBatch and Finish). A caller proves its
role with ``authorization: Bearer <token>`` metadata; a server knows each
role's token from a file (``--admin-token-file``, ``--worker-token-file``).

A server with no tokens checks nothing (a trusted network only). Health and
reflection stay open either way: probes carry no token. Missing or unknown
token: UNAUTHENTICATED; a worker token on an admin RPC: PERMISSION_DENIED.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from heraldps.errors import HeraldError, PermissionDenied, Unauthenticated, to_rpc_status

log = logging.getLogger(__name__)

ADMIN = "admin"
WORKER = "worker"
METADATA_KEY = "authorization"
# The scheduler's per-worker secret (scheduler_service.sessions), sent back by the worker.
SESSION_METADATA_KEY = "heraldps-session"
MIN_TOKEN_CHARS = 16
# Services every caller may use: kubelet probes and grpcurl carry no token.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def read_token(path: str, flag: str) -> str:
    """The token in file ``path`` (surrounding whitespace dropped), checked for length."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{flag} {path!r} cannot be read ({exc}); give a file holding one token"
        ) from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ValueError(
            f"{flag} {path!r}: a token is one word of at least {MIN_TOKEN_CHARS} characters; "
            "make one with: openssl rand -hex 32"
        )
    return token


def _digest(token: str) -> bytes:
    """Compare digests, so the comparison's time says nothing about a token's length."""
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Tokens:
    """The tokens a server accepts, per role. No admin token: the server checks nothing."""

    admin: str | None = None
    worker: str | None = None

    def __post_init__(self) -> None:
        if self.worker and not self.admin:
            raise ValueError(
                "--worker-token-file needs --admin-token-file too: otherwise nobody could "
                "call the admin RPCs"
            )
        if self.worker and self.admin == self.worker:
            raise ValueError("the admin and the worker token must differ")

    @classmethod
    def from_files(cls, admin: str | None, worker: str | None) -> Tokens:
        return cls(
            read_token(admin, "--admin-token-file") if admin else None,
            read_token(worker, "--worker-token-file") if worker else None,
        )

    @property
    def enabled(self) -> bool:
        return self.admin is not None

    def role_of(self, presented: str) -> str | None:
        """The role ``presented`` grants, in constant time; None for an unknown token."""
        seen = _digest(presented)
        is_admin = self.admin is not None and hmac.compare_digest(seen, _digest(self.admin))
        is_worker = self.worker is not None and hmac.compare_digest(seen, _digest(self.worker))
        return ADMIN if is_admin else WORKER if is_worker else None


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def caller_role(tokens: Tokens, metadata: Any) -> str | None:
    """The role the call's bearer token grants (None: no token, or an unknown one), for a
    handler that lets the admin do more than a worker with the same RPC."""
    presented = _bearer(metadata)
    return None if presented is None else tokens.role_of(presented)


class _RefusalLog:
    """Logs a refusal once per caller host, method and reason, not once per call: a
    client without a token would otherwise flood the log. Bounded, so it cannot grow
    forever."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def note(self, peer: str, error: HeraldError) -> None:
        host = peer.rpartition(":")[0] or peer  # "ipv4:10.0.0.7:51234": any port of that host
        key = (host, str(error))  # the message names the method and the reason
        with self._lock:
            if key in self._seen or len(self._seen) >= self.LIMIT:
                return
            self._seen.add(key)
        log.warning("refused a call from %s: %s (logged once per host and method)", host, error)


def _refusal(
    handler: grpc.RpcMethodHandler[Any, Any], error: HeraldError, refusals: _RefusalLog
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that only answers ``error``, with the
    same ``ErrorInfo`` as every other heraldps error (``PSClient`` raises its class). It
    never parses the request: a refused caller's bytes are not worth decoding."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        refusals.note(context.peer(), error)
        context.abort_with_status(to_rpc_status(error))

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse, None, handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, None, handler.response_serializer)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, None, handler.response_serializer)
    return grpc.stream_stream_rpc_method_handler(refuse, None, handler.response_serializer)


class RoleCheck(grpc.ServerInterceptor):
    """Refuse every RPC whose caller lacks the role it needs, before the handler runs.

    ``admin_methods`` are full method names (``/heraldps.v1.ParameterServer/Save``);
    every other method of the server needs the worker role (or admin).
    """

    def __init__(self, tokens: Tokens, admin_methods: Collection[str]) -> None:
        self.tokens = tokens
        self.admin_methods = frozenset(admin_methods)
        self.refusals = _RefusalLog()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        method: str = details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        presented = _bearer(details.invocation_metadata)
        error: HeraldError | None = None
        if presented is None:
            error = Unauthenticated(
                f"{method} needs a token: send 'authorization: Bearer <token>' metadata "
                "(heraldps commands: --token-file)"
            )
        elif (role := self.tokens.role_of(presented)) is None:
            error = Unauthenticated(
                f"{method}: the token is not one this server accepts; check --token-file"
            )
        elif role != ADMIN and method in self.admin_methods:
            error = PermissionDenied(
                f"{method} needs the admin role; a worker token may only train "
                "(use the operator's admin token)"
            )
        return handler if error is None else _refusal(handler, error, self.refusals)


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._entry = (METADATA_KEY, f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._entry]
        return _CallDetails(
            details.method, details.timeout, metadata, details.credentials,
            details.wait_for_ready, details.compression,
        )  # fmt: skip

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any
