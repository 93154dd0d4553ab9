"""PSClient's retry rule: which failures are sent again, and how long it waits."""

from __future__ import annotations

from heraldps.client.rpc import GRPC_CONCURRENCY_LIMIT, RetryPolicy, not_started
from heraldps.errors import Overloaded, ResourceExhausted, Unavailable

POLICY = RetryPolicy(retries=2, backoff_seconds=0.1, overload_retries=4, max_backoff_seconds=0.3)


def test_refused_before_the_handler_ran_is_retried_even_for_a_push() -> None:
    ours = Overloaded("at the limit")
    grpcs = ResourceExhausted(GRPC_CONCURRENCY_LIMIT, reason="")  # grpcio's own, no ErrorInfo
    for error in (ours, grpcs):
        assert not_started(error)
        for attempt in range(4):
            pause = POLICY.delay(error, attempt, idempotent=False)
            assert pause is not None and 0 < pause <= 0.3 * 1.5  # capped, with jitter
        assert POLICY.delay(error, 4, idempotent=False) is None  # overload_retries spent


def test_the_handlers_own_resource_exhausted_is_never_retried() -> None:
    # memory budget, message size: the same request would fail again
    for error in (
        ResourceExhausted("needs 64.0 MiB more ... raise --memory-limit-gb"),
        ResourceExhausted(GRPC_CONCURRENCY_LIMIT),  # has a heraldps reason: from a handler
        ResourceExhausted("Received message larger than max", reason=""),
    ):
        assert not not_started(error)
        assert POLICY.delay(error, 0, idempotent=True) is None
        assert POLICY.delay(error, 0, idempotent=False) is None


def test_unavailable_is_retried_only_when_idempotent() -> None:
    error = Unavailable("connection refused")
    assert POLICY.delay(error, 0, idempotent=False) is None
    assert POLICY.delay(error, 1, idempotent=True) is not None
    assert POLICY.delay(error, 2, idempotent=True) is None
