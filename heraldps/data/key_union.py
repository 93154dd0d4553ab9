"""The distinct keys of a stream of chunks, in memory that follows the vocabulary.

Each chunk's distinct keys are buffered and merged into the sorted set once the buffer
outgrows it (as a log-structured merge does), so the cost stays O(n log n) over the
stream and the memory about twice the distinct keys (8 bytes each), never the file.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt


class KeyUnion:
    """Add chunks of keys; ``result()`` is the sorted distinct keys of all of them."""

    def __init__(self) -> None:
        self._merged = np.zeros(0, np.int64)
        self._pending: list[npt.NDArray[np.int64]] = []
        self._pending_size = 0

    def add(self, keys: npt.NDArray[np.int64]) -> None:
        chunk = np.unique(keys)
        self._pending.append(chunk)
        self._pending_size += chunk.shape[0]
        if self._pending_size > max(self._merged.shape[0], 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if self._pending:
            self._merged = np.unique(np.concatenate([self._merged, *self._pending]))
            self._pending, self._pending_size = [], 0

    def result(self) -> npt.NDArray[np.int64]:
        self._merge()
        return self._merged


def distinct_keys(chunks: Iterable[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """The sorted distinct keys of every chunk."""
    found = KeyUnion()
    for keys in chunks:
        found.add(keys)
    return found.result()
