"""Read CTR data files into sparse keys (CSR), labels and dense features.

``heraldps simulate`` and the training workers both read data through this
module, so the keys it produces are the parameter-server keys: they must be
exact, deterministic, and reproducible by data feeders in other languages.

Key formula (stable; other feeders must reproduce it bit for bit)::

    key = int.from_bytes(
        hashlib.blake2b(f"{column_index}\\x1f{value}".encode("utf-8"), digest_size=8).digest(),
        "little",
        signed=True,
    )

- ``column_index`` is the position of the column in ``sparse_columns``
  (0-based, written in decimal), so equal strings in different fields get
  different keys. ``\\x1f`` is the ASCII unit separator.
- The hash is unkeyed BLAKE2b with an 8-byte digest length *parameter* (RFC
  7693 ``nn = 8``, no key, salt or personalisation). This is not the first 8
  bytes of BLAKE2b-512: the digest length is part of the parameter block.
- The 8 digest bytes are read as a little-endian two's-complement int64.
- ``value`` is the cell text exactly as in the file (no stripping, no case
  folding). An empty cell gives no key; every other cell gives exactly one.
  Keys depend only on (column_index, value): not on file order, the row, or
  Python's hash seed.
- Test vectors: ``feature_key(0, "68fd1e64") == 4185973209796718312``
  (digest ``e82e3cc17490173a``), ``feature_key(25, "9727dd16") ==
  3181448029515369485`` (digest ``0d4ca17620c6262c``).

Formats (``FORMATS``):

- ``criteo``: Kaggle Criteo TSV, no header, 40 tab-separated columns
  ``label, I1..I13, C1..C26``. Sparse columns C1..C26. Dense I1..I13 are
  stored as ``log1p(max(x, 0))`` (the usual CTR preprocessing; negative
  values such as I2 = -1 become 0.0).
- ``avazu``: Kaggle Avazu CSV, 24 columns; the header line is optional (it is
  detected by the first field being ``id``). Sparse columns are all but
  ``id`` and ``click`` (raw ``hour`` included); label ``click``; no dense.
- ``csv``: any CSV with a header. ``sparse_columns`` is required; without
  ``label_column`` every label is 0.0; dense columns are stored raw, with no
  log transform.

Conventions in every format: a missing (empty) dense cell is 0.0 (for criteo
``log1p(0) = 0`` too); labels must be present and finite; blank lines are
skipped; a UTF-8 byte-order mark is ignored; NUL characters are refused.
``sparse_columns`` / ``label_column`` / ``dense_columns`` override the
format's defaults by column name (criteo names: ``label``, ``I1``..,
``C1``..); keys are numbered by position in the ``sparse_columns`` given.
The returned arrays are read-only, because batches share memory with the
dataset. The whole file is held in memory as Python strings (about 60 bytes
per cell): this reader is meant for sample files of tens of MB, not for the
full Kaggle sets.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from heraldps import bundled
from heraldps.data.dataset import SparseDataset as SparseDataset

FORMATS = ("criteo", "avazu", "csv")

CRITEO_COLUMNS: tuple[str, ...] = (
    "label",
    *(f"I{i}" for i in range(1, 14)),
    *(f"C{i}" for i in range(1, 27)),
)
AVAZU_COLUMNS: tuple[str, ...] = (
    "id",
    "click",
    "hour",
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
)

ObjectArray = npt.NDArray[np.object_]
TextArray = npt.NDArray[np.str_]


def feature_key(column_index: int, value: str) -> int:
    """The int64 key of one (column, value) pair; see the module docstring for the formula."""
    return int(_feature_keys(column_index, [value])[0])


def _feature_keys(column_index: int, values: Sequence[str]) -> npt.NDArray[np.int64]:
    """``feature_key`` of many values of one column, decoding the digests in one NumPy call."""
    prefix = f"{column_index}\x1f".encode()
    digests = b"".join(
        hashlib.blake2b(prefix + value.encode(), digest_size=8).digest() for value in values
    )
    return np.frombuffer(digests, dtype="<i8").astype(np.int64)


@dataclass(frozen=True, eq=False)
class _Table:
    """Raw cells of a file plus the line number of each row, for error messages."""

    path: Path
    columns: tuple[str, ...]
    cells: ObjectArray  # [rows, len(columns)] of str
    lines: npt.NDArray[np.int64]  # [rows] 1-based line number where the row starts

    def where(self, row: int, column: int) -> str:
        """``file:line:column`` of a cell (column = 1-based field number)."""
        return f"{self.path}:{int(self.lines[row])}:{column + 1}"


Records = Iterator[tuple[int, list[str]]]


def _checked_lines(path: Path, lines: TextIO) -> Iterator[str]:
    """Refuse NUL characters: NumPy's fixed-width strings would silently drop trailing ones."""
    for number, line in enumerate(lines, start=1):
        if "\x00" in line:
            raise ValueError(
                f"{path}:{number}: contains a NUL character (a corrupt or binary file?); "
                "remove it or re-export the file as text"
            )
        yield line


def _tsv_records(path: Path, lines: TextIO) -> Records:
    """(line number, fields) of non-blank lines; plain split, since the TSV has no quoting."""
    for number, line in enumerate(_checked_lines(path, lines), start=1):
        text = line.rstrip("\r\n")
        if text:
            yield number, text.split("\t")


def _csv_records(path: Path, lines: TextIO) -> Records:
    """(first line number, fields) of non-blank CSV records (quoted fields may span lines)."""
    reader = csv.reader(_checked_lines(path, lines), strict=True)
    while True:
        first = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ValueError(
                f"{path}:{reader.line_num}: malformed CSV ({exc}); fix the quoting on this line"
            ) from exc
        if fields:
            yield first, fields


def _collect(
    path: Path, columns: tuple[str, ...], records: Records, max_rows: int | None, expected: str
) -> _Table:
    """Stack records into a cell matrix, checking every row has ``len(columns)`` fields."""
    rows: list[list[str]] = []
    lines: list[int] = []
    for number, fields in itertools.islice(records, max_rows):
        if len(fields) != len(columns):
            raise ValueError(
                f"{path}:{number}: expected {len(columns)} fields ({expected}), "
                f"found {len(fields)}; fix or remove this line"
            )
        rows.append(fields)
        lines.append(number)
    cells = np.empty((len(rows), len(columns)), dtype=object)
    if rows:
        cells[:] = rows
    return _Table(path, columns, cells, np.array(lines, dtype=np.int64))


def _read_criteo(path: Path, lines: TextIO, max_rows: int | None) -> _Table:
    expected = "tab-separated label, I1..I13, C1..C26"
    return _collect(path, CRITEO_COLUMNS, _tsv_records(path, lines), max_rows, expected)


def _read_avazu(path: Path, lines: TextIO, max_rows: int | None) -> _Table:
    """Avazu rows; a first record starting with ``id`` is the (optional) header."""
    records = _csv_records(path, lines)
    first = next(records, None)
    if first is not None and first[1][0] == "id":
        if tuple(first[1]) != AVAZU_COLUMNS:
            raise ValueError(
                f"{path}:{first[0]}: Avazu header is {','.join(first[1])!r}, expected "
                f"{','.join(AVAZU_COLUMNS)!r}; fix the header, or read the file as format 'csv'"
            )
    elif first is not None:
        records = itertools.chain([first], records)
    expected = "Avazu columns " + ",".join(AVAZU_COLUMNS)
    return _collect(path, AVAZU_COLUMNS, records, max_rows, expected)


def _read_csv(path: Path, lines: TextIO, max_rows: int | None) -> _Table:
    records = _csv_records(path, lines)
    header = next(records, None)
    if header is None:
        raise ValueError(f"{path}: empty file; format 'csv' needs a header line naming the columns")
    columns = tuple(header[1])
    return _collect(path, columns, records, max_rows, f"the {len(columns)} header columns")


def _read_table(path: Path, format: str, max_rows: int | None) -> _Table:
    readers = {"criteo": _read_criteo, "avazu": _read_avazu, "csv": _read_csv}
    try:
        with path.open(encoding="utf-8-sig", newline="") as lines:
            return readers[format](path, lines, max_rows)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 ({exc}); re-encode the file as UTF-8") from exc


def _column_index(table: _Table, name: str, role: str) -> int:
    """Position of ``name`` in the header, with an error that lists what exists."""
    matches = [i for i, c in enumerate(table.columns) if c == name]
    if len(matches) == 1:
        return matches[0]
    problem = "is not a column" if not matches else "appears more than once in the header"
    raise ValueError(
        f"{table.path}: {role} {name!r} {problem}; available columns: {', '.join(table.columns)}"
    )


def _resolve(table: _Table, names: Sequence[str], role: str) -> list[int]:
    if len(set(names)) != len(names):
        raise ValueError(f"{role}s {list(names)} name a column twice; list each column once")
    return [_column_index(table, name, role) for name in names]


def _names(names: Sequence[str] | None, role: str) -> tuple[str, ...] | None:
    """A tuple of column names; a bare string is refused since it would split into letters."""
    if isinstance(names, str):
        raise ValueError(f"{role} must be a list of column names, not the string {names!r}")
    return None if names is None else tuple(names)


def _text(table: _Table, column: int) -> TextArray:
    """One column as fixed-width text, which NumPy sorts far faster than Python objects."""
    return table.cells[:, column].astype(np.str_)


def _column_keys(values: TextArray, column_index: int) -> npt.NDArray[np.int64]:
    """Keys of one column's cells (0 where empty), hashing each distinct value once."""
    uniques, inverse = np.unique(values, return_inverse=True)
    hashed = _feature_keys(column_index, uniques.tolist())
    hashed[uniques == ""] = 0
    return hashed[inverse.reshape(-1)]


def _sparse(
    table: _Table, columns: list[int]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """CSR (offsets, keys, field of each key): row-major, in column order, empty cells skipped."""
    matrix = np.zeros((table.cells.shape[0], len(columns)), dtype=np.int64)
    present = np.zeros(matrix.shape, dtype=bool)
    for j, column in enumerate(columns):
        text = _text(table, column)
        matrix[:, j] = _column_keys(text, j)
        present[:, j] = text != ""
    offsets = np.zeros(matrix.shape[0] + 1, dtype=np.int64)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    fields = np.broadcast_to(np.arange(len(columns), dtype=np.int32), matrix.shape)
    return offsets, matrix[present], fields[present]


def _parse_float(text: str, allow_missing: bool) -> float:
    """``float(text)``, 0.0 for an allowed empty cell, NaN for anything unusable."""
    if text == "" and allow_missing:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def _floats(table: _Table, column: int, role: str, allow_missing: bool) -> npt.NDArray[np.float64]:
    """Parse one column as finite floats (missing = 0.0), parsing each distinct value once."""
    uniques, inverse = np.unique(_text(table, column), return_inverse=True)
    inverse = inverse.reshape(-1)
    parsed = np.array([_parse_float(t, allow_missing) for t in uniques.tolist()], dtype=np.float64)
    bad = np.isnan(parsed)
    if np.any(bad):
        row = int(np.flatnonzero(bad[inverse])[0])
        need = "a finite number" + (" or an empty cell" if allow_missing else "")
        raise ValueError(
            f"{table.where(row, column)}: {role} {table.columns[column]!r} is "
            f"{table.cells[row, column]!r}; write {need} there, or choose another {role}"
        )
    return parsed[inverse]


def _select(
    table: _Table,
    sparse_columns: Sequence[str],
    label_column: str | None,
    dense_columns: Sequence[str],
) -> tuple[list[int], int | None, list[int]]:
    sparse = _resolve(table, sparse_columns, "sparse column")
    dense = _resolve(table, dense_columns, "dense column")
    label = None if label_column is None else _column_index(table, label_column, "label column")
    if label is not None and (label in sparse or label in dense):
        raise ValueError(
            f"label column {label_column!r} is also a feature column; "
            "remove it from sparse_columns/dense_columns so the label does not leak"
        )
    return sparse, label, dense


def _dense(table: _Table, columns: list[int], log: bool) -> npt.NDArray[np.float32]:
    """Dense features [rows, len(columns)]; missing = 0.0, optionally ``log1p(max(x, 0))``."""
    dense = np.zeros((table.cells.shape[0], len(columns)), dtype=np.float64)
    for j, column in enumerate(columns):
        dense[:, j] = _floats(table, column, "dense column", allow_missing=True)
    if log:
        dense = np.log1p(np.maximum(dense, 0.0))
    return dense.astype(np.float32)


def _labels(table: _Table, column: int | None) -> npt.NDArray[np.float32]:
    if column is None:
        return np.zeros(table.cells.shape[0], dtype=np.float32)
    return _floats(table, column, "label column", allow_missing=False).astype(np.float32)


@dataclass(frozen=True)
class _Defaults:
    """A format's column choice when the caller names none."""

    sparse: tuple[str, ...] | None
    label: str | None
    dense: tuple[str, ...]
    log_dense: bool


_DEFAULTS = {
    "criteo": _Defaults(CRITEO_COLUMNS[14:], "label", CRITEO_COLUMNS[1:14], log_dense=True),
    "avazu": _Defaults(AVAZU_COLUMNS[2:], "click", (), log_dense=False),
    "csv": _Defaults(None, None, (), log_dense=False),
}


def default_columns(format: str) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(sparse, dense) column names a format reads when the caller names none (csv: no
    sparse default, no dense columns)."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")
    defaults = _DEFAULTS[format]
    return defaults.sparse, defaults.dense


def read_dataset(
    path: str | Path,
    format: str,
    *,
    sparse_columns: Sequence[str] | None = None,
    label_column: str | None = None,
    dense_columns: Sequence[str] | None = None,
    max_rows: int | None = None,
) -> SparseDataset:
    """Read a CTR file of ``format`` (one of ``FORMATS``) into a ``SparseDataset``.

    Column arguments left as None take the format's defaults (see the module
    docstring); ``max_rows`` stops reading after that many data rows. ``path`` may
    name a file shipped in the package (``bundled:criteo_head8k``, see ``heraldps.bundled``).
    """
    path = bundled.resolve(path)
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0 or None, got {max_rows}")
    if not path.is_file():
        raise ValueError(f"{path}: no such file; check the path to the {format} data")
    defaults = _DEFAULTS[format]
    table = _read_table(path, format, max_rows)
    sparse_names = _names(sparse_columns, "sparse_columns")
    sparse_names = defaults.sparse if sparse_names is None else sparse_names
    if sparse_names is None:
        raise ValueError(
            f"{path}: format 'csv' needs sparse_columns (the categorical columns); "
            f"available columns: {', '.join(table.columns)}"
        )
    dense_names = _names(dense_columns, "dense_columns")
    dense_names = defaults.dense if dense_names is None else dense_names
    label_name = defaults.label if label_column is None else label_column
    sparse, label, dense = _select(table, sparse_names, label_name, dense_names)
    offsets, keys, fields = _sparse(table, sparse)
    arrays = (offsets, keys, _labels(table, label), _dense(table, dense, defaults.log_dense))
    for array in (*arrays, fields):
        array.flags.writeable = False
    return SparseDataset(
        *arrays, sparse_columns=sparse_names, dense_columns=dense_names, fields=fields
    )
