"""The streaming shuffle (heraldps.data.shuffle): each epoch a permutation of every training
row, drawn from (seed, epoch) alone, holding at most its buffer and one block of rows.

The files carry each row's number in a raw dense column, so an epoch's order is read back
exactly from the rows it yields."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from heraldps.data import DataSpec, read_all
from heraldps.data.shuffle import ShuffledEpochs, ShuffledRows, bucket_sizes, shuffled_batches
from heraldps.errors import InvalidArgument
from heraldps.job_file import from_dict
from launcher.cli.train import add_arguments, overrides_of
from launcher.train import epoch_order

ROWS = 5003  # a prime: no buffer or block divides it


def write_rows(path: Path, first: int, rows: int) -> None:
    """A CSV whose ``row`` column numbers the rows from ``first``; small vocabularies."""
    n = np.arange(first, first + rows)
    lines = ["click,user,item,row\n"] + [f"{i % 2},u{i % 97},i{(i * 7) % 131},{i}\n" for i in n]
    path.write_text("".join(lines))


def spec_of(source: str) -> DataSpec:
    return DataSpec(source, format="csv", sparse_columns=("user", "item"),
                    label_column="click", dense_columns=("row",),
                    dense_transforms=("raw",))  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> DataSpec:
    """Two files (the first block of the second starts short of a whole block)."""
    d = tmp_path_factory.mktemp("shuffle")
    write_rows(d / "a.csv", 0, 3001)
    write_rows(d / "b.csv", 3001, ROWS - 3001)
    return spec_of(f"{d / 'a.csv'},{d / 'b.csv'}")


def order(rows: ShuffledRows) -> npt.NDArray[np.int64]:
    """The row numbers in the order the shuffle yields them."""
    return np.concatenate([p.dense[:, 0] for p in rows]).astype(np.int64)


def shuffled(spec: DataSpec, tmp: Path, buffer: int, seed: int = 5, epoch: int = 1,
             block: int = 400) -> ShuffledRows:  # fmt: skip
    return ShuffledRows(spec, ROWS, buffer, seed, epoch, tmp, block_rows=block)


@pytest.mark.parametrize("buffer", [1, 7, 400, 1000, 2501, 5002, 5003, 100_000])
def test_every_row_once_per_epoch_with_its_keys(data: DataSpec, tmp_path: Path,
                                                buffer: int) -> None:  # fmt: skip
    """A permutation of all rows, the last partial bucket and blocks included, each row with
    its own keys and label; the spill file is gone afterwards."""
    rows = shuffled(data, tmp_path, buffer, block=400 if buffer > 1 else 3000)
    pieces = list(rows)
    got = np.concatenate([p.dense[:, 0] for p in pieces]).astype(np.int64)
    assert np.array_equal(np.sort(got), np.arange(ROWS))
    assert not np.array_equal(got, np.arange(ROWS))
    assert all(p.rows <= rows.block_rows for p in pieces)
    whole = read_all(data)
    expected = whole.take(got)
    for name in ("keys", "fields", "labels"):
        joined = np.concatenate([getattr(p, name) for p in pieces])
        assert np.array_equal(joined, getattr(expected, name)), name
    lengths = np.concatenate([np.diff(p.offsets) for p in pieces])
    assert np.array_equal(lengths, np.diff(expected.offsets))
    assert list(tmp_path.iterdir()) == []


def test_same_seed_and_epoch_same_order_else_another(data: DataSpec, tmp_path: Path) -> None:
    first = order(shuffled(data, tmp_path, 700))
    assert np.array_equal(first, order(shuffled(data, tmp_path, 700)))
    for other in (shuffled(data, tmp_path, 700, epoch=2), shuffled(data, tmp_path, 700, seed=6)):
        again = order(other)
        assert not np.array_equal(first, again)
        assert np.array_equal(np.sort(again), np.arange(ROWS))
    # With one bucket the block size changes how the file is read, not the order (with
    # several, the scatter draws per block, so the block size is part of the order).
    assert np.array_equal(order(shuffled(data, tmp_path, ROWS, block=300)),
                          order(shuffled(data, tmp_path, ROWS, block=700)))  # fmt: skip


def test_a_whole_split_buffer_gives_the_in_memory_order(data: DataSpec, tmp_path: Path) -> None:
    """One bucket: exactly ``epoch_order``, so buffer >= rows trains the in-memory model."""
    for epoch in (1, 2):
        expected = epoch_order(ROWS, 5, epoch, True)
        assert np.array_equal(order(shuffled(data, tmp_path, ROWS, epoch=epoch)), expected)


def test_rows_spread_over_the_whole_file(data: DataSpec, tmp_path: Path) -> None:
    """Not a local shuffle: the first 500 rows of an epoch come from all over the file, and
    a row's position is spread over the epoch (a uniform permutation: mean ROWS/2)."""
    got = order(shuffled(data, tmp_path, 500))
    assert got[:500].min() < ROWS // 10 and got[:500].max() > ROWS - ROWS // 10
    positions = [int(np.flatnonzero(order(shuffled(data, tmp_path, 500, seed=s)) == 0)[0])
                 for s in range(12)]  # fmt: skip
    assert max(positions) > ROWS // 2 > min(positions)


@pytest.mark.parametrize(("buffer", "block"), [(1000, 400), (400, 400), (2600, 1000), (150, 400)])
def test_peak_rows_held_are_the_buffer_and_one_block(data: DataSpec, tmp_path: Path,
                                                     buffer: int, block: int) -> None:  # fmt: skip
    rows = shuffled(data, tmp_path, buffer, block=block)
    order(rows)
    bound = max(buffer, block) + block
    assert rows.peak_rows <= bound
    assert rows.peak_rows >= min(buffer, ROWS)  # the count is real: a bucket was held
    assert max(bucket_sizes(ROWS, buffer)) <= buffer


def write_criteo(path: Path, rows: int) -> None:
    """Criteo layout: I1 numbers the rows, 26 categories from small vocabularies."""
    cats = "\t".join(f"{j:x}{{}}" for j in range(26))
    lines = [f"{i % 2}\t{i}" + "\t" * 12 + "\t" + cats.format(*[i % (7 + j) for j in range(26)])
             + "\n" for i in range(rows)]  # fmt: skip
    path.write_text("".join(lines))


def test_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """tracemalloc (NumPy's arrays are traced): the peak of an epoch over a file four times
    larger stays that of the smaller file, and far below the larger file's rows in memory."""
    peaks = []
    for rows in (25_000, 100_000):
        path = tmp_path / f"rows{rows}.tsv"
        write_criteo(path, rows)
        spec = DataSpec(str(path), format="criteo", dense_transforms=("raw",))
        shuffle = ShuffledRows(spec, rows, 3000, 1, 1, tmp_path, block_rows=1000)
        list(shuffle)  # the compiled kernels loaded, the reader's threads started
        seen = np.zeros(rows, dtype=np.int64)
        tracemalloc.start()
        try:
            for piece in shuffle:
                seen[piece.dense[:, 0].astype(np.int64)] += 1
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert (seen == 1).all()
    whole = read_all(DataSpec(str(tmp_path / "rows100000.tsv"), format="criteo"))
    in_memory = sum(a.nbytes for a in (whole.offsets, whole.keys, whole.fields, whole.labels,
                                       whole.dense))  # fmt: skip
    assert peaks[1] < 1.25 * peaks[0], peaks
    assert peaks[1] < in_memory / 4, (peaks, in_memory)


def test_global_batches_are_whole_and_in_the_shuffled_order(data: DataSpec,
                                                            tmp_path: Path) -> None:  # fmt: skip
    expected = order(shuffled(data, tmp_path, 900))
    batches = list(shuffled_batches(shuffled(data, tmp_path, 900), 128))
    assert len(batches) == ROWS // 128 and all(b.rows == 128 for b in batches)
    got = np.concatenate([b.dense[:, 0] for b in batches]).astype(np.int64)
    assert np.array_equal(got, expected[: len(got)])


def _job(schedule: dict[str, object]) -> dict[str, object]:
    return {"data": {"train": "x.csv", "sparse_columns": "a", "label_column": "y"},
            "schedule": schedule}  # fmt: skip


def test_job_file_and_flag() -> None:
    assert from_dict(_job({})).schedule.shuffle_buffer_rows == 0
    assert from_dict(_job({"shuffle_buffer_rows": 4096})).schedule.shuffle_buffer_rows == 4096
    for bad in (-1, 1.5, True, "many"):
        with pytest.raises(InvalidArgument, match="shuffle_buffer_rows must be a whole number"):
            from_dict(_job({"shuffle_buffer_rows": bad}))
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--job", "j.yaml", "--shuffle-buffer-rows", "100000"])
    assert overrides_of(args)["schedule.shuffle_buffer_rows"] == 100_000
    with pytest.raises(SystemExit):
        parser.parse_args(["--job", "j.yaml", "--shuffle-buffer-rows", "-5"])


def test_feed_epochs_are_train_epochs_and_resume_mid_epoch(data: DataSpec, tmp_path: Path) -> None:
    """``ShuffledEpochs`` (``heraldps feed``): epoch e's batches are those of train's epoch e,
    and a restart at any batch gives the rest of the run."""
    epochs = ShuffledEpochs(data, ROWS, 256, None, 3, 900, 5, tmp_path)
    per_epoch = ROWS // 256
    assert len(epochs) == 3 * per_epoch
    whole = [b.dense[:, 0].copy() for b in epochs.iter_from(0)]
    for e in (1, 3):
        train = list(shuffled_batches(shuffled(data, tmp_path, 900, epoch=e, block=65_536), 256))
        got = whole[(e - 1) * per_epoch : e * per_epoch]
        assert all(np.array_equal(a, b.dense[:, 0]) for a, b in zip(got, train, strict=True))
    for start in (per_epoch + 5, 3 * per_epoch - 1):
        rest = [b.dense[:, 0] for b in epochs.iter_from(start)]
        assert len(rest) == len(whole) - start
        assert all(np.array_equal(a, b) for a, b in zip(rest, whole[start:], strict=True))


def test_a_process_that_stops_mid_epoch_leaves_no_spill_file(data: DataSpec,
                                                             tmp_path: Path) -> None:  # fmt: skip
    """An exception out of the main thread with the epoch's iterator still referenced (as a
    run stopped by SIGTERM: its traceback holds the iterator): the file goes at exit."""
    script = (
        "import sys, pathlib\n"
        "from heraldps.data import DataSpec\n"
        "from heraldps.data.shuffle import ShuffledRows\n"
        f"spec = DataSpec.from_dict({data.to_dict()!r})\n"
        f"rows = iter(ShuffledRows(spec, {ROWS}, 700, 5, 1, pathlib.Path({str(tmp_path)!r}),"
        " block_rows=400))\n"
        "next(rows)\n"
        "assert len(list(pathlib.Path(sys.argv[1]).glob('shuffle-*'))) == 1\n"
        "raise RuntimeError('stopped')\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert "RuntimeError: stopped" in done.stderr, done.stderr
    assert list(tmp_path.glob("shuffle-*")) == []
