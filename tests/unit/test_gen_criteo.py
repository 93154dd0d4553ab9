"""benchmarks/gen_criteo.py: a deterministic Criteo-layout file, same rows in TSV and Parquet."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_criteo", ROOT / "benchmarks" / "gen_criteo.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_criteo"] = module
    spec.loader.exec_module(module)
    return module


gen = load_generator()
ROWS = 70_000  # more than one 65,536-row block


def read_tsv(path: Path) -> pa.Table:
    names = list(gen.COLUMNS)
    types = {name: (pa.string() if name.startswith("C") else pa.int64()) for name in names}
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("gen")
    tsv, parquet = folder / "c.tsv", folder / "c.parquet"
    gen.main(["--rows", str(ROWS), "--out", str(tsv), "--parquet", str(parquet), "--seed", "3"])
    return tsv, parquet


def test_the_tsv_has_the_kaggle_layout(files: tuple[Path, Path]) -> None:
    lines = files[0].read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == ROWS + 1
    for line in lines[:200]:
        cells = line.split(b"\t")
        assert len(cells) == 40
        assert cells[0] in (b"0", b"1")
        assert all(c == b"" or c.lstrip(b"-").isdigit() for c in cells[1:14])
        assert all(c == b"" or (len(c) == 8 and int(c, 16) >= 0) for c in cells[14:])


def test_same_rows_in_tsv_and_parquet(files: tuple[Path, Path]) -> None:
    tsv, parquet = files
    from_tsv = read_tsv(tsv)
    from_parquet = pq.read_table(parquet)
    assert from_parquet.column_names == list(gen.COLUMNS)
    assert from_tsv.num_rows == from_parquet.num_rows == ROWS
    assert from_tsv.equals(from_parquet)
    assert pq.ParquetFile(parquet).metadata.num_row_groups == 1  # 70k rows < one 262,144-row group


def test_rates_look_like_criteo(files: tuple[Path, Path]) -> None:
    table = read_tsv(files[0])
    cells = ROWS * 39
    empty = sum(table.column(name).null_count for name in gen.COLUMNS[1:])
    assert 0.017 < empty / cells < 0.023  # about 2% empty cells
    for name in ("I1", "I7", "C3", "C20"):
        assert 0.01 < table.column(name).null_count / ROWS < 0.03
    labels = table.column("label").to_numpy()
    assert 0.2 < labels.mean() < 0.3
    i2 = table.column("I2").drop_null().to_numpy()
    assert 0.02 < (i2 == -1).mean() < 0.06
    dense = np.concatenate([table.column(f"I{i}").drop_null().to_numpy() for i in range(1, 14)])
    assert (dense >= -1).all() and dense.max() > 10_000  # heavy tail
    # Skew: the most common value of a 10M-value field is far above uniform.
    c3 = table.column("C3").drop_null()
    counts = pa.compute.value_counts(c3).field("counts").to_numpy()
    assert counts.max() > 100 * counts.mean() / 10 and len(counts) > ROWS // 4


def test_deterministic_and_a_prefix_of_longer_runs(
    tmp_path: Path, files: tuple[Path, Path]
) -> None:
    again, shorter, other = tmp_path / "a.tsv", tmp_path / "s.tsv", tmp_path / "o.tsv"
    gen.generate(ROWS, again, seed=3)
    gen.generate(1000, shorter, seed=3)
    gen.generate(1000, other, seed=4)
    whole = files[0].read_bytes()
    assert again.read_bytes() == whole
    assert whole.startswith(shorter.read_bytes()) and len(shorter.read_bytes().split(b"\n")) == 1001
    assert other.read_bytes() != shorter.read_bytes()


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--rows must be >= 0"):
        gen.generate(-1, tmp_path / "x.tsv")
    with pytest.raises(ValueError, match="multiple of 65536"):
        gen.generate(10, tmp_path / "x.tsv", row_group_rows=1000)


def test_bench_data_measures_the_raw_parse_in_a_child(files: tuple[Path, Path]) -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_data", ROOT / "benchmarks" / "bench_data.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tsv, parquet = files
    for kind, path in (("raw-tsv", tsv), ("raw-parquet", parquet)):
        got = bench.measure(kind, path, timeout=120)
        assert got["rows"] == ROWS, got
        # No upper bound: on Linux a child's ru_maxrss keeps its parent's high-water mark from
        # before exec, and the parent here is a pytest worker (the benchmark's parent is small).
        assert got["rows_per_s"] > 0 and got["rss_mb"] > 20
    failed = bench.measure("raw-tsv", tsv.parent / "missing.tsv", timeout=120)
    assert "error" in failed and "exit 1" in failed["error"]
