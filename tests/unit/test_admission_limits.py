"""The admission limits' defaults and checks (``heraldps.admission.Limits``)."""

from __future__ import annotations

import pytest

from heraldps.admission import HEADROOM_THREADS, Limits
from ps_server.server import PSConfig
from scheduler_service.server import SchedulerConfig


def test_defaults_admit_four_calls_per_thread_and_size_the_pool_for_all() -> None:
    limits = PSConfig().limits
    assert (limits.threads, limits.unary, limits.max_streams) == (16, 64, 16)
    assert limits.pool_threads == 64 + 16 + HEADROOM_THREADS  # no call waits in grpcio's queue
    assert Limits(threads=4, max_concurrent_rpcs=10).unary == 10


def test_the_scheduler_leaves_a_stream_for_every_worker() -> None:
    assert SchedulerConfig(workers=8, cache_rows=10).limits.max_streams == 8 + 16
    assert SchedulerConfig(workers=8, cache_rows=10, max_streams=8).limits.max_streams == 8
    with pytest.raises(ValueError, match="--max-streams 7 is too few for 8 workers"):
        SchedulerConfig(workers=8, cache_rows=10, max_streams=7)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"threads": 0}, "--threads must be >= 1"),
        ({"threads": 8, "max_concurrent_rpcs": 4}, "below --threads 8"),
        ({"max_streams": 0}, "--max-streams must be >= 1"),
        ({"stream_stall_seconds": 0.0}, "--stream-stall-seconds"),
        ({"stream_stall_seconds": float("inf")}, "--stream-stall-seconds"),
    ],
)
def test_bad_limits_are_refused_with_the_flag_named(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Limits(**fields)
    with pytest.raises(ValueError, match=message):
        PSConfig(**fields)
