"""The heraldps errors, one hierarchy on both sides of the wire.

A core raises a domain error (``UnknownTable``, ``StaleIteration``, ...) *before*
mutating anything, so a rejected request leaves the stores untouched; its
message names the offending value and says what to do. The class carries the
gRPC status ``code`` (the one mapping from errors to codes) and a default
AIP-193 ``reason``. A server sends both (``to_rpc_status``: the code, the
message and a ``google.rpc.ErrorInfo`` detail that any gRPC client can read),
and a client turns a failed RPC back into the same class (``error_from_rpc``),
so callers catch types, never codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

# ErrorInfo.domain of every heraldps error: a reason is ours only in this domain.
DOMAIN = "heraldps.io"

# How much of a caller's input an error message echoes (``shown``), and the most any
# status carries: a status travels in HTTP/2 trailers, and one over gRPC's metadata
# limit (8-16 KiB) reaches the caller as RESOURCE_EXHAUSTED instead of the real error.
SHOWN_CHARS = 100
MAX_MESSAGE_CHARS = 2048
MAX_METADATA_CHARS = 256


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters with the
    full length said: messages echo names and paths a caller sent, which may be huge."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str | bytes) else "cut"
    return f"{text[:limit]}... ({size})"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} chars)"


class HeraldError(Exception):
    """Base class of every heraldps error.

    ``code``: the gRPC status code of the class. ``reason``: the AIP-193
    ``ErrorInfo.reason`` (UPPER_SNAKE_CASE; "" when a server sent none).
    ``metadata``: the ``ErrorInfo.metadata``. ``address``: the server that
    answered with this error ("" when raised locally).
    """

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init__(
        self,
        message: str = "",
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        address: str = "",
    ) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        self.metadata = dict(metadata or {})
        self.address = address

    @property
    def message(self) -> str:
        """The message alone (``str()`` prefixes the server's address)."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return f"{self.address}: {self.message}" if self.address else self.message


# ----- one class per status code ----------------------------------------------


class Cancelled(HeraldError):
    """The call was cancelled, usually by the caller (CANCELLED)."""

    code = grpc.StatusCode.CANCELLED
    reason = "CANCELLED"


class Unknown(HeraldError):
    """A server error without a known code (UNKNOWN)."""

    code = grpc.StatusCode.UNKNOWN
    reason = "UNKNOWN"


class InvalidArgument(HeraldError):
    """The request is malformed: wrong sizes, NaN/Inf, a bad spec (INVALID_ARGUMENT)."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"


class DeadlineExceeded(HeraldError):
    """No answer within the call's timeout (DEADLINE_EXCEEDED); raise the timeout."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"


class NotFound(HeraldError):
    """Something the request names does not exist (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExists(HeraldError):
    """Something the request creates exists already (ALREADY_EXISTS)."""

    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class PermissionDenied(HeraldError):
    """A proxy or server refused the caller (PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class ResourceExhausted(HeraldError):
    """A memory cap or size limit would be exceeded (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class FailedPrecondition(HeraldError):
    """The request is well formed but the system is not in a state to run it."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class Aborted(HeraldError):
    """A concurrency conflict; the request changed nothing (ABORTED)."""

    code = grpc.StatusCode.ABORTED
    reason = "ABORTED"


class OutOfRange(HeraldError):
    """A value past the valid range (OUT_OF_RANGE)."""

    code = grpc.StatusCode.OUT_OF_RANGE
    reason = "OUT_OF_RANGE"


class Unimplemented(HeraldError):
    """The server does not serve this method (UNIMPLEMENTED): a wrong address or version."""

    code = grpc.StatusCode.UNIMPLEMENTED
    reason = "UNIMPLEMENTED"


class Internal(HeraldError):
    """A bug on the server (INTERNAL): its log has the traceback."""

    code = grpc.StatusCode.INTERNAL
    reason = "INTERNAL"


class Unavailable(HeraldError):
    """The server is unreachable or shutting down (UNAVAILABLE); safe calls were retried."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


class DataLoss(HeraldError):
    """Unrecoverable data loss or corruption (DATA_LOSS)."""

    code = grpc.StatusCode.DATA_LOSS
    reason = "DATA_LOSS"


class Unauthenticated(HeraldError):
    """A proxy or server wants credentials (UNAUTHENTICATED)."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


# ----- domain errors: a class and a reason each -------------------------------


class CacheTooSmall(InvalidArgument):
    """A worker's mini-batch needs more distinct rows than its cache holds."""

    reason = "CACHE_TOO_SMALL"

    def __init__(self, worker: int, iteration: int, needed: int, capacity: int) -> None:
        super().__init__(
            f"worker {worker}'s mini-batch of iteration {iteration} needs {needed} rows, more "
            f"than its cache of {capacity}; raise the cache size or lower the batch size",
            metadata={
                "worker": str(worker),
                "iteration": str(iteration),
                "needed": str(needed),
                "capacity": str(capacity),
            },
        )

    @property
    def needed(self) -> int:
        return int(self.metadata.get("needed", -1))

    @property
    def capacity(self) -> int:
        return int(self.metadata.get("capacity", -1))


class UnknownTable(NotFound):
    """The named table does not exist on this shard."""

    reason = "TABLE_NOT_FOUND"

    def __init__(self, name: str, known: list[str]) -> None:
        names = sorted(known)
        listed = ", ".join(repr(k) for k in names[:10]) or "none"
        if len(names) > 10:
            listed += f" and {len(names) - 10} more"
        super().__init__(
            f"table {shown(name)} does not exist on this shard (tables: {listed}); "
            "create it with CreateTable first",
            metadata={"table": name},
        )

    @property
    def name(self) -> str:
        return self.metadata.get("table", "")


class TableExists(AlreadyExists):
    """A table with this name exists with a different spec."""

    reason = "TABLE_EXISTS"


class StaleIteration(FailedPrecondition):
    """A push or commit of an iteration older than the last committed one."""

    reason = "STALE_ITERATION"


class VersionConflict(Aborted):
    """A write-back whose base versions no longer match the stored rows."""

    reason = "VERSION_CONFLICT"


class Overloaded(ResourceExhausted):
    """The server was at its concurrency or stream limit and did not start the call, so
    any call, even a push, may be sent again (``heraldps.admission``)."""

    reason = "OVERLOADED"


_CODE_CLASSES: tuple[type[HeraldError], ...] = (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated,
)  # fmt: skip
_DOMAIN_CLASSES: tuple[type[HeraldError], ...] = (
    CacheTooSmall, UnknownTable, TableExists, StaleIteration, VersionConflict, Overloaded,
)  # fmt: skip
_BY_CODE = {cls.code: cls for cls in _CODE_CLASSES}
_BY_REASON = {cls.reason: cls for cls in (*_CODE_CLASSES, *_DOMAIN_CLASSES)}


def to_rpc_status(error: HeraldError) -> grpc.Status:
    """The status a server aborts with: code, message and an ``ErrorInfo`` detail, each cut
    to a size that fits gRPC's trailers (``MAX_MESSAGE_CHARS``, ``MAX_METADATA_CHARS``)."""
    metadata = {k: _cut(v, MAX_METADATA_CHARS) for k, v in error.metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    message = _cut(str(error), MAX_MESSAGE_CHARS)
    status = status_pb2.Status(code=error.code.value[0], message=message, details=[detail])
    return rpc_status.to_status(status)  # type: ignore[no-any-return]


def error_from_rpc(err: grpc.RpcError, address: str = "") -> HeraldError:
    """The typed error of a failed RPC to ``address`` (its ``__cause__`` is ``err``).

    The class is the one named by a heraldps ``ErrorInfo.reason`` (e.g.
    ``TABLE_NOT_FOUND`` -> ``UnknownTable``), else the one of the status code.
    """
    if isinstance(err, grpc.Call):
        code, message, info = err.code(), err.details() or "", _error_info(err)
    else:  # an RpcError that carries no status (not seen from grpcio's own calls)
        code, message, info = grpc.StatusCode.UNKNOWN, str(err), None
    reason = info.reason if info is not None else ""
    cls = _BY_REASON.get(reason) if info is not None and info.domain == DOMAIN else None
    if cls is None or cls.code != code:
        cls = _BY_CODE.get(code, Unknown)
    error = cls.__new__(cls)  # domain classes' own __init__ build the message; it is given
    metadata: dict[str, str] = dict(info.metadata) if info is not None else {}
    HeraldError.__init__(error, message, reason=reason, metadata=metadata, address=address)
    error.__cause__ = err
    return error


def _error_info(call: grpc.Call) -> error_details_pb2.ErrorInfo | None:
    """The ``ErrorInfo`` detail of a failed call's status, if the server sent one."""
    try:
        status = rpc_status.from_call(call)
    except ValueError:  # details inconsistent with the code or message: ignore them
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
