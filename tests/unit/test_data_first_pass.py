"""The first pass, done once: ``count_rows`` (parse only), ``scan`` on the key cache with a
profiled range and a per-chunk hook, ``MiniBatchSizes`` (the cache check from that pass),
and the exact distinct count behind the collision report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from heraldps import bundled
from heraldps.data import DataError, DataSpec, SparseDataset, count_rows, read_all, scan
from heraldps.data import keys as keys_module
from heraldps.data.distinct import DistinctCounter, fingerprints
from heraldps.data.global_batches import MiniBatchSizes, mini_batch_sizes
from heraldps.data.spec import CRITEO_COLUMNS

TRAIN = str(bundled.resolve("bundled:criteo_head8k"))


def reference_counts(ds: SparseDataset, fields: int) -> tuple[list[int], int]:
    """Distinct keys per field and overall, by NumPy over the whole data set."""
    assert ds.fields is not None
    per_field = [int(np.unique(ds.keys[ds.fields == j]).size) for j in range(fields)]
    return per_field, int(np.unique(ds.keys).size)


# ----- count_rows ---------------------------------------------------------------------------


def test_count_rows_equals_the_rows_read_for_every_source_kind(tmp_path: Path) -> None:
    lines = Path(TRAIN).read_text().splitlines(True)
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-00000").write_text("".join(lines[:3000]))
    (parts / "part-00002").write_text("\n" + "".join(lines[3000:]) + "\n\n")  # blank lines
    table = pacsv.read_csv(
        TRAIN,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO_COLUMNS)),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in CRITEO_COLUMNS if c.startswith("C")}
        ),
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1000)
    csv = tmp_path / "own.csv"
    csv.write_text("click,user\n" + "".join(f"{i % 2},u{i}\n" for i in range(500)))
    for spec in (
        DataSpec(TRAIN),
        DataSpec(str(parts)),
        DataSpec(str(tmp_path / "t.parquet")),
        DataSpec(str(parts), start_row=2500, stop_row=6000),
        DataSpec(str(parts), start_row=7000),
        DataSpec(str(csv), "csv", sparse_columns=("user",), label_column="click"),
    ):
        assert count_rows(spec) == read_all(spec).rows, spec


def test_count_rows_refuses_what_the_parser_refuses(tmp_path: Path) -> None:
    ragged = tmp_path / "ragged.tsv"
    lines = Path(TRAIN).read_text().splitlines(True)[:50]
    lines[30] = "1\t2\n"
    ragged.write_text("".join(lines))
    with pytest.raises(DataError, match=r"ragged\.tsv:31: expected 40 tab-separated fields"):
        count_rows(DataSpec(str(ragged)))
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(DataError, match="empty file"):
        count_rows(DataSpec(str(empty)))


# ----- scan: the key cache's misses, a profiled range, a per-chunk hook ---------------------


def test_scan_counts_exactly_when_the_key_cache_is_cleared_all_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The distinct count is fed by the cells the key cache had to hash; a cache cleared
    every few values hashes a value again and again, and the count must not change."""
    spec = DataSpec(TRAIN)
    usual = scan(spec)
    monkeypatch.setattr(keys_module, "_FIRST_SLOTS", 16)
    monkeypatch.setattr(keys_module, "_MAX_SLOTS", 16)
    tiny = scan(spec)
    assert tiny == usual
    ds = read_all(spec)
    per_field, total = reference_counts(ds, len(spec.sparse()))
    assert list(usual.distinct_keys) == per_field == list(usual.distinct_values)
    assert usual.total_distinct_keys == total


def test_a_profiled_range_is_the_profile_of_those_rows_and_every_row_is_checked(
    tmp_path: Path,
) -> None:
    spec = DataSpec(TRAIN)
    for cut in (1, 4096, 5000, 65_536 // 16, 7199):
        head = scan(DataSpec(TRAIN, stop_row=cut))
        seen: list[SparseDataset] = []
        split = scan(spec, profile_rows=cut, on_chunk=seen.append)
        assert split == head, cut
        assert sum(c.rows for c in seen) == cut
    lines = Path(TRAIN).read_text().splitlines(True)
    lines[7000] = "2" + lines[7000][1:]  # a bad label after the cut
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines))
    with pytest.raises(DataError, match=r"bad\.tsv:7001:1: label 'label' is '2'"):
        scan(DataSpec(str(bad)), profile_rows=5000)


def test_scan_shows_every_profiled_row_to_the_hook_in_order() -> None:
    spec = DataSpec(TRAIN)
    seen: list[SparseDataset] = []
    scan(spec, on_chunk=seen.append)
    ds = read_all(spec)
    joined = np.concatenate([c.keys for c in seen])
    assert np.array_equal(joined, ds.keys)
    assert sum(c.rows for c in seen) == ds.rows


# ----- MiniBatchSizes ---------------------------------------------------------------------


def brute_largest(ds: SparseDataset, workers: int, per_worker: int, batches: int) -> int:
    best = 0
    for g in range(batches * workers):
        lo, hi = ds.offsets[g * per_worker], ds.offsets[(g + 1) * per_worker]
        best = max(best, len(set(ds.keys[lo:hi].tolist())))
    return best


@pytest.mark.parametrize("cuts", [[1000, 2000, 4999], [7, 8, 9, 10, 3000], [21, 42, 4000], []])
def test_mini_batch_sizes_from_any_chunking_equal_a_brute_count(cuts: list[int]) -> None:
    rng = np.random.default_rng(0)
    rows = 5000
    lengths = rng.integers(0, 8, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    keys = rng.integers(0, 50, int(offsets[-1])).astype(np.int64)
    ds = SparseDataset(
        offsets, keys, np.zeros(rows, np.float32), np.zeros((rows, 0), np.float32), ("c",), ()
    )
    workers, per_worker = 3, 7
    sizes = MiniBatchSizes(workers, per_worker)
    lo = 0
    for cut in [*cuts, rows]:
        sizes(ds.row_slice(lo, cut))
        lo = cut
    whole = rows // (workers * per_worker)
    assert sizes.batches == whole
    for n in (1, 5, whole):
        assert sizes.largest(n) == brute_largest(ds, workers, per_worker, n), n
    assert sizes.max_row_keys == int(lengths.max())
    with pytest.raises(ValueError, match="were seen"):
        sizes.largest(whole + 1)
    one = mini_batch_sizes(offsets[: 2 * per_worker + 1], keys, per_worker)
    assert one.tolist() == [
        len(set(keys[offsets[g * per_worker] : offsets[(g + 1) * per_worker]].tolist()))
        for g in range(2)
    ]


def test_the_first_pass_gives_the_largest_mini_batch_a_pass_of_its_own_gave() -> None:
    from scheduler_service.simulate import largest_mini_batch

    spec = DataSpec(TRAIN)
    ds = read_all(spec)
    for workers, per_worker in ((8, 128), (4, 32), (3, 100)):
        sizes = MiniBatchSizes(workers, per_worker)
        scan(spec, on_chunk=sizes)
        batches = ds.rows // (workers * per_worker)
        assert sizes.largest(batches) == largest_mini_batch(ds, workers, per_worker, None)
        assert sizes.largest(2) == largest_mini_batch(ds, workers, per_worker, 2)


# ----- the distinct count ------------------------------------------------------------------


def test_distinct_counter_counts_collisions_and_keys_shared_by_fields() -> None:
    values = pa.array(["a", "b", "c", "d", "e"])
    counter = DistinctCounter(3, capacity=16)
    # Field 0: "a" and "b" share key 7 (a collision); "c" has key 8. Field 1: "d" has key 7
    # too (a key shared by two fields). Field 2: "e" twice, one value.
    counter.add(0, values, np.array([0, 1, 2]), np.array([7, 7, 8]))
    counter.add(0, values, np.array([0, 2]), np.array([7, 8]))  # seen again: no change
    counter.add(1, values, np.array([3]), np.array([7]))
    counter.add(2, values, np.array([4, 4]), np.array([9, 9]))
    assert counter.counts() == ((3, 1, 1), (2, 1, 1), 3)


def test_distinct_counter_grows_without_losing_an_entry() -> None:
    rng = np.random.default_rng(1)
    n = 50_000
    strings = pa.array([f"v{i}" for i in range(n)])
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    counter = DistinctCounter(2, capacity=16)
    for lo in range(0, n, 3000):
        cells = np.arange(lo, min(lo + 3000, n), dtype=np.int64)
        counter.add(lo % 2, strings, cells, keys[cells])
        counter.add(lo % 2, strings, cells[::2], keys[cells[::2]])  # repeats
    per_field = [sum(min(3000, n - lo) for lo in range(0, n, 3000) if lo % 2 == f) for f in (0, 1)]
    assert counter.counts() == (tuple(per_field), tuple(per_field), n)
    assert counter.table.shape[0] <= 2 * n / 0.7
    assert np.array_equal(fingerprints(strings, np.array([3, 1])), fingerprints(strings)[[3, 1]])


def test_a_feeder_without_the_job_s_row_count_counts_the_rows_by_parsing() -> None:
    from heraldps.job import TrainingJob
    from launcher.feed import job_batches

    for max_rows, rows in ((None, 7200), (5000, 5000)):
        job = TrainingJob(data=TRAIN, max_rows=max_rows, workers=4, batch_size_per_worker=25)
        batches = job_batches(job)
        assert batches.rows == rows and len(batches) == rows // 100
