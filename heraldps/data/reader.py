"""The streaming reader: bounded SparseDataset chunks from any source, and a first pass.

``stream`` yields chunks of ``batch_rows`` rows (the last one shorter) in source order;
memory is bounded by the chunk in flight, pyarrow's blocks and a bounded key cache per
column, never by the file's size. A background thread has pyarrow parse the next 1-4 MB
blocks while the blocks of one chunk are converted together, with no copy between:

- sparse columns, filled by two threads (compiled code, GIL released): a plain string
  column (CSV/TSV) goes through its column's ``keys.KeyCache`` (a value seen before costs
  a probe, a new one a BLAKE2b); a dictionary column (Parquet dictionary pages) has its
  dictionary hashed once per row group and the cells' keys gathered by index;
- dense columns and labels, on the calling thread meanwhile (one vectorized transform);
- the row-major CSR, one compiled pass.

See docs/data.md "Speed" for the measurements behind each choice.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from heraldps.data import formats, transforms
from heraldps.data.dataset import SparseDataset, concat
from heraldps.data.distinct import DistinctCounter
from heraldps.data.errors import DataError
from heraldps.data.keys import KeyCache, column_keys, first_nul, is_text, take_into
from heraldps.data.sources import files_of, kind_of
from heraldps.data.spec import DataSpec, DenseStats
from heraldps.jit import njit

Progress = Callable[[int, int, int], None]
Keys = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

# pyarrow parses text in blocks of 1 MB (about 4k Criteo rows; measured against 2 and 4 MB:
# the same or less CPU, and the blocks in flight hold 130 MB less, docs/data.md "Speed").
_BLOCK = 1 << 20


@dataclass(frozen=True)
class DataProfile:
    """What one full pass saw (``scan``): exact counts and dense statistics."""

    rows: int
    positives: int
    files: tuple[str, ...]
    fields: tuple[str, ...]
    distinct_values: tuple[int, ...]  # per field: distinct non-empty values
    distinct_keys: tuple[int, ...]  # per field: distinct keys (== values: no collision)
    total_distinct_keys: int  # over all fields: the embedding rows the data touches
    dense_stats: tuple[DenseStats, ...]

    def collisions(self) -> dict[str, int]:
        """Per field, distinct values minus distinct keys (0 everywhere: no collision)."""
        return {
            f: v - k
            for f, v, k in zip(self.fields, self.distinct_values, self.distinct_keys, strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "positives": self.positives,
            "files": list(self.files),
            "fields": list(self.fields),
            "distinct_values": list(self.distinct_values),
            "distinct_keys": list(self.distinct_keys),
            "total_distinct_keys": self.total_distinct_keys,
            "dense_stats": [s.to_dict() for s in self.dense_stats],
        }


@dataclass(frozen=True)
class _Plan:
    """The resolved columns of a spec against one file."""

    layout: formats.Layout
    sparse: tuple[str, ...]
    dense: tuple[str, ...]
    label: str | None
    types: dict[str, str]


def _plan(spec: DataSpec, layout: formats.Layout) -> _Plan:
    """Resolve the spec's columns in this file; errors list the columns that exist."""
    available = ", ".join(layout.columns)
    try:
        sparse = spec.sparse()
        label = spec.label()
    except DataError as exc:
        raise DataError(f"{layout.path}: {exc.message}; available columns: {available}") from exc
    dense = spec.dense()
    for role, names in (("sparse column", sparse), ("dense column", dense)):
        for name in names:
            count = layout.columns.count(name)
            if count != 1:
                problem = "is not a column" if count == 0 else "appears more than once"
                raise DataError(
                    f"{layout.path}: {role} {name!r} {problem}; available columns: {available}"
                )
    if label is not None:
        if layout.columns.count(label) != 1:
            raise DataError(
                f"{layout.path}: label column {label!r} is not a column; available columns: "
                f"{available} (or add --no-label for inference-only data)"
            )
        if label in sparse or label in dense:
            raise DataError(
                f"label column {label!r} is also a feature column; remove it from "
                "sparse_columns/dense_columns so the label does not leak"
            )
    overlap = sorted(set(sparse) & set(dense))
    if overlap:
        raise DataError(
            f"columns {overlap} are both sparse and dense; list each column in one of them"
        )
    return _Plan(layout, sparse, dense, label, formats.used_columns(layout, sparse, dense, label))


class _Observer:
    """What ``scan`` folds in per chunk: distinct (field, key, value) and dense stats."""

    def __init__(self, fields: Sequence[str], dense: Sequence[str]) -> None:
        self.distinct = DistinctCounter(len(fields))
        self.stats = [transforms.StatsAccumulator(name) for name in dense]
        # False: rows past the profiled range (``scan``'s ``profile_rows``) are converted
        # and checked the same way (raw dense values) but not counted.
        self.active = True


def _float_column(array: pa.Array) -> npt.NDArray[np.float64]:
    """float64 values with NaN for nulls (parquet ints/bools are cast)."""
    if not pa.types.is_floating(array.type) or array.type != pa.float64():
        array = pc.cast(array, pa.float64())
    values: npt.NDArray[np.float64] = array.to_numpy(zero_copy_only=False)  # nulls: NaN
    return values


def _bad(plan: _Plan, record: int, column: str, what: str) -> DataError:
    """A problem found by a vectorized check: locate it by re-reading (error path)."""
    layout = plan.layout
    if not layout.kind.parquet:
        found = formats.find_problem(layout, plan.types, plan.label)
        if found is not None:
            return found
    line = formats.physical_line(layout, record)
    return DataError(f"{layout.path}:{line}:{layout.position(column)}: {what}")


class _DictionaryKeys:
    """Per sparse column: a value -> key cache for plain string cells, and the last
    dictionary hashed and its keys. Parquet gives every batch
    of a row group the row group's dictionary (growing where pages fall back to plain
    encoding), so a dictionary that starts with the previous one has only its tail hashed."""

    def __init__(self, fields: int, reuse: bool) -> None:
        self.reuse = reuse
        self.caches = [KeyCache(j) for j in range(fields)]
        self.last: list[tuple[pa.Array, Keys, Mask] | None] = [None] * fields

    def keys(self, j: int, dictionary: pa.Array) -> tuple[Keys, Mask, int]:
        """(keys, present) of every dictionary value, and the first value not seen before."""
        last = self.last[j]
        if last is not None:
            known, known_keys, known_present = last
            m = len(known)
            if len(dictionary) >= m and dictionary.slice(0, m).equals(known):
                if len(dictionary) == m:
                    return known_keys, known_present, m
                tail_keys, tail_present = column_keys(j, dictionary.slice(m), distinct=True)
                keys = np.concatenate([known_keys, tail_keys])
                present = np.concatenate([known_present, tail_present])
                self.last[j] = (dictionary, keys, present)
                return keys, present, m
        keys, present = column_keys(j, dictionary, distinct=True)
        if self.reuse:
            self.last[j] = (dictionary, keys, present)
        return keys, present, 0


class _NewCells(NamedTuple):
    """Cells of a text column whose keys the column's cache computed (new to it), for
    ``scan``'s distinct count; ``first_row``: the column's first row in the chunk."""

    column: pa.Array
    cells: npt.NDArray[np.int64]
    first_row: int


class _NewValues(NamedTuple):
    """Dictionary values not seen in the column's previous dictionary, with their keys."""

    dictionary: pa.Array
    keys: Keys
    present: Mask


_PARALLEL_ROWS = 4096  # smaller chunks convert on the calling thread alone
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The converter threads (two: the machines we target have 2-4 cores, and the parsing
    thread needs one), started once per process."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="heraldps-data")
        return _POOL


def _forget_pool() -> None:
    """In a forked child the parent's pool threads do not exist: start a new pool there
    (else the first submit would wait forever)."""
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


_WARMED: set[str] = set()


def _warm_kernels(parquet: bool, observing: bool) -> None:
    """Have a converter thread load the compiled kernels this read will call, while the
    prefetch thread parses the first blocks. A kernel's first call in a process loads it
    from numba's cache (about 0.2 s for the first, which starts numba's compiler, 10-20 ms
    for each further one); done here, that time overlaps the parse instead of adding to it.
    Once per process and kind of read; a failure here is left to the real call to report."""
    kinds = ["text", *(["parquet"] if parquet else []), *(["scan"] if observing else [])]
    todo = [k for k in kinds if k not in _WARMED]
    if not todo:
        return
    _WARMED.update(todo)
    _pool().submit(_load_kernels, tuple(todo))


def _load_kernels(kinds: tuple[str, ...]) -> None:
    # Arguments of the types the real calls pass (nulls included), so the same compiled
    # versions are loaded.
    with contextlib.suppress(Exception):  # a warm-up only: the real call reports errors
        cells = pa.array(["a", None])
        keys = np.zeros(2, dtype=np.int64)
        present = np.zeros(2, dtype=np.bool_)
        if "text" in kinds:
            cache = KeyCache(0)
            cache.fill(cells, keys, present, keys.copy() if "scan" in kinds else None)
            cache._make_room()  # the grow path's rehash
            _csr(keys.reshape(1, 2), present.reshape(1, 2))
        if "parquet" in kinds:
            column_keys(0, cells.dictionary_encode())
        if "scan" in kinds:
            DistinctCounter(1).add(0, cells, np.zeros(1, np.int64), keys[:1])


def _convert(
    batches: Sequence[pa.RecordBatch],
    plan: _Plan,
    spec: DataSpec,
    first_record: int,
    observer: _Observer | None,
    known: _DictionaryKeys | None = None,
) -> SparseDataset:
    """Consecutive RecordBatches of one file as one SparseDataset, checking labels, dense
    cells and NUL bytes. Per sparse column and batch: hash the dictionary's values once and
    gather the cells' keys into the chunk's key matrix (two compiled calls)."""
    rows = sum(b.num_rows for b in batches)
    fields = len(plan.sparse)
    watching = observer is not None and observer.active
    if known is None:
        known = _DictionaryKeys(fields, reuse=False)
    matrix = np.empty((fields, rows), dtype=np.int64)
    present = np.empty((fields, rows), dtype=bool)

    def fill(j: int) -> list[_NewCells | _NewValues]:
        """Column j's keys into matrix[j] (compiled, GIL released); for the observer, the
        values it has not been shown yet."""
        name = plan.sparse[j]
        seen: list[_NewCells | _NewValues] = []
        lo = 0
        for batch in batches:
            column = batch.column(name)
            n = len(column)
            if is_text(column.type):
                # Plain strings (CSV): through the column's value -> key cache, straight into
                # the matrix; the parser did not have to dictionary-encode them. The
                # observer gets the cells the cache did not know (each new value is one).
                cache = known.caches[j]
                missed = np.empty(n, dtype=np.int64) if watching else None
                nul = cache.fill(column, matrix[j, lo : lo + n], present[j, lo : lo + n], missed)
                if nul >= 0:
                    raise _bad(
                        plan, first_record + lo + nul, name, f"sparse column {name!r} has a NUL"
                    )
                if missed is not None:
                    seen.append(_NewCells(column, missed[: cache.missed()], lo))
                lo += n
                continue
            encoded = (
                column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
            )
            dictionary = encoded.dictionary
            unique_keys, unique_present, new = known.keys(j, dictionary)
            if new < len(dictionary):
                nul = first_nul(dictionary.slice(new))
                if nul >= 0:
                    row = _first_row(encoded, new + nul)
                    record = first_record + lo + row
                    raise _bad(plan, record, name, f"sparse column {name!r} has a NUL")
                if watching:
                    seen.append(
                        _NewValues(dictionary.slice(new), unique_keys[new:], unique_present[new:])
                    )
            take_into(
                unique_keys,
                unique_present,
                encoded.indices,
                matrix[j, lo : lo + n],
                present[j, lo : lo + n],
            )
            lo += n
        return seen

    # Columns are independent: two threads fill them (numba releases the GIL) while this
    # thread does the dense columns and pyarrow's threads parse the next blocks. Errors are
    # raised in the plain loop's order: sparse columns in order, then dense, then labels.
    futures = [_pool().submit(fill, j) for j in range(fields)] if rows >= _PARALLEL_ROWS else []
    try:
        dense = _dense(batches, plan, spec, first_record, observer)
        dense_error = None
    except DataError as exc:
        dense, dense_error = None, exc
    found = [f.result() for f in futures] if futures else [fill(j) for j in range(fields)]
    if dense_error is not None:
        raise dense_error
    assert dense is not None
    if observer is not None and watching:
        for j, parts in enumerate(found):
            for part in parts:
                if isinstance(part, _NewCells):
                    cells = part.cells
                    keys_of = matrix[j, part.first_row + cells]
                    observer.distinct.add(j, part.column, cells, keys_of)
                else:
                    cells = np.flatnonzero(part.present)
                    observer.distinct.add(j, part.dictionary, cells, part.keys[cells])
    offsets, keys, field_of = _csr(matrix, present)
    labels = _labels(batches, plan, first_record)
    arrays = (offsets, keys, labels, dense, field_of)
    for array in arrays:
        array.flags.writeable = False
    return SparseDataset(offsets, keys, labels, dense, plan.sparse, plan.dense, fields=field_of)


def _dense(
    batches: Sequence[pa.RecordBatch],
    plan: _Plan,
    spec: DataSpec,
    first_record: int,
    observer: _Observer | None,
) -> npt.NDArray[np.float32]:
    """The dense columns of consecutive batches, checked (finite) and transformed."""
    rows = sum(b.num_rows for b in batches)
    values = np.empty((len(plan.dense), rows), dtype=np.float64)
    for j, name in enumerate(plan.dense):
        lo = 0
        for batch in batches:
            n = batch.num_rows
            values[j, lo : lo + n] = _float_column(batch.column(name))
            lo += n
    bad = np.isinf(values)
    if bad.any():
        j, row = (int(i[0]) for i in np.nonzero(bad))
        name = plan.dense[j]
        raise _bad(plan, first_record + row, name, f"dense column {name!r} is not finite")
    if observer is not None:
        if observer.active:
            for j in range(len(plan.dense)):
                observer.stats[j].add(values[j])
        transform_names: tuple[str, ...] = ("raw",) * len(plan.dense)
        stats = None
    else:
        transform_names, stats = spec.transforms(), spec.dense_stats
    return transforms.apply_columns(values, transform_names, stats, plan.dense)


_TILE = 2048  # rows per CSR tile: a tile's output (about 400 KB) stays in L2


@njit(nogil=True)
def _csr_fill(
    matrix: npt.NDArray[np.int64],
    present: npt.NDArray[np.bool_],
    offsets: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64],
    fields: npt.NDArray[np.int32],
) -> None:  # pragma: no cover - compiled
    """Row-major CSR of the present cells of a [fields, rows] key matrix. Rows go in
    tiles of ``_TILE``: within a tile the matrix is read field by field (contiguous) and the
    scattered writes stay in cache."""
    n_fields, rows = matrix.shape
    cursor = np.empty(_TILE, dtype=np.int64)
    k = 0
    for t0 in range(0, rows, _TILE):
        t1 = min(t0 + _TILE, rows)
        for r in range(t0, t1):
            cursor[r - t0] = 0
        for j in range(n_fields):
            for r in range(t0, t1):
                cursor[r - t0] += present[j, r]
        for r in range(t0, t1):
            offsets[r] = k
            k += cursor[r - t0]
            cursor[r - t0] = offsets[r]
        for j in range(n_fields):
            for r in range(t0, t1):
                if present[j, r]:
                    c = cursor[r - t0]
                    keys[c] = matrix[j, r]
                    fields[c] = j
                    cursor[r - t0] = c + 1
    offsets[rows] = k


def _csr(
    matrix: npt.NDArray[np.int64], present: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """(offsets, keys, field of each key): row-major, in column order, absent cells skipped."""
    count = int(np.count_nonzero(present))
    offsets = np.empty(matrix.shape[1] + 1, dtype=np.int64)
    keys = np.empty(count, dtype=np.int64)
    fields = np.empty(count, dtype=np.int32)
    _csr_fill(matrix, present, offsets, keys, fields)
    return offsets, keys, fields


def _first_row(encoded: pa.Array, value: int) -> int:
    """The first cell of a dictionary array whose index is ``value`` (error path)."""
    index = encoded.indices.fill_null(-1).to_numpy()
    return int(np.flatnonzero(index == value)[0])


def _labels(
    batches: Sequence[pa.RecordBatch], plan: _Plan, first_record: int
) -> npt.NDArray[np.float32]:
    rows = sum(b.num_rows for b in batches)
    if plan.label is None:
        return np.zeros(rows, dtype=np.float32)
    label = plan.label
    values = np.concatenate([_float_column(b.column(label)) for b in batches])
    bad = (values != 0.0) & (values != 1.0)  # NaN (missing) is bad too
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = values[row]
        what = (
            f"label {label!r} is empty; every row needs a label 0 or 1"
            if np.isnan(value)
            else f"label {label!r} is {value!r}; labels must be 0 or 1"
        )
        raise _bad(plan, first_record + row, label, what)
    return values.astype(np.float32)


def _chunks(
    spec: DataSpec,
    batch_rows: int,
    observer: _Observer | None = None,
    progress: Progress | None = None,
    split: int | None = None,
) -> Iterator[SparseDataset]:
    """Converted pieces of rows [start_row, stop_row), in order: ``batch_rows`` rows each
    (several pyarrow blocks converted as one), shorter only at the end of a file or before
    row ``split`` (a row of the whole source, like ``start_row``): the ``observer`` watches
    the rows before it and only checks those from it on."""
    if batch_rows < 1:
        raise DataError(f"batch_rows must be >= 1, got {batch_rows}")
    if observer is None:
        transforms.require_stats(spec)
    files = files_of(spec.source)
    _warm_kernels(any(kind_of(f).parquet for f in files), observer is not None)
    total_bytes = sum(f.stat().st_size for f in files)
    done_bytes = 0
    row = 0  # global row of the next record
    start, stop = spec.start_row, spec.stop_row
    for path in files:
        if stop is not None and row >= stop:
            break
        layout = formats.open_layout(path, spec.format)
        plan = _plan(spec, layout)
        stream = formats.FileStream(
            layout,
            plan.types,
            _BLOCK,
            batch_rows,
            plan.label,
            limit=None if stop is None else stop - row,
        )
        known = _DictionaryKeys(len(plan.sparse), reuse=layout.kind.parquet)
        group: list[pa.RecordBatch] = []  # consecutive rows of this file, < batch_rows
        have = 0
        first = 0  # the file's record number of the group's first row
        record = 0
        for batch in _prefetch(iter(stream), batch_rows) if _PREFETCH else stream:
            n = batch.num_rows
            lo = max(start - row, 0)
            hi = n if stop is None else min(stop - row, n)
            while lo < hi:  # fill groups of exactly batch_rows, converted as one chunk
                if not group:
                    first = record + lo
                    if observer is not None and split is not None:
                        observer.active = row + lo < split
                take = min(batch_rows - have, hi - lo)
                to_split = 0 if split is None else split - (row + lo)  # > 0: not reached
                if to_split > 0:
                    take = min(take, to_split)
                group.append(batch if (lo, take) == (0, n) else batch.slice(lo, take))
                have += take
                lo += take
                if have == batch_rows or take == to_split:
                    yield _convert(group, plan, spec, first, observer, known)
                    group, have = [], 0
            record += n
            row += n
            if progress is not None:
                progress(row, done_bytes + stream.position, total_bytes)
            if stop is not None and row >= stop:
                break
        if group:
            yield _convert(group, plan, spec, first, observer, known)
            group = []
        if record == 0:
            _empty(layout, len(files))
        done_bytes += stream.size
    if progress is not None:
        progress(row, done_bytes, total_bytes)


_DONE = object()
# Parse the next blocks in a background thread while this one converts (see _prefetch).
_PREFETCH = True


def _prefetch(batches: Iterator[pa.RecordBatch], rows_ahead: int) -> Iterator[pa.RecordBatch]:
    """``batches`` pulled by a background thread, at most about ``rows_ahead`` rows ahead
    (always at least one batch): pyarrow parses the next chunk's blocks (GIL released) while
    this thread and the converter threads turn the current chunk into keys, so parsing and
    conversion overlap on two cores. Memory stays bounded by those rows; errors re-raise
    here; closing stops the thread."""
    ahead: collections.deque[Any] = collections.deque()
    queued = 0  # rows in ``ahead``
    stopped = False
    ready = threading.Condition()

    def pull() -> None:
        nonlocal queued
        try:
            for batch in batches:
                with ready:
                    while queued >= rows_ahead and ahead and not stopped:
                        ready.wait()
                    if stopped:
                        return
                    ahead.append(batch)
                    queued += batch.num_rows
                    ready.notify_all()
            item: Any = _DONE
        except BaseException as exc:  # handed to the consumer, which re-raises it
            item = exc
        with ready:
            ahead.append(item)
            ready.notify_all()

    worker = threading.Thread(target=pull, name="heraldps-data-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            with ready:
                while not ahead:
                    ready.wait()
                item = ahead.popleft()
                if isinstance(item, pa.RecordBatch):
                    queued -= item.num_rows
                    ready.notify_all()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        with ready:
            stopped = True
            ready.notify_all()
        worker.join()


def _empty(layout: formats.Layout, files: int) -> None:
    """A file without rows: an error alone; tolerated as one part of many (Spark writes
    empty parts)."""
    if files > 1:
        return
    if layout.kind.parquet:
        raise DataError(f"{layout.path}: the Parquet file has no rows; point at the data")
    raise DataError(
        f"{layout.path}: has a header line but no data rows; add rows or point at the data"
        if layout.header
        else f"{layout.path}: has no data rows; add rows or point at the data"
    )


def rebatch(pieces: Iterator[SparseDataset], rows: int) -> Iterator[SparseDataset]:
    """Exactly ``rows`` rows per chunk across piece and file boundaries; the last is shorter.
    Chunks inside a piece are views of it; only a chunk that spans two pieces is copied."""
    carry: SparseDataset | None = None  # the start of the next chunk, < rows rows
    for piece in pieces:
        start = 0
        if carry is not None:
            need = rows - carry.rows
            if piece.rows < need:
                carry = concat([carry, piece])
                continue
            yield concat([carry, piece.row_slice(0, need)])
            carry, start = None, need
        if start == 0 and piece.rows == rows:
            yield piece
            continue
        while piece.rows - start >= rows:
            yield piece.row_slice(start, start + rows)
            start += rows
        if start < piece.rows:
            carry = piece.row_slice(start, piece.rows)
    if carry is not None:
        yield carry


# Rows converted at once: smaller chunks (the feeder's and simulate's global batches) are
# cut from these, so the per-chunk work and the converter threads are used as for 64k rows.
_CONVERT_ROWS = 65_536


def blocks(spec: DataSpec, rows: int) -> Iterator[SparseDataset]:
    """The rows of ``spec`` converted ``rows`` at a time, in source order: each block is
    exactly ``rows`` rows, shorter only at the end of a file. Unlike ``stream``, a small
    ``rows`` converts small blocks (the shuffle's memory bound), not 64k-row ones."""
    return _chunks(spec, rows)


def stream(spec: DataSpec, batch_rows: int = 65_536) -> Iterator[SparseDataset]:
    """The rows of ``spec`` as chunks of exactly ``batch_rows`` rows (the last shorter), in
    source order. Errors raise DataError (file, line, column) when the stream reaches them."""
    if batch_rows < 1:
        raise DataError(f"batch_rows must be >= 1, got {batch_rows}")
    return rebatch(_chunks(spec, max(batch_rows, _CONVERT_ROWS)), batch_rows)


def batches(
    spec: DataSpec, batch_size: int, epochs: int = 1, limit: int | None = None
) -> Iterator[SparseDataset]:
    """Global batches of exactly ``batch_size`` rows over ``epochs`` passes, at most ``limit``
    in all; each pass drops its partial tail (as ``SparseDataset.batches``)."""
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    if epochs < 1:
        raise DataError(f"epochs must be >= 1, got {epochs}")
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0 or None, got {limit}")
    return _batches(spec, batch_size, epochs, limit)


def _batches(
    spec: DataSpec, batch_size: int, epochs: int, limit: int | None
) -> Iterator[SparseDataset]:
    produced = 0
    for _ in range(epochs):
        in_pass = 0
        seen = 0
        for chunk in stream(spec, batch_size):
            seen += chunk.rows
            if chunk.rows < batch_size:
                break
            if limit is not None and produced >= limit:
                return
            yield chunk
            produced += 1
            in_pass += 1
        if in_pass == 0:
            raise DataError(
                f"{spec.source}: the data has {seen} rows, fewer than one global batch of "
                f"{batch_size}; use more data or a smaller batch"
            )
        if limit is not None and produced >= limit:
            return


def read_all(spec: DataSpec) -> SparseDataset:
    """All rows of ``spec`` as one dataset: for small files and tests only."""
    parts = list(_chunks(spec, 65_536))
    if not parts:
        return _no_rows(spec)
    return concat(parts)


def _no_rows(spec: DataSpec) -> SparseDataset:
    sparse, dense = spec.sparse(), spec.dense()
    empty = np.zeros(0, dtype=np.int64)
    for a in (empty,):
        a.flags.writeable = False
    return SparseDataset(
        np.zeros(1, dtype=np.int64),
        empty,
        np.zeros(0, dtype=np.float32),
        np.zeros((0, len(dense)), dtype=np.float32),
        sparse,
        dense,
        fields=np.zeros(0, dtype=np.int32),
    )


def check(spec: DataSpec) -> list[Path]:
    """Preflight, cheap: every file opens, its header and columns fit the spec and its first
    chunk parses (labels, dense cells, field counts). Returns the files in reading order;
    raises DataError (one line) on the first problem."""
    files = files_of(spec.source)
    rows = 0
    for path in files:
        layout = formats.open_layout(path, spec.format)
        plan = _plan(spec, layout)
        stream = formats.FileStream(layout, plan.types, _BLOCK, 8192, plan.label)
        batch = next(iter(stream), None)
        if batch is None or batch.num_rows == 0:
            _empty(layout, len(files))
            continue
        rows += batch.num_rows
        _convert([batch], plan, spec, 0, _Observer(plan.sparse, plan.dense))
    if rows == 0:
        raise DataError(f"{spec.source}: no file has data rows; point at the data")
    return files


def scan(
    spec: DataSpec,
    progress: Progress | None = None,
    *,
    profile_rows: int | None = None,
    on_chunk: Callable[[SparseDataset], None] | None = None,
) -> DataProfile:
    """One full streamed pass: rows, positives, exact distinct values and keys per field,
    and the dense statistics ``standardize``/``minmax`` need (raw values, before any
    transform). ``progress(rows_done, bytes_done, bytes_total)`` is called per chunk.

    ``profile_rows``: the profile covers only the first that many rows of the spec's range
    (a training split), while every row is still read and checked, so one pass both
    profiles the training rows and finds the errors of the rows held out after them.
    ``on_chunk(chunk)`` is called with each profiled chunk, in order (raw dense values),
    for a caller that needs more from the same pass (``global_batches.MiniBatchSizes``)."""
    sparse, dense = spec.sparse(), spec.dense()
    observer = _Observer(sparse, dense)
    rows = 0
    positives = 0.0
    split = None if profile_rows is None else spec.start_row + profile_rows
    for piece in _chunks(spec, 65_536, observer, progress, split):
        if not observer.active:
            continue
        rows += piece.rows
        positives += float(piece.labels.sum())
        if on_chunk is not None:
            on_chunk(piece)
    if rows == 0:
        raise DataError(f"{spec.source}: no data rows in the selected range; point at the data")
    values, keys, total = observer.distinct.counts()
    return DataProfile(
        rows=rows,
        positives=int(positives),
        files=tuple(str(f) for f in files_of(spec.source)),
        fields=sparse,
        distinct_values=values,
        distinct_keys=keys,
        total_distinct_keys=total,
        dense_stats=tuple(s.stats() for s in observer.stats),
    )


def count_rows(spec: DataSpec, progress: Progress | None = None) -> int:
    """Rows in the spec's range, found by parsing alone (no keys, no checks of labels or
    dense cells; a Parquet file's row count comes from its footer): the cheap first look a
    held-out cut or a feeder without a recorded row count needs. Problems the parser sees
    (a ragged row, a NUL byte, bad UTF-8, an empty file) raise DataError as in ``stream``.
    ``progress(rows_done, bytes_done, bytes_total)`` as in ``scan``."""
    files = files_of(spec.source)
    total_bytes = sum(f.stat().st_size for f in files)
    done_bytes = 0
    total = 0
    stop = spec.stop_row
    for path in files:
        if stop is not None and total >= stop:
            break
        layout = formats.open_layout(path, spec.format)
        plan = _plan(spec, layout)
        if layout.kind.parquet:
            rows = _parquet_rows(layout)
        else:
            # One column converted (the cheapest a parse can be); pyarrow's own threads,
            # since nothing else runs beside this pass.
            first = next(iter(plan.types))
            stream = formats.FileStream(
                layout, {first: "string"}, _BLOCK, 65_536, None, threads=True
            )
            rows = 0
            for batch in stream:
                rows += batch.num_rows
                if progress is not None:
                    progress(total + rows, done_bytes + stream.position, total_bytes)
        if rows == 0:
            _empty(layout, len(files))
        total += rows
        done_bytes += layout.path.stat().st_size
    if progress is not None:
        progress(total, done_bytes, total_bytes)
    end = total if stop is None else min(total, stop)
    return max(0, end - spec.start_row)


def _parquet_rows(layout: formats.Layout) -> int:
    try:
        rows: int = pq.ParquetFile(str(layout.path)).metadata.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{layout.path}: cannot read Parquet ({exc})") from exc
    return rows
