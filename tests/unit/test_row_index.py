"""The Staged-PS table's row index and growable row arrays (tens of millions of rows)."""

from __future__ import annotations

import mmap
import os
import re

import numpy as np
import pytest

from heraldps import hostmem
from heraldps.hostmem import HUGE_PAGE
from heraldps.keyindex import KeyIndex
from heraldps.optim import AdaGrad
from heraldps.spec import TableSpec
from ps_server.memory import MemoryBudget
from ps_server.row_arrays import RowArray
from ps_server.row_index import GROW_TO, MAX_LOAD, MIN_CAPACITY, RowIndex, capacity_for
from ps_server.table import StagedTable


def test_rows_match_keyindex_across_growth() -> None:
    rng = np.random.default_rng(3)
    edge = np.array([0, -1, 1, np.iinfo(np.int64).min, np.iinfo(np.int64).max], dtype=np.int64)
    batches = [edge] + [rng.integers(-(2**63), 2**63 - 1, 5000) for _ in range(6)]
    batches.append(np.concatenate([batches[1][:100], batches[3], batches[1][:100]]))
    ours, reference = RowIndex(), KeyIndex()
    for keys in batches:
        assert np.array_equal(ours.lookup(keys), reference.lookup(keys))
        assert np.array_equal(ours.insert(keys), reference.insert(keys))
        assert len(ours) == len(reference)
        assert len(ours) <= ours.capacity * MAX_LOAD
    assert ours.capacity > MIN_CAPACITY  # it grew
    everything = np.concatenate(batches)
    assert np.array_equal(ours.lookup(everything), reference.lookup(everything))
    first = np.unique(everything, return_index=True)[1]
    assert np.array_equal(ours.keys_by_row(), everything[np.sort(first)])
    assert (ours.lookup(np.array([12345678901, -987654321])) == -1).all()


def test_load_stays_between_grow_to_and_max_load() -> None:
    index = RowIndex()
    keys = np.arange(200_000, dtype=np.int64) * 7919
    for part in np.array_split(keys, 40):
        before = index.capacity
        expected = index.bytes_after(len(index) + part.shape[0])
        index.insert(part)
        assert index.nbytes == expected
        if index.capacity != before:
            assert len(index) / index.capacity == pytest.approx(GROW_TO, abs=0.01)
    assert GROW_TO - 0.01 <= len(index) / index.capacity <= MAX_LOAD
    assert index.nbytes / len(index) <= 16 / GROW_TO + 1


def test_expected_rows_never_rehash() -> None:
    index = RowIndex(expected_rows=100_000)
    assert index.capacity == capacity_for(100_000)
    slots = index._slots
    index.insert(np.arange(100_000, dtype=np.int64))
    assert index._slots is slots and index.capacity == capacity_for(100_000)


def test_row_array_grows_in_place_keeping_rows() -> None:
    column = RowArray((3,), np.float32, 10)
    column.array[:] = np.arange(30, dtype=np.float32).reshape(10, 3)
    grown = column.grow(100_000)
    assert grown.shape == (100_000, 3) and column.grows_in_place == 1
    assert np.array_equal(grown[:10].reshape(-1), np.arange(30)) and not grown[10:].any()
    held = column.array  # a view still alive: the mapping cannot move, so it is copied
    column.grow(200_000)
    assert column.grows_by_copy == 1 and np.array_equal(column.array[:10], held[:10])
    del held, grown
    column.grow(300_000)
    assert column.grows_in_place == 2 and column.array.shape == (300_000, 3)
    assert np.array_equal(column.array[:10].reshape(-1), np.arange(30))
    empty = RowArray((0,), np.float32)
    assert empty.grow(50).shape == (50, 0)


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def test_big_mappings_are_whole_huge_pages_and_stay_on_their_boundaries() -> None:
    """Whatever the capacity (here 174,763 rows of 272 bytes: pulls cut at a message
    limit), a big array's mapping is a whole number of 2 MiB pages; from Linux 6.7 the
    kernel then puts it, and wherever mremap moves it, on a 2 MiB boundary."""
    assert hostmem.mapping_bytes(1) == mmap.PAGESIZE
    assert hostmem.mapping_bytes(HUGE_PAGE - 1) == HUGE_PAGE
    assert hostmem.mapping_bytes(HUGE_PAGE + 1) == 2 * HUGE_PAGE
    column = RowArray((34,), np.int64)
    for capacity in (174_763, 349_526, 699_052, 1_398_104):
        column.grow(capacity)
        column.array[-1] = 1  # touched, as the rows a pull creates
        assert column._mapping is not None and len(column._mapping) % HUGE_PAGE == 0
        if _kernel_at_least(6, 7):
            assert column.array.__array_interface__["data"][0] % HUGE_PAGE == 0
    assert column.grows_in_place == 3 and column.grows_by_copy == 0
    index = hostmem.zeros((400_003, 2), np.int64)
    assert index.shape == (400_003, 2) and not index.any()
    mapping = index
    while isinstance(mapping, np.ndarray):
        mapping = mapping.base
    if isinstance(mapping, memoryview):
        mapping = mapping.obj
    assert isinstance(mapping, mmap.mmap) and len(mapping) % HUGE_PAGE == 0


def test_table_grows_without_copies_and_exports_keys() -> None:
    spec = TableSpec("emb", 4, optimizer=AdaGrad(lr=0.1))
    table = StagedTable(spec, MemoryBudget(), -1)
    keys = np.random.default_rng(1).permutation(50_000).astype(np.int64) - 25_000
    for part in np.array_split(keys, 7):
        table.pull(part, with_state=False)
    assert table.rows == 50_000 and table.capacity >= 50_000
    assert table._records.grows_by_copy == 0
    exported = table.export(-1)
    assert np.array_equal(exported.keys, keys)
    assert np.array_equal(exported.values, table.pull(keys, False).values)
    sized = StagedTable(spec, MemoryBudget(), -1, expected_rows=50_000)
    sized.pull(keys, with_state=True)
    assert sized.capacity == 50_000 and sized._index.capacity == capacity_for(50_000)
    assert sized._records.grows_in_place == sized._records.grows_by_copy == 0


def test_expected_rows_flows_from_config_to_tables() -> None:
    from ps_server.server import PSConfig
    from ps_server.store import StagedStore

    store = StagedStore(expected_rows=5000)
    table, _ = store.create_table(TableSpec("emb", 4, optimizer=AdaGrad(lr=0.1)))
    assert table._index.capacity == capacity_for(5000) and table.capacity == 5000
    assert table.rows == 0 and table.nbytes == table._index.nbytes  # reserved, not charged
    with pytest.raises(ValueError, match="expected_rows must be >= 0"):
        StagedStore(expected_rows=-1)
    with pytest.raises(ValueError, match="--expected-rows must be >= 0"):
        PSConfig(expected_rows=-1)
