"""Admission control for a sync gRPC server: no client, idle or greedy, freezes it.

grpcio's sync server runs every RPC on one thread pool with an unbounded queue, so
16 streams whose clients stop reading, or a burst of 256 pulls, leave health checks
waiting behind them. ``Admission`` is a server interceptor that sorts every RPC
before its handler runs (and before its request is parsed):

- unary calls of our services: at most ``max_concurrent_rpcs`` at once, of which
  ``threads`` run and the rest wait in line (in arrival order); one more is answered
  RESOURCE_EXHAUSTED with reason ``OVERLOADED`` at once, so the client knows the
  server never started it and may retry any call, even a push;
- streams (server- or client-streaming): at most ``max_streams`` open, beyond that
  ``OVERLOADED`` too; a stream whose client does not take a message within
  ``stream_stall_seconds`` is cancelled, so an idle reader frees its thread;
- health checks skip the line and the limits.

After a big call (``heraldps.malloc``), freed memory is given back to the system.

Why not ``grpc.aio``: it runs a sync generator handler on a pool thread for the
stream's whole life too (``generator_to_async_generator``), so only rewriting every
handler as a coroutine would help, and the stores' calls block anyway. Bounding what
the sync server admits fixes the freezes with the handlers unchanged.

The thread pool holds a thread for every call admitted plus headroom, and grpcio's
own ``maximum_concurrent_rpcs`` is set to that size: nothing ever waits in the
executor's queue. Requests are parsed here, not by grpcio, so a request that does
not parse is INVALID_ARGUMENT (logged once per client host), not INTERNAL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from heraldps.errors import HeraldError, InvalidArgument, Overloaded, to_rpc_status
from heraldps.malloc import Trimmer

log = logging.getLogger(__name__)

# Health checks answer from a dict: they never wait in line, and a liveness probe
# must not fail because training traffic is heavy.
EXEMPT_METHODS = frozenset({"/grpc.health.v1.Health/Check"})
HEADROOM_THREADS = 16  # for health checks and for answering OVERLOADED quickly
WAIT_POLL_SECONDS = 5.0  # without a deadline: how often a waiter checks its caller
MAX_LOGGED_HOSTS = 4096

Reserve = Callable[[int, str], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class Limits:
    """How much one server takes on at once (``--threads``, ``--max-concurrent-rpcs``,
    ``--max-streams``, ``--stream-stall-seconds``)."""

    threads: int = 16
    max_concurrent_rpcs: int = 0  # 0: 4 x threads
    max_streams: int = 16
    stream_stall_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.max_concurrent_rpcs and self.max_concurrent_rpcs < self.threads:
            raise ValueError(
                f"--max-concurrent-rpcs {self.max_concurrent_rpcs} is below --threads "
                f"{self.threads}; use at least {self.threads} (0: 4 x threads)"
            )
        if self.max_streams < 1:
            raise ValueError(f"--max-streams must be >= 1, got {self.max_streams}")
        if not 0 < self.stream_stall_seconds < float("inf"):
            raise ValueError(
                f"--stream-stall-seconds must be a finite number > 0, got "
                f"{self.stream_stall_seconds}"
            )

    @property
    def unary(self) -> int:
        """Unary calls admitted at once: running plus waiting for a thread."""
        return self.max_concurrent_rpcs or 4 * self.threads

    @property
    def pool_threads(self) -> int:
        """Threads of the server's pool: one per admitted call, plus headroom."""
        return self.unary + self.max_streams + HEADROOM_THREADS


class _StallWatch:
    """Cancels a stream whose client has not taken its last message in time.

    grpcio's sync server sends a stream's message and only then asks the generator
    for the next one; a client that stops reading blocks that send, and the thread,
    for good once flow control's window is full. ``arm`` before a message is
    handed over, ``disarm`` when the generator resumes.
    """

    def __init__(self, seconds: float, on_stall: Callable[[], None]) -> None:
        self.seconds = seconds
        self.on_stall = on_stall
        self._armed: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, token: int, context: grpc.ServicerContext) -> None:
        with self._lock:
            self._armed[token] = (time.monotonic() + self.seconds, context)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
                self._thread.start()

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            now = time.monotonic()
            with self._lock:
                stalled = [t for t, (due, _) in self._armed.items() if due <= now]
                contexts = [self._armed.pop(t)[1] for t in stalled]
            for context in contexts:
                log.warning(
                    "cancelling a stream to %s: its client took no message for %.0f s",
                    context.peer(), self.seconds,
                )  # fmt: skip
                self.on_stall()
                context.cancel()


class Admission(grpc.ServerInterceptor):
    """The interceptor (see the module docstring); ``reserve`` (a shard's memory
    budget) is charged twice the request's size while the call runs."""

    def __init__(
        self, limits: Limits, registry: CollectorRegistry, reserve: Reserve | None = None
    ) -> None:
        self.limits = limits
        self.reserve = reserve
        self._slots = threading.BoundedSemaphore(limits.threads)  # wakes waiters in order
        self._lock = threading.Lock()
        self._unary = 0
        self._streams = 0
        self._tokens = 0
        self._held = 0  # bytes the requests admitted here hold against the memory budget
        self._logged_hosts: set[str] = set()
        self.rejected = Counter(
            "heraldps_rpc_rejected",
            "RPCs answered before their handler ran, by why (overloaded, stream_limit, "
            "unparsable) and stalled streams cancelled (stalled)",
            ["why"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "heraldps_rpc_in_flight", "RPCs admitted, by kind (unary, stream)", ["kind"],
            registry=registry,
        )  # fmt: skip
        self._trimmer = Trimmer()
        self._stalls = _StallWatch(
            limits.stream_stall_seconds, lambda: self.rejected.labels("stalled").inc()
        )

    @property
    def unary_in_flight(self) -> int:
        """Unary calls admitted and not yet answered (running or waiting for a thread)."""
        return self._unary

    @property
    def streams_open(self) -> int:
        return self._streams

    # ----- grpc.ServerInterceptor ------------------------------------------
    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        if handler.request_streaming:  # client streams (reflection): counted, parsed by grpcio
            parse, serialize = handler.request_deserializer, handler.response_serializer
            if handler.stream_stream is not None:
                return grpc.stream_stream_rpc_method_handler(
                    self._counted_stream(method, handler.stream_stream), parse, serialize
                )
            assert handler.stream_unary is not None
            return grpc.stream_unary_rpc_method_handler(
                self._counted_call(method, handler.stream_unary), parse, serialize
            )
        parse = handler.request_deserializer or _identity
        serialize = handler.response_serializer or _identity
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(method, handler.unary_stream, parse, serialize)
            )
        assert handler.unary_unary is not None
        return grpc.unary_unary_rpc_method_handler(
            self._unary_unary(method, handler.unary_unary, parse, serialize)
        )

    # ----- the wrappers -----------------------------------------------------
    def _unary_unary(
        self,
        method: str,
        behavior: Callable[[Any, grpc.ServicerContext], Any],
        parse: Callable[[bytes], Any],
        serialize: Callable[[Any], bytes],
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        exempt = method in EXEMPT_METHODS

        def run(raw: bytes, context: grpc.ServicerContext) -> bytes:
            if exempt:
                return serialize(behavior(self._parse(parse, raw, method, context), context))
            moved = len(raw)
            try:
                with self._admitted_unary(method, context), self._reserved(raw, method, context):
                    self._wait_for_thread(method, context)
                    try:
                        request = self._parse(parse, raw, method, context)
                        data = serialize(behavior(request, context))
                        moved += len(data)
                        return data
                    finally:
                        self._slots.release()
            finally:
                self._trimmer.after_call(moved)

        return run

    def _unary_stream(
        self,
        method: str,
        behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
        parse: Callable[[bytes], Any],
        serialize: Callable[[Any], bytes],
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        def run(raw: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            with self._admitted_stream(method, context):
                request = self._parse(parse, raw, method, context)
                token = self._token()
                try:
                    for message in behavior(request, context):
                        data = serialize(message)
                        self._stalls.arm(token, context)
                        yield data  # grpcio asks for the next one once this one is sent
                        self._stalls.disarm(token)
                finally:
                    self._stalls.disarm(token)

        return run

    def _counted_stream(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        def run(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            with self._admitted_stream(method, context):
                yield from behavior(requests, context)

        return run

    def _counted_call(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        def run(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            with self._admitted_stream(method, context):
                return behavior(requests, context)

        return run

    # ----- the limits -------------------------------------------------------
    @contextlib.contextmanager
    def _admitted_unary(self, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        with self._lock:
            admitted = self._unary < self.limits.unary
            if admitted:
                self._unary += 1
        if not admitted:
            self.rejected.labels("overloaded").inc()
            _abort(
                context,
                Overloaded(
                    f"{method}: the server is at its limit of {self.limits.unary} concurrent "
                    "calls (--max-concurrent-rpcs) and did not start this one; retry after a "
                    "backoff (PSClient does), or add shards",
                    metadata={"limit": str(self.limits.unary), "started": "false"},
                ),
            )
        self.in_flight.labels("unary").inc()
        try:
            yield
        finally:
            self.in_flight.labels("unary").dec()
            with self._lock:
                self._unary -= 1

    @contextlib.contextmanager
    def _admitted_stream(self, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        with self._lock:
            admitted = self._streams < self.limits.max_streams
            if admitted:
                self._streams += 1
        if not admitted:
            self.rejected.labels("stream_limit").inc()
            _abort(
                context,
                Overloaded(
                    f"{method}: the server has {self.limits.max_streams} streams open, its "
                    "limit (--max-streams), and did not start this one; close idle streams "
                    "or retry after a backoff",
                    metadata={"limit": str(self.limits.max_streams), "started": "false"},
                ),
            )
        self.in_flight.labels("stream").inc()
        try:
            yield
        finally:
            self.in_flight.labels("stream").dec()
            with self._lock:
                self._streams -= 1

    def _wait_for_thread(self, method: str, context: grpc.ServicerContext) -> None:
        """Take one of ``threads`` run slots, in arrival order; give up when the
        caller's deadline passes or it goes away.

        A waiter whose ``acquire`` times out goes to the back of the line, so it
        waits for its whole deadline at once, or ``WAIT_POLL_SECONDS`` without one.
        """
        while True:
            remaining = context.time_remaining()
            wait = WAIT_POLL_SECONDS if remaining is None else min(remaining, WAIT_POLL_SECONDS)
            if self._slots.acquire(timeout=max(wait, 0.0)):
                return
            if context.is_active() and (remaining is None or remaining > wait):
                continue
            self.rejected.labels("overloaded").inc()
            _abort(
                context,
                Overloaded(
                    f"{method}: the deadline passed while the call waited for one of "
                    f"the server's {self.limits.threads} threads; it was not started",
                    metadata={"limit": str(self.limits.threads), "started": "false"},
                ),
            )

    @contextlib.contextmanager
    def _reserved(self, raw: bytes, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        """The request's bytes (raw and parsed) against the memory budget, if any.

        Over the budget while other admitted requests hold part of it, the call is
        ``Overloaded`` (not started: the client backs off and retries, a push too), since
        the budget frees as they finish; with none held, the request cannot fit, and the
        budget's own error says so (not retried)."""
        nbytes = 2 * len(raw)
        with contextlib.ExitStack() as stack:
            if self.reserve is not None:
                try:
                    stack.enter_context(self.reserve(nbytes, f"{method}'s request"))
                except HeraldError as exc:
                    with self._lock:
                        held = self._held
                    if held:
                        self.rejected.labels("overloaded").inc()
                        exc = Overloaded(
                            f"{method}: {exc.message}; {held / 2**20:.1f} MiB of it is held "
                            "by calls in flight, so the call was not started: retry",
                            metadata={"started": "false"},
                        )
                    _abort(context, exc)
                with self._lock:
                    self._held += nbytes
                stack.callback(self._release_held, nbytes)
            yield

    def _release_held(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes

    def _parse(
        self, parse: Callable[[bytes], Any], raw: bytes, method: str, context: grpc.ServicerContext
    ) -> Any:
        try:
            return parse(raw)
        except Exception as exc:
            self.rejected.labels("unparsable").inc()
            host = context.peer().rpartition(":")[0]
            with self._lock:
                first = host not in self._logged_hosts
                if first and len(self._logged_hosts) < MAX_LOGGED_HOSTS:
                    self._logged_hosts.add(host)
            if first:
                log.warning(
                    "%s: a request from %s does not parse (%s); further ones from this host "
                    "are counted in heraldps_rpc_rejected_total{why=\"unparsable\"}, not logged",
                    method, host, exc,
                )  # fmt: skip
            _abort(
                context,
                InvalidArgument(
                    f"{method}: the request is not a valid protobuf message of this method "
                    f"({len(raw)} bytes: {exc}); check the client's stubs against "
                    "proto/heraldps/v1"
                ),
            )

    def _token(self) -> int:
        with self._lock:
            self._tokens += 1
            return self._tokens


def _identity(message: Any) -> Any:
    return message


def _abort(context: grpc.ServicerContext, error: HeraldError) -> None:
    """End the call with ``error``'s status (raises, as ``context.abort`` does)."""
    context.abort_with_status(to_rpc_status(error))
