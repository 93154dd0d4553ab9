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

from heraldps.data.dataset import SparseDataset
from heraldps.data.reader import batches as stream_batches
from heraldps.data.spec import DataSpec
from heraldps.errors import InvalidArgument


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
