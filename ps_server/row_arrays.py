"""Growable row arrays that grow without a copy: anonymous mappings extended by ``mremap``.

A table's values, optimizer state and clocks grow as keys arrive. Grown the
usual way (allocate double, copy, free), a table of 33M rows briefly holds its
5 GB twice and spends seconds copying. Here each array is a view of its own
anonymous mapping, hinted for huge pages (``heraldps.hostmem``); growing it
asks the kernel to extend the mapping (``mmap.resize``, i.e. ``mremap`` with
``MREMAP_MAYMOVE``), which moves page-table entries instead of bytes. Pages
past the rows written are never touched, so reserved capacity costs address
space, not memory.

Every mapping of 2 MiB or more is a whole number of huge pages long
(``hostmem.mapping_bytes``). The kernel (Linux 6.7 and later) then places it,
and every place ``mremap`` moves it to, on a 2 MiB boundary, so its huge pages
move whole. At any other length a move lands off the boundary and splits every
huge page of the table into 4 KiB pages: a 50M-row table of dim 64, grown
from capacities of 174,763 rows (the pulls that filled it were cut at the
64 MiB message limit), ended with 11-16% of its 14 GB on huge pages, and its
pulls took 1.5x as long (docs/figures.md, "The PS at 50M rows").

The mapping can only be resized while no view of it is alive; the table
holds its arrays only here, and takes its lock around a resize. Should a view
still be alive (or the platform lack ``mremap``), the array is grown by a
copy instead, as before.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import numpy as np

from heraldps import hostmem

_PAGE = mmap.PAGESIZE


def _advise(mapping: mmap.mmap) -> None:
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # advice only; THP may be disabled
            mapping.madvise(advice)


class RowArray:
    """A ``[capacity, *row_shape]`` array of ``dtype`` on an anonymous mapping (zeros)."""

    def __init__(self, row_shape: tuple[int, ...], dtype: Any, capacity: int = 0) -> None:
        self.row_shape = row_shape
        self.dtype = np.dtype(dtype)
        self.row_bytes: int = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._mapping: mmap.mmap | None = None
        self.array = np.empty((0, *row_shape), dtype=self.dtype)
        self.grows_in_place = 0  # how often a grow moved no bytes (tests and benchmarks)
        self.grows_by_copy = 0
        if capacity:
            self.grow(capacity)

    @property
    def capacity(self) -> int:
        return int(self.array.shape[0])

    def _map_bytes(self, capacity: int) -> int:
        return hostmem.mapping_bytes(capacity * self.row_bytes)

    def _view(self, capacity: int) -> np.ndarray:
        assert self._mapping is not None
        count = capacity * int(np.prod(self.row_shape, dtype=np.int64))
        flat = np.frombuffer(self._mapping, dtype=self.dtype, count=count)
        return flat.reshape((capacity, *self.row_shape))

    def grow(self, capacity: int) -> np.ndarray:
        """Make room for ``capacity`` rows (rows kept, new ones zero); returns the array.

        The caller must hold no other reference to ``array`` (it is replaced)."""
        if capacity <= self.capacity:
            return self.array
        old = self.capacity
        if self._mapping is not None and self.row_bytes:
            self.array = np.empty((0, *self.row_shape), dtype=self.dtype)  # drop our view
            try:
                self._mapping.resize(self._map_bytes(capacity))
            except (BufferError, OSError, SystemError, ValueError):
                self.array = self._view(old)  # a view is still alive: copy instead
            else:
                _advise(self._mapping)
                self.array = self._view(capacity)
                self.grows_in_place += 1
                return self.array
        mapping = mmap.mmap(
            -1, self._map_bytes(capacity), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        )
        _advise(mapping)
        previous, self._mapping = self.array, mapping
        self.array = self._view(capacity)
        self.array[:old] = previous
        if old:
            self.grows_by_copy += 1
        return self.array
