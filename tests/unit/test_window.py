"""The look-ahead window: which keys the held batches use, counted per batch."""

from __future__ import annotations

import numpy as np

from heraldps.keyindex import table_find
from scheduler_service.window import Window


def held(window: Window, keys: list[int]) -> list[bool]:
    return [bool(table_find(window.slots, np.int64(k)) >= 0) for k in keys]


def test_a_key_stays_while_any_held_batch_uses_it() -> None:
    window = Window()
    assert held(window, [1, 2]) == [False, False]
    first = window.enter(np.array([3, 1, 3, 2, 1]))
    assert first.tolist() == [3, 1, 2]  # distinct, first-occurrence order
    second = window.enter(np.array([2, 5, 2]))
    assert second.tolist() == [2, 5]
    assert len(window) == 4
    window.leave(first)
    assert held(window, [1, 2, 3, 5]) == [False, True, False, True]
    window.leave(second)
    assert len(window) == 0 and held(window, [2, 5]) == [False, False]


def test_rows_freed_by_leaving_keys_count_afresh() -> None:
    """Many batches through a window of two: what it holds is always the union of the last
    two batches, whatever rows the index reuses."""
    rng = np.random.default_rng(1)
    window = Window()
    batches = [rng.integers(0, 200, 50) for _ in range(40)]
    distinct = [window.enter(b) for b in batches[:2]]
    for t in range(2, 40):
        window.leave(distinct[t - 2])
        distinct.append(window.enter(batches[t]))
        expected = set(batches[t - 1].tolist()) | set(batches[t].tolist())
        assert len(window) == len(expected)
        assert all(held(window, sorted(expected)))
