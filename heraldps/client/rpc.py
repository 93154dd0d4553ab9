"""RPCs as futures: one call with its retries, and many calls as one result.

The client's only async mechanism. ``start`` issues a unary RPC as a gRPC
future and resolves a ``concurrent.futures.Future`` with its response, or with
the typed error (``heraldps.errors``) once no retry is allowed; ``gather``
resolves when every part is done, combining the responses in part order. No
thread waits on a call: completions arrive as gRPC callbacks, and only a
retry's backoff runs on a timer thread. Callbacks (ours, and those added to
the futures we return) run on gRPC's thread of the channel, so blocking there
on another call would stall it for good: ``wait`` refuses that with an error.

Retry rule: an idempotent call is retried with exponential backoff and jitter
on ``UNAVAILABLE``, at most ``retries`` times; any other call never (a retried
push could apply a gradient twice).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import grpc

from heraldps.errors import Cancelled, HeraldError, Unavailable, error_from_rpc

_callback = threading.local()  # .active: this thread is running a gRPC callback of ours

Part = TypeVar("Part")
Result = TypeVar("Result")
Args = ParamSpec("Args")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry an idempotent call on ``UNAVAILABLE``."""

    retries: int = 5
    backoff_seconds: float = 0.05

    def delay(self, error: HeraldError, attempt: int, idempotent: bool) -> float | None:
        """Seconds to wait before retry ``attempt + 1``; None: give up with ``error``."""
        if not idempotent or not isinstance(error, Unavailable) or attempt >= self.retries:
            return None
        return self.backoff_seconds * (2.0**attempt) * (0.5 + random.random())


def start(
    rpc: grpc.UnaryUnaryMultiCallable[Any, Any],
    request: Any,
    *,
    timeout: float,
    address: str,
    idempotent: bool,
    policy: RetryPolicy,
) -> Future[Any]:
    """Start ``rpc(request)`` now; the future holds the response or a typed error."""
    out: Future[Any] = _running()

    def attempt(n: int) -> None:
        try:
            call = rpc.future(request, timeout=timeout)
        except BaseException as exc:  # e.g. a closed channel: fail the future, never hang
            out.set_exception(exc)
            return
        call.add_done_callback(lambda done: in_callback(finish, done, n))

    def finish(done: grpc.Future[Any], n: int) -> None:
        try:
            out.set_result(done.result())
            return
        except grpc.RpcError as err:
            error = error_from_rpc(err, address)
        except grpc.FutureCancelledError:
            out.set_exception(Cancelled("cancelled before an answer", reason="", address=address))
            return
        except BaseException as exc:
            out.set_exception(exc)
            return
        wait = policy.delay(error, n, idempotent)
        if wait is None:
            out.set_exception(error)
            return
        timer = threading.Timer(wait, attempt, (n + 1,))
        timer.daemon = True
        timer.start()

    attempt(0)
    return out


def gather(
    parts: Sequence[Future[Part]], combine: Callable[[list[Part]], Result]
) -> Future[Result]:
    """One future for all ``parts``: ``combine`` of their results in order, once every
    part is done, or the first failed part's error (in part order)."""
    out: Future[Result] = _running()
    remaining = len(parts)
    lock = threading.Lock()

    def resolve() -> None:
        try:
            out.set_result(combine([part.result() for part in parts]))
        except BaseException as exc:
            out.set_exception(exc)

    def one_done(_: Future[Part]) -> None:
        nonlocal remaining
        with lock:
            remaining -= 1
            last = remaining == 0
        if last:
            resolve()

    if not parts:
        resolve()
    for part in parts:
        part.add_done_callback(one_done)
    return out


def wait(future: Future[Result]) -> Result:
    """``future.result()``, refused inside a callback, where it would wait forever."""
    if getattr(_callback, "active", False):
        raise RuntimeError(
            "a blocking PSClient call inside a callback of a PSClient future would stall "
            "gRPC's thread for good; call it after .result(), or from another thread"
        )
    return future.result()


def in_callback(function: Callable[Args, None], *args: Args.args, **kwargs: Args.kwargs) -> None:
    """Run ``function`` marked as a gRPC callback (see ``wait``)."""
    outer = getattr(_callback, "active", False)
    _callback.active = True
    try:
        function(*args, **kwargs)
    finally:
        _callback.active = outer


def reports_errors(method: Callable[Args, Future[Result]]) -> Callable[Args, Future[Result]]:
    """Errors raised before ``method``'s future exists (bad arguments, an unknown table)
    land in a failed future too: an async call reports every error the same way."""

    @functools.wraps(method)
    def wrapper(*args: Args.args, **kwargs: Args.kwargs) -> Future[Result]:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            out: Future[Result] = _running()
            out.set_exception(exc)
            return out

    return wrapper


def stream(
    call: Callable[[], Iterator[Any]], *, address: str, idempotent: bool, policy: RetryPolicy
) -> list[Any]:
    """Every message of a server-streaming call (``call()`` starts it), with the same
    retry rule; a stream is read to its end before anything is returned, so a retry
    never duplicates messages."""
    attempt = 0
    while True:
        try:
            return list(call())
        except grpc.RpcError as err:
            error = error_from_rpc(err, address)
        wait = policy.delay(error, attempt, idempotent)
        if wait is None:
            raise error
        time.sleep(wait)
        attempt += 1


def _running() -> Future[Any]:
    """A future in the RUNNING state: resolved only by our callbacks, never cancelled."""
    out: Future[Any] = Future()
    out.set_running_or_notify_cancel()
    return out
