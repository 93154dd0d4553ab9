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

import atexit
import contextlib
import itertools
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
from heraldps.data.global_batches import batch_count
from heraldps.data.reader import blocks, rebatch
from heraldps.data.spec import DataSpec

# The rows read, scattered and handed on at once: the reader's conversion unit
# (``reader._CONVERT_ROWS``), so the shuffle reads as fast as the file-order stream does,
# and what it holds beside its buffer is the block the reader holds anyway.
BLOCK_ROWS = 65_536

# The spill file's arrays per segment, in order (lengths: keys per row).
_LENGTH, _KEY, _FIELD, _LABEL, _DENSE = np.int64, np.int64, np.int32, np.float32, np.float32


# Spill files of iterations not yet ended. A run that stops on an exception may leave its
# iterator unclosed (its traceback holds it) until the interpreter exits: removed then.
_LIVE: set[str] = set()


def _remove(name: str) -> None:
    _LIVE.discard(name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


@atexit.register
def _remove_all() -> None:
    for name in list(_LIVE):
        _remove(name)


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
class _Index:
    """Where the spill file holds what: per block, its byte offset, rows, keys and whether it
    has fields, and the first row and first key of each bucket's rows in it (16 bytes per
    block and bucket: all the shuffle keeps beside its rows)."""

    offsets: npt.NDArray[np.int64]  # [blocks]
    rows: npt.NDArray[np.int64]  # [blocks]
    keys: npt.NDArray[np.int64]  # [blocks]
    has_fields: npt.NDArray[np.bool_]  # [blocks]
    row_starts: npt.NDArray[np.int64]  # [blocks, buckets + 1]
    key_starts: npt.NDArray[np.int64]  # [blocks, buckets + 1]


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
        _LIVE.add(name)
        try:
            with os.fdopen(fd, "w+b") as spill:
                index = self._scatter(spill, sizes)
                yield from self._gather(spill, sizes, index)
        finally:
            _remove(name)

    def _scatter(self, spill: BufferedRandom, sizes: npt.NDArray[np.int64]) -> _Index:
        """Pass 1: every block's rows into the spill file, grouped by bucket."""
        rng = np.random.default_rng([self.seed, self.epoch, 1])  # the scatter's draws
        free = sizes.copy()  # places left in each bucket
        offsets, rows, keys, has_fields, row_starts, key_starts = [], [], [], [], [], []
        seen = 0
        for block in blocks(self.spec, self.block_rows):
            n = block.rows
            self._hold(n)
            if seen + n > self.rows:
                raise DataError(f"{self.spec.source}: more than the {self.rows:,} rows the first "
                                "pass counted; the file changed during the run")  # fmt: skip
            seen += n
            if sizes.shape[0] == 1:  # one bucket: the rows stay in file order here
                shares, grouped = np.array([n], dtype=np.int64), block
            else:
                shares = rng.multivariate_hypergeometric(free, n, method="marginals")
                grouped = block.take(rng.permutation(n).astype(np.int64))
                self._hold(n)
            free -= shares
            starts = np.zeros(shares.shape[0] + 1, dtype=np.int64)
            np.cumsum(shares, out=starts[1:])
            offsets.append(_write(spill, grouped))
            rows.append(n)
            keys.append(int(grouped.keys.shape[0]))
            has_fields.append(grouped.fields is not None)
            row_starts.append(starts)
            key_starts.append(grouped.offsets[starts])
            self._hold(-n if grouped is block else -2 * n)
        if seen != self.rows:
            raise DataError(f"{self.spec.source}: {seen:,} rows, the first pass counted "
                            f"{self.rows:,}; the file changed during the run")  # fmt: skip
        return _Index(np.array(offsets, dtype=np.int64), np.array(rows, dtype=np.int64),
                      np.array(keys, dtype=np.int64), np.array(has_fields, dtype=np.bool_),
                      np.stack(row_starts), np.stack(key_starts))  # fmt: skip

    def _gather(
        self, spill: BufferedRandom, sizes: npt.NDArray[np.int64], index: _Index
    ) -> Iterator[SparseDataset]:
        """Pass 2: bucket after bucket, read back and handed on in a permuted order."""
        rng = np.random.default_rng([self.seed, self.epoch])  # as the in-memory shuffle
        for b, size in enumerate(sizes):
            bucket = self._read_bucket(spill, index, b)
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

    def _read_bucket(self, spill: BufferedRandom, index: _Index, b: int) -> SparseDataset:
        """Bucket ``b``'s rows of every block, read straight into its arrays (no second copy)."""
        sparse, dense_columns = self.spec.sparse(), self.spec.dense()
        width = len(dense_columns)
        row_lo, row_hi = index.row_starts[:, b], index.row_starts[:, b + 1]
        key_lo, key_hi = index.key_starts[:, b], index.key_starts[:, b + 1]
        rows, keys = int((row_hi - row_lo).sum()), int((key_hi - key_lo).sum())
        fields = bool(index.has_fields.all())
        out = _Arrays(
            lengths=np.empty(rows, dtype=_LENGTH),
            keys=np.empty(keys, dtype=_KEY),
            fields=np.empty(keys if fields else 0, dtype=_FIELD),
            labels=np.empty(rows, dtype=_LABEL),
            dense=np.empty((rows, width), dtype=_DENSE),
        )
        row = key = 0
        for i in np.flatnonzero(row_hi > row_lo):
            n, k = int(index.rows[i]), int(index.keys[i])
            r0, r1, k0, k1 = int(row_lo[i]), int(row_hi[i]), int(key_lo[i]), int(key_hi[i])
            at = int(index.offsets[i])  # the block's arrays, each at its place
            nr, nk = r1 - r0, k1 - k0
            _read_at(spill, at + 8 * r0, out.lengths[row : row + nr])
            at += 8 * n
            _read_at(spill, at + 8 * k0, out.keys[key : key + nk])
            at += 8 * k
            if index.has_fields[i]:
                if fields:
                    _read_at(spill, at + 4 * k0, out.fields[key : key + nk])
                at += 4 * k
            _read_at(spill, at + 4 * r0, out.labels[row : row + nr])
            at += 4 * n
            _read_at(spill, at + 4 * width * r0, out.dense[row : row + nr])
            row, key = row + nr, key + nk
        offsets = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(out.lengths, out=offsets[1:])
        return SparseDataset(offsets, out.keys, out.labels, out.dense, sparse, dense_columns,
                             out.fields if fields else None)  # fmt: skip


@dataclass(frozen=True)
class _Arrays:
    """A bucket's arrays as the spill file stores them."""

    lengths: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    fields: npt.NDArray[np.int32]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]


def _write(spill: BufferedRandom, block: SparseDataset) -> int:
    """``block`` appended to the spill file (keys per row, keys, fields if any, labels,
    dense values); its byte offset."""
    offset = spill.seek(0, os.SEEK_END)
    arrays: list[npt.NDArray[np.generic]] = [np.diff(block.offsets).astype(_LENGTH), block.keys]
    if block.fields is not None:
        arrays.append(block.fields.astype(_FIELD, copy=False))
    arrays += [block.labels, block.dense]
    for array in arrays:
        spill.write(np.ascontiguousarray(array).data.cast("B"))
    return offset


def _read_at(spill: BufferedRandom, at: int, out: npt.NDArray[np.generic]) -> None:
    """Fill ``out`` (a contiguous slice) with the spill file's bytes from ``at``."""
    if not out.size:
        return
    spill.seek(at)
    if spill.readinto(out.data.cast("B")) != out.nbytes:
        raise DataError(f"the shuffle's spill file {spill.name} is shorter than written")


def shuffled_batches(rows: ShuffledRows, batch_size: int) -> Iterator[SparseDataset]:
    """The epoch's whole global batches of ``batch_size`` rows, in the shuffled order; the
    partial last batch is dropped (as every pass of the file-order stream drops it)."""
    for batch in rebatch(iter(rows), batch_size):
        if batch.rows == batch_size:
            yield batch


@dataclass(frozen=True)
class ShuffledEpochs:
    """The global batches of ``epochs`` streaming-shuffled epochs (epoch ``e`` from 1, as
    ``heraldps train`` numbers them), capped at ``iterations``: what ``heraldps feed``
    submits for a job file with ``shuffle_buffer_rows``, the batches ``heraldps train``
    trains. Like ``StreamedBatches``: ``len`` without reading, ``iter_from`` to resume (an
    epoch begun before is shuffled again from its start, its first batches skipped)."""

    spec: DataSpec
    rows: int
    batch_size: int
    iterations: int | None
    epochs: int
    buffer_rows: int
    seed: int
    spill_dir: Path

    def __len__(self) -> int:
        return batch_count(self.rows, self.batch_size, self.iterations, self.epochs)

    def iter_from(self, start: int) -> Iterator[SparseDataset]:
        """Batches ``start``, ``start + 1``, ... of the run, in order."""
        total, per_epoch = len(self), self.rows // self.batch_size

        def batches() -> Iterator[SparseDataset]:
            first, skip = divmod(start, per_epoch)
            for epoch in range(first + 1, self.epochs + 1):
                rows = ShuffledRows(self.spec, self.rows, self.buffer_rows, self.seed, epoch,
                                    self.spill_dir)  # fmt: skip
                yield from itertools.islice(shuffled_batches(rows, self.batch_size), skip, None)
                skip = 0

        return itertools.islice(batches(), max(0, total - start))
