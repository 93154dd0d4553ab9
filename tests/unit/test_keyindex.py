"""The compiled key index against a Python dict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.keyindex import KeyIndex, SlotMap, distinct

int64s = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.one_of(int64s, st.integers(-5, 5)), max_size=300), max_size=8))
def test_insert_and_lookup_match_a_dict(batches: list[list[int]]) -> None:
    index = KeyIndex()
    reference: dict[int, int] = {}
    for batch in batches:
        keys = np.array(batch, dtype=np.int64)
        rows = index.insert(keys)
        for key, row in zip(batch, rows.tolist(), strict=True):
            assert reference.setdefault(key, len(reference)) == row
        assert len(index) == len(reference)
    probe = np.array([*reference, 7_777_777_777], dtype=np.int64)
    expected = [reference.get(k, -1) for k in probe.tolist()]
    assert index.lookup(probe).tolist() == expected


def test_growth_keeps_rows() -> None:
    index = KeyIndex()
    keys = np.random.default_rng(1).permutation(200_000).astype(np.int64) * 7919
    rows = np.concatenate([index.insert(chunk) for chunk in np.array_split(keys, 13)])
    assert rows.tolist() == list(range(200_000))
    assert np.array_equal(index.lookup(keys[::-1]), rows[::-1])
    assert index.nbytes == KeyIndex.bytes_for(200_000)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.one_of(int64s, st.integers(-3, 3)), max_size=200))
def test_distinct_matches_first_occurrence(keys: list[int]) -> None:
    unique, inverse = distinct(np.array(keys, dtype=np.int64))
    assert unique.tolist() == list(dict.fromkeys(keys))
    assert unique[inverse].tolist() == keys


def test_slot_map_against_a_dict() -> None:
    rng = np.random.default_rng(5)
    slot_map = SlotMap()
    reference: dict[int, int] = {}
    for step in range(60):
        new = np.unique(rng.integers(-500, 500, 40))
        new = new[[int(k) not in reference for k in new.tolist()]]
        slot_map.put(new, np.arange(new.shape[0]) + 1000 * step)
        values = (np.arange(new.shape[0]) + 1000 * step).tolist()
        reference.update(zip(new.tolist(), values, strict=True))
        gone = rng.integers(-500, 500, 30)
        removed = slot_map.remove(gone)
        present = {int(k) for k in gone.tolist() if int(k) in reference}
        assert removed == len(present)
        for k in present:
            del reference[k]
        probe_keys = rng.integers(-600, 600, 200)
        expected = [reference.get(int(k), -1) for k in probe_keys.tolist()]
        assert slot_map.lookup(probe_keys).tolist() == expected
        assert len(slot_map) == len(reference)


def test_removed_keys_free_their_rows_for_new_keys() -> None:
    """Removing keys frees their rows; new keys take them (last freed first) before any
    new row, so rows stay below the most keys held at once; lookups stay exact."""
    index = KeyIndex()
    first = np.arange(100, dtype=np.int64) * 7
    index.insert(first)
    assert index.remove(first[10:40]) == 30 and index.remove(first[10:12]) == 0
    assert len(index) == 70 and index.rows == 100
    assert (index.lookup(first[10:40]) == -1).all()
    assert index.lookup(first[:10]).tolist() == list(range(10))
    new = np.arange(50, dtype=np.int64) * 7 + 1
    rows = index.insert(new)
    assert sorted(rows[:30].tolist()) == list(range(10, 40))  # the freed rows first
    assert rows[30:].tolist() == list(range(100, 120))
    assert len(index) == 120 and index.rows == 120
    assert index.lookup(new).tolist() == rows.tolist()
    assert index.lookup(first[40:]).tolist() == list(range(40, 100))
    index.remove(new[:5])
    again = index.insert(new[:5])
    assert sorted(again.tolist()) == sorted(rows[:5].tolist())
    assert index.lookup(new).tolist() == [*again.tolist(), *rows[5:].tolist()]
