"""``StreamedBatches`` (what the feeder and ``simulate`` submit, read from disk as they go)
gives exactly the batches ``InMemoryBatches`` cuts from the whole data set: every pass,
every ``iterations`` cap and every restart point ``iter_from(start)``."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.data import DataSpec, SparseDataset, read_all, scan
from heraldps.data.global_batches import InMemoryBatches, StreamedBatches
from heraldps.errors import InvalidArgument

ROWS = 1037  # not a multiple of the batch: each pass drops a partial tail
BATCH = 100  # 10 whole batches per pass
PER_PASS = ROWS // BATCH


def criteo_rows(rng: np.random.Generator, n: int) -> list[str]:
    """Criteo-layout lines: 0/1 labels, ints with negatives and empty cells, hex categories
    from small vocabularies (repeats) with about 5% empty cells."""
    lines = []
    for _ in range(n):
        ints = [str(v) if rng.random() > 0.1 else "" for v in rng.integers(-2, 500, 13)]
        cats = [f"{v:08x}" if rng.random() > 0.05 else "" for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *ints, *cats]) + "\n")
    return lines


def csv_rows(rng: np.random.Generator, n: int) -> list[str]:
    """A user's CSV: label, three categorical and two numeric columns (``price`` with gaps)."""
    lines = ["click,user,item,city,age,price\n"]
    for _ in range(n):
        price = f"{rng.uniform(1, 1000):.2f}" if rng.random() > 0.2 else ""
        city = f"city{rng.integers(0, 12)}" if rng.random() > 0.1 else ""
        lines.append(
            f"{rng.integers(0, 2)},u{rng.integers(0, 200)},i{rng.integers(0, 300)},{city},"
            f"{rng.integers(18, 81)},{price}\n"
        )
    return lines


@pytest.fixture(
    scope="module",
    params=["criteo-file", "criteo-parts", "csv-file", "csv-rows-30-1000"],
)
def spec(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DataSpec:
    """One file, a directory of three parts (batches span files), and a csv read with
    standardize/minmax statistics from its first pass over a row range (a held-out split)."""
    folder = tmp_path_factory.mktemp(request.param)
    rng = np.random.default_rng(22)
    if request.param.startswith("criteo"):
        lines = criteo_rows(rng, ROWS)
        if request.param == "criteo-file":
            (folder / "train.tsv").write_text("".join(lines))
            return DataSpec(str(folder / "train.tsv"))
        for i, (lo, hi) in enumerate(((0, 333), (333, 720), (720, ROWS))):
            (folder / f"part-{i}").write_text("".join(lines[lo:hi]))
        return DataSpec(str(folder))
    (folder / "clicks.csv").write_text("".join(csv_rows(rng, ROWS)))
    base = DataSpec(
        str(folder / "clicks.csv"),
        "csv",
        sparse_columns=("user", "item", "city"),
        label_column="click",
        dense_columns=("age", "price"),
        dense_transforms=("standardize", "minmax"),
        **({"start_row": 30, "stop_row": 1000} if request.param == "csv-rows-30-1000" else {}),
    )
    return base.with_stats(scan(base).dense_stats)


@pytest.fixture(scope="module")
def whole(spec: DataSpec) -> SparseDataset:
    return read_all(spec)


def same(got: list[SparseDataset], want: list[SparseDataset]) -> None:
    assert len(got) == len(want)
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.rows == b.rows == BATCH, t
        assert (a.sparse_columns, a.dense_columns) == (b.sparse_columns, b.dense_columns)
        for name in ("offsets", "keys", "labels", "dense", "fields"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (t, name)


def pair(
    spec: DataSpec, whole: SparseDataset, iterations: int | None, epochs: int
) -> tuple[StreamedBatches, InMemoryBatches]:
    streamed = StreamedBatches(spec, whole.rows, BATCH, iterations, epochs)
    return streamed, InMemoryBatches(whole, BATCH, iterations, epochs)


def test_the_generated_data_is_what_the_cases_assume(spec: DataSpec, whole: SparseDataset) -> None:
    assert whole.rows == (970 if spec.start_row else ROWS)
    assert whole.rows // BATCH == (9 if spec.start_row else PER_PASS)
    assert whole.rows % BATCH > 0  # a partial tail to drop
    assert 0 < whole.labels.sum() < whole.rows
    assert np.unique(whole.keys).size < whole.keys.size  # values repeat across rows
    assert whole.keys.size < whole.rows * len(whole.sparse_columns)  # some cells are empty
    assert whole.dense.std(axis=0).min() > 0


@pytest.mark.parametrize(
    ("iterations", "epochs"),
    [(None, 1), (None, 3), (4, 1), (4, 3), (13, 3), (1000, 3), (1000, 1)],
)
def test_every_batch_of_the_run_is_the_same(
    spec: DataSpec, whole: SparseDataset, iterations: int | None, epochs: int
) -> None:
    streamed, in_memory = pair(spec, whole, iterations, epochs)
    per_pass = whole.rows // BATCH
    total = per_pass * epochs if iterations is None else min(iterations, per_pass * epochs)
    assert len(streamed) == len(in_memory) == total
    same(list(streamed.iter_from(0)), list(in_memory.iter_from(0)))
    # Pass p's batch t is rows [t * BATCH, (t + 1) * BATCH) again: the passes repeat exactly.
    if total > per_pass:
        again = list(streamed.iter_from(per_pass))[:per_pass]
        same(again, list(in_memory.iter_from(0))[: len(again)])


def restarts(per_pass: int, total: int) -> list[int]:
    """Inside the first pass, its last batch, each pass boundary, inside a later pass,
    the last batch of the run, and the end (nothing left)."""
    points = {1, per_pass // 2, per_pass - 1, per_pass, per_pass + 3, 2 * per_pass}
    points |= {2 * per_pass + 1, total - 1, total}
    return sorted(p for p in points if 0 < p <= total)


@pytest.mark.parametrize(("iterations", "epochs"), [(None, 3), (25, 3), (None, 1), (7, 1)])
def test_a_restart_at_any_batch_resumes_exactly(
    spec: DataSpec, whole: SparseDataset, iterations: int | None, epochs: int
) -> None:
    streamed, in_memory = pair(spec, whole, iterations, epochs)
    total = len(in_memory)
    for start in restarts(whole.rows // BATCH, total):
        got = list(streamed.iter_from(start))
        assert len(got) == total - start, start
        same(got, list(in_memory.iter_from(start)))


def test_a_restart_past_the_end_yields_nothing(spec: DataSpec, whole: SparseDataset) -> None:
    streamed, in_memory = pair(spec, whole, 5, 1)
    assert list(streamed.iter_from(5)) == list(in_memory.iter_from(5)) == []
    assert list(streamed.iter_from(9)) == list(in_memory.iter_from(9)) == []


def test_fewer_rows_than_one_batch_is_refused_by_both(spec: DataSpec, whole: SparseDataset) -> None:
    big = whole.rows + 1
    with pytest.raises(InvalidArgument, match=f"fewer than one global batch of {big:,}"):
        len(StreamedBatches(spec, whole.rows, big, None))
    with pytest.raises(InvalidArgument, match="fewer than one global batch"):
        len(InMemoryBatches(whole, big, None))
