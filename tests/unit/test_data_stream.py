"""Streaming: exact chunks and global batches, row ranges, dense transforms, scan, memory."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from heraldps import bundled
from heraldps.data import DataError, DataSpec, batches, read_all, scan, stream
from heraldps.data.dataset import concat
from heraldps.data.spec import DenseStats

TRAIN = str(bundled.resolve("bundled:criteo_head8k"))
REPO = Path(__file__).resolve().parents[2]


def test_concat_is_the_inverse_of_row_slice() -> None:
    ds = read_all(DataSpec(TRAIN))
    parts = [ds.row_slice(0, 10), ds.row_slice(10, 10), ds.row_slice(10, 7200)]
    joined = concat(parts)
    for name in ("offsets", "keys", "labels", "dense", "fields"):
        assert np.array_equal(getattr(joined, name), getattr(ds, name)), name
    with pytest.raises(ValueError, match="at least one"):
        concat([])


def test_batches_cross_chunk_boundaries_and_drop_each_pass_tail() -> None:
    spec = DataSpec(TRAIN)
    ds = read_all(spec)
    got = list(batches(spec, batch_size=1000, epochs=2))
    assert [b.rows for b in got] == [1000] * 14  # 7 full batches per pass of 7200 rows
    for t, b in enumerate(got):
        want = ds.row_slice((t % 7) * 1000, (t % 7 + 1) * 1000)
        assert np.array_equal(b.keys, want.keys) and np.array_equal(b.offsets, want.offsets)
    assert len(list(batches(spec, 1000, epochs=3, limit=10))) == 10
    with pytest.raises(DataError, match="fewer than one global batch of 8000"):
        list(batches(spec, 8000))


def test_row_range_selects_rows_of_the_whole_source(tmp_path: Path) -> None:
    lines = Path(TRAIN).read_text().splitlines(True)
    (tmp_path / "a.tsv").write_text("".join(lines[:3000]))
    (tmp_path / "b.tsv").write_text("".join(lines[3000:]))
    ds = read_all(DataSpec(TRAIN))
    part = read_all(DataSpec(str(tmp_path), start_row=2500, stop_row=6000))
    assert np.array_equal(part.keys, ds.row_slice(2500, 6000).keys)
    assert np.array_equal(part.labels, ds.row_slice(2500, 6000).labels)
    chunks = list(stream(DataSpec(str(tmp_path), start_row=7000), batch_rows=64))
    assert sum(c.rows for c in chunks) == 200


def dense_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.csv"
    path.write_text("y,c,age,flat,gaps\n1,a,20,5,1\n0,b,40,5,\n1,a,60,5,3\n0,c,80,5,\n")
    return path


def test_scan_stats_and_transforms(tmp_path: Path) -> None:
    spec = DataSpec(
        str(dense_file(tmp_path)),
        "csv",
        sparse_columns=("c",),
        label_column="y",
        dense_columns=("age", "flat", "gaps"),
    )
    profile = scan(spec)
    assert (profile.rows, profile.positives) == (4, 2)
    assert profile.distinct_values == profile.distinct_keys == (3,)
    age, flat, gaps = profile.dense_stats
    assert age == DenseStats("age", 4, 0, 50.0, float(np.std([20, 40, 60, 80])), 20.0, 80.0)
    assert (flat.std, flat.min, flat.max) == (0.0, 5.0, 5.0)
    assert (gaps.count, gaps.missing, gaps.mean) == (2, 2, 2.0)
    std = read_all(spec.with_stats(profile.dense_stats))
    z = (np.array([20, 40, 60, 80]) - 50) / np.std([20, 40, 60, 80])
    np.testing.assert_allclose(std.dense[:, 0], z, rtol=1e-6)
    assert std.dense[:, 1].tolist() == [0.0] * 4  # constant column
    assert std.dense[:, 2].tolist() == [-1.0, 0.0, 1.0, 0.0]  # missing = the mean = 0
    minmax = read_all(
        DataSpec.from_dict(
            spec.with_stats(profile.dense_stats).to_dict() | {"dense_transforms": ["minmax"]}
        )
    )
    np.testing.assert_allclose(minmax.dense[:, 0], [0, 1 / 3, 2 / 3, 1], rtol=1e-6)
    assert minmax.dense[:, 1].tolist() == [0.0] * 4
    assert minmax.dense[:, 2].tolist() == [0.0, 0.5, 1.0, 0.5]  # missing = the mean's position
    raw = read_all(DataSpec.from_dict(spec.to_dict() | {"dense_transforms": ["raw"]}))
    assert raw.dense[:, 2].tolist() == [1.0, 0.0, 3.0, 0.0]
    # The spec, stats included, survives JSON.
    again = DataSpec.from_dict(
        json.loads(json.dumps(spec.with_stats(profile.dense_stats).to_dict()))
    )
    assert again == spec.with_stats(profile.dense_stats)


def test_scan_reports_progress() -> None:
    seen: list[tuple[int, int, int]] = []
    scan(DataSpec(TRAIN), progress=lambda r, b, t: seen.append((r, b, t)))
    assert seen[-1][0] == 7200 and seen[-1][1] == seen[-1][2] == Path(TRAIN).stat().st_size
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)


MEMORY_PROBE = textwrap.dedent(
    """
    import os, sys
    from heraldps.data import DataSpec, stream

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    rows, peak, base = 0, 0, 0
    for number, chunk in enumerate(stream(DataSpec(sys.argv[1]), batch_rows=8192)):
        rows += chunk.rows
        # Steady state: two of the reader's 65,536-row conversions done, the prefetch
        # thread a chunk ahead, pyarrow's pool and the converter threads up.
        if number == 2 * 65_536 // 8192:
            base = rss()
        peak = max(peak, rss())
    print(rows, base, peak)
    """
)


@pytest.mark.slow
def test_memory_stays_flat_over_a_file_much_larger_than_a_chunk(tmp_path: Path) -> None:
    """300k rows (~70 MB) streamed in 8k-row chunks: RSS grows by far less than the file."""
    path = tmp_path / "big.tsv"
    rng = np.random.default_rng(0)
    columns = [f"{j}_" for j in range(26)]
    n = 10_000  # one random block written 30 times: content does not matter, size does
    ints = rng.integers(0, 1000, size=(n, 13)).astype(str)
    cells = np.char.add(np.array(columns), rng.integers(0, 300, size=(n, 26)).astype(str))
    labels = rng.integers(0, 2, size=(n, 1)).astype(str)
    block = "\n".join("\t".join(r) for r in np.concatenate([labels, ints, cells], 1).tolist())
    with path.open("w") as f:
        for _ in range(30):
            f.write(block + "\n")
    size = path.stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MALLOC_ARENA_MAX": "2"},
    ).stdout.split()
    rows, base, peak = (int(v) for v in out)
    assert rows == 300_000
    # Measured 13-23 MB on a 64 MB file; the old whole-file reader needed ~1.1 GB for it.
    assert peak - base < min(size // 2, 40 << 20), (peak - base, size)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_stream_works_in_a_forked_child_after_the_parent_used_the_converter_threads(
    tmp_path: Path,
) -> None:
    # The converter thread pool started in the parent does not exist in a forked child; the
    # child must start its own (a stale pool would hang on the first chunk).
    path = tmp_path / "f.tsv"
    line = "\t".join(["1", *["3"] * 13, *["abc"] * 26]) + "\n"
    path.write_text(line * 10_000)
    spec = DataSpec(str(path), "criteo")
    assert sum(c.rows for c in stream(spec, 8192)) == 10_000  # starts the pool here
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        rows = pool.apply_async(_rows_in_child, (str(path),)).get(timeout=120)
    assert rows == 10_000


def _rows_in_child(path: str) -> int:
    return sum(c.rows for c in stream(DataSpec(path, "criteo"), 8192))


@pytest.mark.parametrize(
    "names",
    [("log1p",) * 3, ("raw",) * 3, ("standardize",) * 3, ("minmax",) * 3,
     ("log1p", "standardize", "raw")],
)  # fmt: skip
def test_block_transform_equals_the_per_column_transform_bit_for_bit(names: tuple) -> None:
    from heraldps.data import transforms

    rng = np.random.default_rng(5)
    values = rng.normal(3.0, 50.0, size=(3, 1000))
    values[rng.random(values.shape) < 0.1] = np.nan
    values[2] = 7.0  # a constant column
    columns = ("a", "b", "c")
    stats = tuple(
        DenseStats(c, 900, 100, float(np.nanmean(v)), float(np.nanstd(v)),
                   float(np.nanmin(v)), float(np.nanmax(v)))
        for c, v in zip(columns, values, strict=True)
    )  # fmt: skip
    want = np.stack(
        [transforms.apply(values[j], names[j], stats[j], columns[j]) for j in range(3)], axis=1
    )
    got = transforms.apply_columns(values.copy(), names, stats, columns)
    assert got.dtype == np.float32 and got.shape == (1000, 3)
    assert got.tobytes() == want.tobytes()
