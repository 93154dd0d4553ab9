"""The global batches of a run: how many, and each in order, from memory or streamed.

The feeder (``heraldps local``, ``heraldps feed``), ``heraldps simulate`` and the
preflight checks all walk the same batches: whole global batches of
``workers x batch_size_per_worker`` rows, ``epochs`` passes, the partial tail of each
pass dropped, capped at ``iterations``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from heraldps.data.dataset import SparseDataset
from heraldps.data.reader import batches as stream_batches
from heraldps.data.spec import DataSpec
from heraldps.errors import InvalidArgument
from heraldps.jit import njit
from heraldps.sharding import splitmix64


def global_batches(
    dataset: SparseDataset, batch_size: int, iterations: int | None, epochs: int = 1
) -> list[SparseDataset]:
    """Consecutive full batches of ``batch_size`` rows, ``epochs`` passes, capped at
    ``iterations``; a partial last batch of each pass is dropped (as ``simulate`` does)."""
    per_epoch = dataset.rows // batch_size
    if per_epoch == 0:
        raise InvalidArgument(
            f"the data has {dataset.rows} rows, fewer than one global batch of {batch_size}; "
            "lower --workers or --batch-size-per-worker"
        )
    total = per_epoch * epochs if iterations is None else min(iterations, per_epoch * epochs)
    return [
        dataset.row_slice((t % per_epoch) * batch_size, (t % per_epoch + 1) * batch_size)
        for t in range(total)
    ]


def batch_count(rows: int, batch_size: int, iterations: int | None, epochs: int = 1) -> int:
    """Global batches of a run over ``rows`` rows: whole batches per pass, capped."""
    per_epoch = rows // batch_size
    if per_epoch == 0:
        raise InvalidArgument(
            f"the data has {rows:,} rows, fewer than one global batch of {batch_size:,}; "
            "lower --workers or --batch-size-per-worker"
        )
    total = per_epoch * epochs
    return total if iterations is None else min(iterations, total)


@dataclass(frozen=True)
class StreamedBatches:
    """The global batches of a run, read from the data as they are submitted.

    ``rows`` is the row count of ``spec`` (from the first pass); it gives the batch
    count without holding a batch, and lets a resumed feeder start at batch ``t``
    by skipping rows (parsed, not keyed) instead of building the batches before it."""

    spec: DataSpec
    rows: int
    batch_size: int
    iterations: int | None
    epochs: int = 1

    def __len__(self) -> int:
        return batch_count(self.rows, self.batch_size, self.iterations, self.epochs)

    def iter_from(self, start: int) -> Iterator[SparseDataset]:
        """Batches ``start``, ``start + 1``, ... of the run, in order."""
        total, size = len(self), self.batch_size
        per_epoch = self.rows // size
        epoch, within = divmod(start, per_epoch)
        parts: list[Iterator[SparseDataset]] = []
        if within:  # the rest of a pass begun before the restart
            rest = replace(self.spec, start_row=self.spec.start_row + within * size)
            parts.append(stream_batches(rest, size, epochs=1, limit=per_epoch - within))
            epoch += 1
        if epoch < self.epochs:
            parts.append(stream_batches(self.spec, size, epochs=self.epochs - epoch))
        return itertools.islice(itertools.chain.from_iterable(parts), max(0, total - start))


@dataclass(frozen=True)
class InMemoryBatches:
    """The global batches of a run over a data set already in memory (tests, samples)."""

    dataset: SparseDataset
    batch_size: int
    iterations: int | None
    epochs: int = 1

    def __len__(self) -> int:
        return batch_count(self.dataset.rows, self.batch_size, self.iterations, self.epochs)

    def iter_from(self, start: int) -> Iterator[SparseDataset]:
        batches = global_batches(self.dataset, self.batch_size, self.iterations, self.epochs)
        return iter(batches[start:])


GlobalBatches = StreamedBatches | InMemoryBatches


# ----- the largest mini-batch, from the pass that reads the data anyway -------------------


@njit(nogil=True)
def _distinct_per_group(
    offsets: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64],
    group_rows: int,
    out: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """``out[g]``: distinct keys of rows ``[g * group_rows, (g + 1) * group_rows)``. One
    small open-addressing set, reused group after group (slots stamped with the group)."""
    groups = out.shape[0]
    most = 0
    for g in range(groups):
        most = max(most, offsets[(g + 1) * group_rows] - offsets[g * group_rows])
    size = 16
    while size < 2 * most:
        size *= 2
    mask = np.uint64(size - 1)
    table = np.zeros(size, dtype=np.int64)
    stamp = np.zeros(size, dtype=np.int64)
    for g in range(groups):
        tag = g + 1
        count = 0
        for i in range(offsets[g * group_rows], offsets[(g + 1) * group_rows]):
            k = keys[i]
            s = splitmix64(np.uint64(k)) & mask
            while stamp[s] == tag and table[s] != k:
                s = (s + np.uint64(1)) & mask
            if stamp[s] != tag:
                stamp[s] = tag
                table[s] = k
                count += 1
        out[g] = count


def mini_batch_sizes(
    offsets: npt.NDArray[np.int64], keys: npt.NDArray[np.int64], per_worker: int
) -> npt.NDArray[np.int64]:
    """Distinct keys of each mini-batch (``per_worker`` consecutive rows) of whole global
    batches in CSR ``offsets``/``keys`` (rows: a multiple of ``per_worker``): what a worker's
    cache must hold under the sequential partition. One compiled pass."""
    rows = offsets.shape[0] - 1
    if rows % per_worker:
        raise ValueError(f"{rows} rows are not whole mini-batches of {per_worker}")
    out = np.empty(rows // per_worker, dtype=np.int64)
    _distinct_per_group(
        np.ascontiguousarray(offsets, dtype=np.int64),
        np.ascontiguousarray(keys, dtype=np.int64),
        per_worker,
        out,
    )
    return out


class MiniBatchSizes:
    """The most distinct keys in one worker's mini-batch of each global batch under the
    sequential partition (naive, on-demand and HET place samples in order), gathered chunk by
    chunk from a pass that reads the data anyway (``scan(..., on_chunk=sizes)``), so checking
    that every mini-batch fits a cache costs no pass of its own.

    Global batches are consecutive ``workers x batch_size_per_worker`` rows from the start
    of the chunks it is shown; a later pass repeats the same batches, so the first pass's
    sizes hold for every epoch. ``max_row_keys`` (the most keys in one row) bounds what any
    partition can put in a mini-batch: ``batch_size_per_worker x max_row_keys``."""

    def __init__(self, workers: int, batch_size_per_worker: int) -> None:
        self.workers = workers
        self.per_worker = batch_size_per_worker
        self.batch_rows = workers * batch_size_per_worker
        self.max_row_keys = 0
        self._per_batch: list[npt.NDArray[np.int64]] = []
        self._offsets = np.zeros(1, dtype=np.int64)  # rows carried to the next chunk
        self._keys = np.zeros(0, dtype=np.int64)

    def __call__(self, chunk: SparseDataset) -> None:
        """Fold in the next rows (any number)."""
        lengths = np.diff(chunk.offsets)
        self.max_row_keys = max(self.max_row_keys, int(lengths.max(initial=0)))
        carried = self._offsets.shape[0] - 1
        head = min(chunk.rows, (-carried) % self.batch_rows)  # rows that complete the carry
        offsets = np.concatenate([self._offsets, chunk.offsets[1 : head + 1] + self._offsets[-1]])
        keys = np.concatenate([self._keys, chunk.keys[: int(chunk.offsets[head])]])
        if offsets.shape[0] - 1 == self.batch_rows:
            self._add(offsets, keys)
            offsets, keys = offsets[:1] * 0, keys[:0]
        whole = (chunk.rows - head) // self.batch_rows * self.batch_rows
        if whole:
            lo, hi = chunk.offsets[head], chunk.offsets[head + whole]
            self._add(chunk.offsets[head : head + whole + 1] - lo, chunk.keys[lo:hi])
        rest = head + whole
        if rest < chunk.rows:
            lo = chunk.offsets[rest]
            tail = chunk.offsets[rest:] - lo + offsets[-1]
            offsets = np.concatenate([offsets, tail[1:]])
            keys = np.concatenate([keys, chunk.keys[lo:]])
        self._offsets, self._keys = offsets, keys

    def _add(self, offsets: npt.NDArray[np.int64], keys: npt.NDArray[np.int64]) -> None:
        sizes = mini_batch_sizes(offsets, keys, self.per_worker)
        self._per_batch.append(sizes.reshape(-1, self.workers).max(axis=1))

    @property
    def batches(self) -> int:
        """Whole global batches seen."""
        return sum(a.shape[0] for a in self._per_batch)

    def largest(self, batches: int | None = None) -> int:
        """Most distinct keys of one worker's mini-batch in the first ``batches`` global
        batches (None: all seen)."""
        per_batch = np.concatenate(self._per_batch) if self._per_batch else np.zeros(0, np.int64)
        if batches is not None and batches > per_batch.shape[0]:
            raise ValueError(f"asked for {batches} batches, {per_batch.shape[0]} were seen")
        return int(per_batch[:batches].max(initial=0))
