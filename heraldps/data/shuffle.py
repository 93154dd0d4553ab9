"""A per-epoch shuffle of a training split larger than memory: a two-pass bucket shuffle.

The rows of an epoch come out in a uniformly random order drawn from ``(seed, epoch)``,
holding at most ``buffer_rows`` rows (plus one reader block) whatever the file's size:

1. **Scatter.** The split is streamed in file order, in blocks of ``BLOCK_ROWS`` rows (the
   reader's conversion unit). Every row is sent to one of ``K = ceil(rows / buffer_rows)``
   buckets, whose sizes are fixed in advance (the rows split as evenly as possible, so none
   exceeds ``buffer_rows``): a block's share of each bucket is a multivariate
   hypergeometric draw from the bucket places still free, and which of the block's rows
   fill them is a permutation of the block. Each block's rows are written, grouped by
   bucket, to one spill file of converted rows (keys, fields, labels, dense values), with
   the place of every bucket's segment noted.
2. **Gather.** Bucket by bucket: its segments are read back (``<= buffer_rows`` rows), put
   in the order of a permutation, and handed on a block at a time.

A random assignment of the rows to buckets of fixed sizes followed by a random order
within each bucket is a uniformly random permutation of all the rows, as
``numpy.random.default_rng([seed, epoch]).permutation(rows)`` of the in-memory shuffle is.
With ``buffer_rows >= rows`` there is one bucket and no draw for the scatter; its
permutation is drawn from the same generator as the in-memory shuffle's, so the order is
exactly the in-memory one. The price is a write and a read of the converted split per
epoch (docs/training.md "The shuffle" has the measurements), and the first rows of an
epoch come only after the whole scatter pass.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import BufferedRandom
from pathlib import Path

import numpy as np
import numpy.typing as npt

from heraldps.data.dataset import SparseDataset
from heraldps.data.errors import DataError
from heraldps.data.reader import blocks, rebatch
from heraldps.data.spec import DataSpec

# The rows read, scattered and handed on at once: the reader's conversion unit
# (``reader._CONVERT_ROWS``), so the shuffle reads as fast as the file-order stream does,
# and what it holds beside its buffer is the block the reader holds anyway.
BLOCK_ROWS = 65_536

# The spill file's arrays per segment, in order (lengths: keys per row).
_LENGTH, _KEY, _FIELD, _LABEL, _DENSE = np.int64, np.int64, np.int32, np.float32, np.float32


def bucket_sizes(rows: int, buffer_rows: int) -> npt.NDArray[np.int64]:
    """The rows of each bucket: ``ceil(rows / buffer_rows)`` buckets, sizes differing by at
    most one, none above ``buffer_rows``."""
    if buffer_rows < 1:
        raise ValueError(f"buffer_rows must be >= 1, got {buffer_rows}")
    count = max(1, math.ceil(rows / buffer_rows))
    sizes = np.full(count, rows // count, dtype=np.int64)
    sizes[: rows % count] += 1
    return sizes


@dataclass(frozen=True)
class _Segment:
    """One block's rows of one bucket in the spill file."""

    offset: int  # bytes from the file's start
    rows: int
    keys: int


@dataclass
class ShuffledRows:
    """The rows of ``spec`` (``rows`` of them, as the first pass counted) in the order of
    ``epoch`` (from 1), drawn from ``(seed, epoch)``; iterate once per epoch.

    ``spill_dir`` holds the epoch's spill file (deleted when the iteration ends or is
    closed). ``peak_rows`` records the most rows the shuffle held at once: the block being
    scattered and its reordered copy, or the bucket being gathered and the piece cut from
    it; at most ``max(buffer_rows, block_rows) + block_rows``."""

    spec: DataSpec
    rows: int
    buffer_rows: int
    seed: int
    epoch: int
    spill_dir: Path
    block_rows: int = BLOCK_ROWS
    peak_rows: int = field(default=0, init=False)
    _held: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.buffer_rows < 1 or self.block_rows < 1:
            raise ValueError("buffer_rows and block_rows must be >= 1")

    def _hold(self, rows: int) -> None:
        self._held += rows
        self.peak_rows = max(self.peak_rows, self._held)

    def __iter__(self) -> Iterator[SparseDataset]:
        """Pieces of at most ``block_rows`` rows; all ``rows`` rows once each, in order."""
        sizes = bucket_sizes(self.rows, self.buffer_rows)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"shuffle-epoch-{self.epoch}-", suffix=".bin",
                                    dir=self.spill_dir)  # fmt: skip
        try:
            with os.fdopen(fd, "w+b") as spill:
                segments, has_fields = self._scatter(spill, sizes)
                yield from self._gather(spill, sizes, segments, has_fields)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    def _scatter(
        self, spill: BufferedRandom, sizes: npt.NDArray[np.int64]
    ) -> tuple[list[list[_Segment]], bool]:
        """Pass 1: every block's rows into the spill file, grouped by bucket."""
        rng = np.random.default_rng([self.seed, self.epoch, 1])  # the scatter's draws
        free = sizes.copy()  # places left in each bucket
        segments: list[list[_Segment]] = [[] for _ in sizes]
        has_fields = True
        seen = 0
        for block in blocks(self.spec, self.block_rows):
            n = block.rows
            self._hold(n)
            if seen + n > self.rows:
                raise DataError(f"{self.spec.source}: more than the {self.rows:,} rows the first "
                                "pass counted; the file changed during the run")  # fmt: skip
            seen += n
            has_fields = has_fields and block.fields is not None
            if sizes.shape[0] == 1:  # one bucket: the rows stay in file order here
                shares, grouped = np.array([n], dtype=np.int64), block
            else:
                shares = rng.multivariate_hypergeometric(free, n, method="marginals")
                grouped = block.take(rng.permutation(n).astype(np.int64))
                self._hold(n)
            free -= shares
            starts = np.concatenate([[0], np.cumsum(shares)])
            for b in np.flatnonzero(shares):
                part = grouped.row_slice(int(starts[b]), int(starts[b + 1]))
                segments[b].append(_write(spill, part, has_fields))
            self._hold(-n if grouped is block else -2 * n)
        if seen != self.rows:
            raise DataError(f"{self.spec.source}: {seen:,} rows, the first pass counted "
                            f"{self.rows:,}; the file changed during the run")  # fmt: skip
        return segments, has_fields

    def _gather(
        self,
        spill: BufferedRandom,
        sizes: npt.NDArray[np.int64],
        segments: list[list[_Segment]],
        has_fields: bool,
    ) -> Iterator[SparseDataset]:
        """Pass 2: bucket after bucket, read back and handed on in a permuted order."""
        rng = np.random.default_rng([self.seed, self.epoch])  # as the in-memory shuffle
        for size, parts in zip(sizes, segments, strict=True):
            bucket = self._read_bucket(spill, parts, has_fields)
            assert bucket.rows == size
            self._hold(bucket.rows)
            order = rng.permutation(int(size)).astype(np.int64)
            for lo in range(0, bucket.rows, self.block_rows):
                piece = bucket.take(order[lo : lo + self.block_rows])
                self._hold(piece.rows)
                yield piece
                self._hold(-piece.rows)
            self._hold(-bucket.rows)
            del bucket

    def _read_bucket(
        self, spill: BufferedRandom, parts: list[_Segment], has_fields: bool
    ) -> SparseDataset:
        """A bucket's segments read straight into its arrays (no second copy)."""
        sparse, dense_columns = self.spec.sparse(), self.spec.dense()
        rows, keys = sum(s.rows for s in parts), sum(s.keys for s in parts)
        width = len(dense_columns)
        out = _Arrays(
            lengths=np.empty(rows, dtype=_LENGTH),
            keys=np.empty(keys, dtype=_KEY),
            fields=np.empty(keys if has_fields else 0, dtype=_FIELD),
            labels=np.empty(rows, dtype=_LABEL),
            dense=np.empty((rows, width), dtype=_DENSE),
        )
        row = key = 0
        for s in parts:
            spill.seek(s.offset)
            _read_into(spill, out.lengths[row : row + s.rows])
            _read_into(spill, out.keys[key : key + s.keys])
            if has_fields:
                _read_into(spill, out.fields[key : key + s.keys])
            _read_into(spill, out.labels[row : row + s.rows])
            _read_into(spill, out.dense[row : row + s.rows])
            row, key = row + s.rows, key + s.keys
        offsets = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(out.lengths, out=offsets[1:])
        return SparseDataset(offsets, out.keys, out.labels, out.dense, sparse, dense_columns,
                             out.fields if has_fields else None)  # fmt: skip


@dataclass(frozen=True)
class _Arrays:
    """A bucket's arrays as the spill file stores them."""

    lengths: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    fields: npt.NDArray[np.int32]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]


def _write(spill: BufferedRandom, part: SparseDataset, has_fields: bool) -> _Segment:
    """``part`` appended to the spill file: keys per row, keys, fields, labels, dense."""
    offset = spill.seek(0, os.SEEK_END)
    arrays: list[npt.NDArray[np.generic]] = [np.diff(part.offsets).astype(_LENGTH), part.keys]
    if has_fields:
        assert part.fields is not None
        arrays.append(part.fields)
    arrays += [part.labels, part.dense]
    for array in arrays:
        spill.write(np.ascontiguousarray(array).data.cast("B"))
    return _Segment(offset, part.rows, int(part.keys.shape[0]))


def _read_into(spill: BufferedRandom, out: npt.NDArray[np.generic]) -> None:
    """Fill ``out`` (a contiguous slice) with the spill file's next bytes."""
    if out.size and spill.readinto(out.data.cast("B")) != out.nbytes:
        raise DataError(f"the shuffle's spill file {spill.name} is shorter than written")


def shuffled_batches(rows: ShuffledRows, batch_size: int) -> Iterator[SparseDataset]:
    """The epoch's whole global batches of ``batch_size`` rows, in the shuffled order; the
    partial last batch is dropped (as every pass of the file-order stream drops it)."""
    for batch in rebatch(iter(rows), batch_size):
        if batch.rows == batch_size:
            yield batch
