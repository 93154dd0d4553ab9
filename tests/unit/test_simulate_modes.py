"""``simulate`` plans the modes one group after another (one cache mirror at a time), and
herald with herald_pipelined in one group: every count of every mode must be what a
scheduler of that mode alone counts over the same batches."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from heraldps import bundled
from heraldps.data import DataSpec, read_all, scan
from heraldps.data.global_batches import StreamedBatches
from heraldps.modes import PIPELINED_MODE
from launcher.cli import main
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


def test_simulate_counts_every_look_ahead_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``heraldps simulate --look-ahead 1,2``: every mode counted for each, a look-ahead
    column in the table and one entry per look-ahead in the JSON; one look-ahead keeps the
    JSON of before, with its setting in the config."""
    small = ["simulate", "--workers", "4", "--batch-size-per-worker", "32", "--iterations", "3"]
    several, single = tmp_path / "several.json", tmp_path / "single.json"
    assert main([*small, "--look-ahead", "1,2", "--json", str(several)]) == 0
    table = capsys.readouterr().out
    assert "| look-ahead | mode |" in table
    for k in (1, 2):
        assert all(f"| {k} | {mode} |" in table for mode in MODES), table
    result = json.loads(several.read_text())
    assert set(result) == {"config", "runs", "fields"} and result["config"]["look_ahead"] == [1, 2]
    assert [run["look_ahead"] for run in result["runs"]] == [1, 2]
    assert all(list(run["modes"]) == list(MODES) for run in result["runs"])
    assert main([*small, "--json", str(single)]) == 0
    assert "look-ahead" not in capsys.readouterr().out
    alone = json.loads(single.read_text())
    assert set(alone) == {"config", "modes", "fields"} and alone["config"]["look_ahead"] == 1
    # K = 1 in a list counts what K = 1 alone counts.
    assert result["runs"][0]["modes"] == alone["modes"]
    # Table 1's two counts, and what splits them by bytes: pushes = gradients + write-backs.
    for counts in alone["modes"].values():
        assert list(counts) == ["pulls", "pushes", "grad_pushes", "write_backs", "final_flush",
                                "state_pulls", "early_pulls"]  # fmt: skip
        assert counts["pushes"] == counts["grad_pushes"] + counts["write_backs"]
        assert counts["state_pulls"] <= counts["pulls"]
