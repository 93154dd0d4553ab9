"""One decorator for every heraldps RPC handler: timing, metrics, errors -> statuses.

A domain error's class gives the code (``HeraldError.code``); the status also
carries an AIP-193 ``ErrorInfo`` (``heraldps.errors.to_rpc_status``), so any
gRPC client reads the reason, and ``PSClient`` raises the same class again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from heraldps.errors import HeraldError, Internal, to_rpc_status

log = logging.getLogger(__name__)


class RecordsRpcs(Protocol):
    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None: ...


Handler = TypeVar("Handler", bound=Callable[..., Any])


@contextlib.contextmanager
def _handling(servicer: RecordsRpcs, name: str, context: grpc.ServicerContext) -> Iterator[None]:
    started = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        yield
    except Exception as exc:
        # An error with an address was answered by a server this one called (the
        # scheduler's PSClient): passing its code on would blame our caller, so it is
        # an internal error here, like any bug.
        if isinstance(exc, HeraldError) and not exc.address:
            error: HeraldError = exc
        else:
            log.exception("%s failed", name)
            error = Internal(f"{name}: internal error (see the server's log)")
        code = error.code
        context.abort_with_status(to_rpc_status(error))
    finally:
        servicer.record_rpc(name, code, time.perf_counter() - started)


def unary_handler(method: Handler) -> Handler:
    """Time a unary handler, record it by status code, turn domain errors into statuses."""

    @functools.wraps(method)
    def wrapper(self: RecordsRpcs, request: Any, context: grpc.ServicerContext) -> Any:
        with _handling(self, method.__name__, context):
            return method(self, request, context)

    return wrapper  # type: ignore[return-value]


def stream_handler(method: Handler) -> Handler:
    """``unary_handler`` for server-streaming handlers (generators)."""

    @functools.wraps(method)
    def wrapper(self: RecordsRpcs, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with _handling(self, method.__name__, context):
            yield from method(self, request, context)

    return wrapper  # type: ignore[return-value]
