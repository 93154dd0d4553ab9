"""Domain errors -> gRPC status codes, in one table, for every heraldps servicer."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from heraldps.errors import (
    FailedPrecondition,
    HeraldError,
    InvalidArgument,
    ResourceExhausted,
    StaleIteration,
    TableExists,
    UnknownTable,
    VersionConflict,
)

log = logging.getLogger(__name__)

STATUS_OF: dict[type[HeraldError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownTable: grpc.StatusCode.NOT_FOUND,
    TableExists: grpc.StatusCode.ALREADY_EXISTS,
    StaleIteration: grpc.StatusCode.FAILED_PRECONDITION,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    VersionConflict: grpc.StatusCode.ABORTED,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_of(exc: HeraldError) -> grpc.StatusCode:
    """The code of the most specific class of ``exc`` in STATUS_OF."""
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


class RecordsRpcs(Protocol):
    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None: ...


Handler = TypeVar("Handler", bound=Callable[..., Any])


@contextlib.contextmanager
def _handling(servicer: RecordsRpcs, name: str, context: grpc.ServicerContext) -> Iterator[None]:
    started = time.perf_counter()
    code = grpc.StatusCode.OK
    try:
        yield
    except HeraldError as exc:
        code = status_of(exc)
        context.abort(code, str(exc))
    except Exception:
        code = grpc.StatusCode.INTERNAL
        log.exception("%s failed", name)
        context.abort(code, f"{name}: internal error (see the server's log)")
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
