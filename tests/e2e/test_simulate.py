"""``heraldps simulate`` on the shared Criteo and Avazu samples."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from heraldps.data import DataSpec, read_all
from scheduler_service.batch import Batch
from scheduler_service.reference import ReferenceScheduler
from scheduler_service.scheduler import MODES
from scheduler_service.simulate import JSON_COUNTS

HERE = Path(__file__).resolve()
# The shared data sits beside the main checkout (/work/shared) or beside a worktree's parent.
DATA = next(
    (
        p
        for p in (HERE.parents[3] / "shared" / "data", HERE.parents[4] / "shared" / "data")
        if p.is_dir()
    ),
    HERE.parents[3] / "shared" / "data",
)
CASES = [("criteo_kaggle_head8k/train.tsv", "criteo"), ("avazu_head9k/train.csv", "avazu")]


@pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")
@pytest.mark.parametrize(("path", "fmt"), CASES)
def test_simulate_cli_counts_equal_the_reference(path: str, fmt: str, tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = [
        "--data",
        str(DATA / path),
        "--format",
        fmt,
        "--workers",
        "4",
        "--batch-size-per-worker",
        "64",
        "--iterations",
        "6",
        "--json",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "| herald |" in done.stdout
    result = json.loads(out.read_text())
    assert set(result) == {"config", "modes", "fields"} and list(result["modes"]) == list(MODES)
    dataset = read_all(DataSpec(str(DATA / path), fmt))
    assert dataset.fields is not None
    # Per field, the distinct values and the distinct keys (equal: no hash collision).
    assert result["fields"] == [
        {"column": name, "distinct_values": n, "distinct_keys": n}
        for name, n in zip(
            dataset.sparse_columns,
            (
                np.unique(dataset.keys[dataset.fields == j]).size
                for j in range(len(dataset.sparse_columns))
            ),
            strict=True,
        )
    ]
    assert "no collisions" in done.stdout
    capacity = math.floor(0.1 * dataset.distinct_keys())
    assert result["config"]["cache_rows"] == capacity
    for mode, counts in result["modes"].items():
        ref = ReferenceScheduler.for_mode(4, capacity, mode)
        for t, part in enumerate(dataset.batches(256, 6)):
            ref.submit(Batch(t, part.offsets, part.keys, 4))
        ref.finish()
        assert counts == {k: getattr(ref.counts, k) for k in JSON_COUNTS}, mode
    naive, herald = result["modes"]["naive"], result["modes"]["herald"]
    assert herald["pulls"] < naive["pulls"] and herald["pushes"] < naive["pushes"]


def test_simulate_cli_reports_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t2\t3\n")
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "simulate", "--data", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "heraldps simulate:" in done.stderr


def test_simulate_runs_on_the_bundled_sample_by_default() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "simulate", "--iterations", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| herald |" in done.stdout and "3 iterations" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--iterations", "0"], "argument --iterations: must be >= 1, got 0"),
        (["--cache-fraction", "0"], "argument --cache-fraction: must be in (0, 1], got 0"),
        (["--format", "csv", "--data", "CSV"], "--format csv needs --sparse-columns"),
        (["--cache-fraction", "0.01"], "use --cache-fraction 0.0"),
        (["--batch-size-per-worker", "100000"], "fewer than one global batch of 800,000"),
    ],
)
def test_simulate_refuses_bad_configurations_in_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    csv_file = tmp_path / "mine.csv"
    csv_file.write_text("user,item\nu1,i1\n")
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "simulate",
         *[str(csv_file) if a == "CSV" else a for a in args]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
