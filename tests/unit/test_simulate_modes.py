"""``simulate`` plans the modes one group after another (one cache mirror at a time), and
herald with herald_pipelined in one group: every count of every mode must be what a
scheduler of that mode alone counts over the same batches."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from heraldps import bundled
from heraldps.data import DataSpec, read_all, scan
from heraldps.data.global_batches import StreamedBatches
from heraldps.modes import PIPELINED_MODE
from scheduler_service.scheduler import MODES
from scheduler_service.simulate import SimulationConfig, plan_all, plan_groups, simulate

TRAIN = str(bundled.resolve("bundled:criteo_head8k"))


def test_modes_that_plan_alike_share_a_group_and_keep_their_order() -> None:
    assert plan_groups(list(MODES)) == [
        ("naive",),
        ("on_demand",),
        ("location_aware",),
        ("herald", PIPELINED_MODE),
    ]
    assert plan_groups([PIPELINED_MODE, "naive"]) == [(PIPELINED_MODE,), ("naive",)]


@pytest.mark.parametrize(("workers", "per_worker", "fraction"), [(8, 128, 0.1), (4, 32, 0.03)])
def test_every_count_equals_a_scheduler_of_that_mode_alone(
    workers: int, per_worker: int, fraction: float
) -> None:
    spec = DataSpec(TRAIN)
    profile = scan(spec)
    batches = StreamedBatches(spec, profile.rows, workers * per_worker, None)
    config = SimulationConfig(TRAIN, "criteo", workers, per_worker, fraction, None)
    result = simulate(batches, config, profile.total_distinct_keys)
    capacity = result["config"]["cache_rows"]
    data = read_all(spec)
    for mode in MODES:
        counts = plan_all(data, workers, per_worker, capacity, mode, None).counts
        alone = {**asdict(counts), "pushes": counts.pushes}
        got = {k: v for k, v in result["modes"][mode].items() if k != "ms_per_batch"}
        assert got == {k: alone[k] for k in got}, mode
    herald, pipelined = result["modes"]["herald"], result["modes"][PIPELINED_MODE]
    assert pipelined["early_pulls"] > 0 == herald["early_pulls"]
