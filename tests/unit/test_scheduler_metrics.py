"""What the scheduler measures for the dashboard: assignment locality and naive's traffic."""

from __future__ import annotations

from scheduler_service.scheduler import Scheduler
from scheduler_service.shadow import NaiveShadow
from tests.unit.test_scheduler import random_batches


def test_location_aware_assignment_is_more_local_than_sequential() -> None:
    batches = random_batches(3, 30, 4, 8, 5, 200)
    locality = {}
    for mode in ("naive", "herald"):
        scheduler = Scheduler(4, 60, mode)
        for batch in batches:
            scheduler.submit(batch)
        c = scheduler.counts
        assert 0 < c.local_samples <= c.held_samples <= 30 * 4 * 8
        locality[mode] = c.local_samples / c.held_samples
    assert locality["herald"] > locality["naive"] + 0.2, locality


def test_naive_shadow_counts_batches_in_iteration_order() -> None:
    """Concurrent SubmitBatch calls may hand the shadow accepted batches out of order."""
    batches = random_batches(5, 12, 3, 4, 4, 80)
    plain = Scheduler(3, 40, "naive")
    for batch in batches:
        plain.submit(batch)
    plain.finish()
    shadow = NaiveShadow(3, 40)
    order = [0, 2, 1, 3, 5, 4, 6, 7, 8, 9, 11, 10]
    for i in order:
        shadow.submit(batches[i])
    shadow.finish()
    assert shadow.failed is None
    assert shadow.counts == plain.counts


def test_naive_shadow_stops_when_naive_cannot_plan_a_batch() -> None:
    batches = random_batches(5, 4, 2, 8, 5, 1000)
    shadow = NaiveShadow(2, 3)  # a sequential mini-batch needs more than 3 rows
    shadow.submit(batches[0])
    assert shadow.failed is not None and "more than its cache" in shadow.failed
    shadow.submit(batches[1])  # ignored from now on
    shadow.finish()
    assert shadow.counts.iterations == 0
