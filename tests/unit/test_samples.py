"""Samples on the wire and the rows a worker gets: ``SparseDataset.take``, the SampleBlock
codec, and the largest mini-batch the launcher checks against the cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.bundled import bundled_data
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.errors import CacheTooSmall, InvalidArgument
from heraldps.samples import decode_samples, encode_samples
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler
from scheduler_service.simulate import largest_mini_batch, plan_all

TRAIN, _ = bundled_data()
DATA = read_all(DataSpec(str(TRAIN), stop_row=600))


def test_take_gathers_rows_in_the_order_given() -> None:
    rows = np.array([5, 0, 5, 599], np.int64)
    taken = DATA.take(rows)
    assert taken.rows == 4
    for i, r in enumerate(rows.tolist()):
        keys = taken.keys[taken.offsets[i] : taken.offsets[i + 1]]
        assert np.array_equal(keys, DATA.keys[DATA.offsets[r] : DATA.offsets[r + 1]])
        assert taken.labels[i] == DATA.labels[r] and np.array_equal(taken.dense[i], DATA.dense[r])
    assert taken.fields is not None and DATA.fields is not None
    assert np.array_equal(
        taken.fields[: taken.offsets[1]], DATA.fields[DATA.offsets[5] : DATA.offsets[6]]
    )
    assert DATA.take(np.empty(0, np.int64)).rows == 0
    with pytest.raises(ValueError, match="row indices"):
        DATA.take(np.array([600], np.int64))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, DATA.rows - 1), max_size=40))
def test_a_block_decodes_to_the_samples_it_encodes(rows: list[int]) -> None:
    samples = DATA.take(np.array(rows, np.int64))
    back = decode_samples(encode_samples(samples))
    for name in ("offsets", "keys", "fields", "labels", "dense"):
        assert np.array_equal(getattr(back, name), getattr(samples, name)), name
    assert (back.sparse_columns, back.dense_columns) == (DATA.sparse_columns, DATA.dense_columns)


def test_malformed_blocks_name_their_field() -> None:
    good = encode_samples(DATA.take(np.arange(3, dtype=np.int64)))
    cases = {
        "offsets": (b"\x00" * 7, "x.offsets"),
        "fields": (b"\x00" * 4, "x.fields: expected one little-endian int32 per key"),
        "labels": (b"\x00" * 4, "x.labels"),
    }
    for field, (value, message) in cases.items():
        bad = type(good)()
        bad.CopyFrom(good)
        setattr(bad, field, value)
        with pytest.raises(InvalidArgument, match=message):
            decode_samples(bad, "x")
    bad = type(good)()
    bad.CopyFrom(good)
    bad.offsets = np.array([0, 5, 2, len(good.keys) // 8], "<i8").tobytes()
    with pytest.raises(InvalidArgument, match="non-decreasing"):
        decode_samples(bad, "x")
    unfielded = SparseDataset(DATA.offsets, DATA.keys, DATA.labels, DATA.dense,
                              DATA.sparse_columns, DATA.dense_columns)  # fmt: skip
    with pytest.raises(InvalidArgument, match="field"):
        encode_samples(unfielded)


@pytest.mark.parametrize(("workers", "per_worker"), [(4, 32), (2, 100), (8, 16)])
def test_largest_mini_batch_is_the_scheduler_s_own_limit(workers: int, per_worker: int) -> None:
    """The smallest cache the sequential modes accept: one row less and the scheduler refuses."""
    needed = largest_mini_batch(DATA, workers, per_worker, None)
    batches = list(DATA.batches(workers * per_worker))
    for capacity, fits in ((needed, True), (needed - 1, False)):
        scheduler = Scheduler(workers, capacity, "naive")
        try:
            for t, batch in enumerate(batches):
                scheduler.submit(Batch(t, batch.offsets, batch.keys, workers))
            ok = True
        except CacheTooSmall as exc:
            ok = False
            assert exc.needed == needed and exc.capacity == capacity
        assert ok is fits


def test_the_location_aware_dry_run_plans_every_pass() -> None:
    """The launcher's check plans what the run will train: every epoch, capped at iterations."""
    per_pass = DATA.rows // (4 * 32)
    assert plan_all(DATA, 4, 32, 2000, "herald", None, epochs=3).counts.iterations == 3 * per_pass
    assert plan_all(DATA, 4, 32, 2000, "herald", per_pass + 2, epochs=3).counts.iterations == (
        per_pass + 2
    )
