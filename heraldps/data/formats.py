"""How one file is opened as a stream of pyarrow RecordBatches, and where its rows are.

Text layouts (parsed by ``pyarrow.csv.open_csv``: streaming, multi-threaded):

- ``criteo``: tab-separated, no header, no quoting, 40 columns ``label, I1..I13, C1..C26``.
- ``avazu``: comma-separated, 24 columns; the header line is optional (a first field
  ``id`` marks it, and it must then be Avazu's header).
- ``csv``: comma-separated with a header line naming the columns; quoted fields may
  span lines.

Every format may also come as Parquet (by suffix), read by row group with
``ParquetFile.iter_batches``; its columns are found by name. Blank text lines are
skipped and a UTF-8 byte-order mark is ignored. Sparse cells are read as strings exactly
as in the file; dense and label cells as float64 ("" is missing).

The fast path never tracks line numbers. When pyarrow or a vectorized check rejects
something, ``diagnose`` re-reads the file in plain Python (the error path only) to find
the first bad physical line and say what is wrong there.
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from heraldps.data.errors import DataError
from heraldps.data.sources import FileKind, kind_of
from heraldps.data.spec import AVAZU_COLUMNS, CRITEO_COLUMNS

_PEEK = 1 << 16
# The reader's prefetch thread already parses the next block while the current one is
# converted; pyarrow's own threads on top cost more than they give on 2-4 cores (measured:
# 250-330k rows/s single-threaded parse vs 200-265k with use_threads, docs/data.md "Speed").
CSV_THREADS = False
PARQUET_THREADS = True
_BOM = b"\xef\xbb\xbf"

_EXPECTED = {
    "criteo": "40 tab-separated fields (label, I1..I13, C1..C26)",
    "avazu": "24 comma-separated Avazu fields (id, click, hour, C1, ..., C21)",
}


@dataclass(frozen=True)
class Layout:
    """One opened file: its columns and how its text is laid out."""

    path: Path
    format: str
    kind: FileKind
    columns: tuple[str, ...]
    header: bool  # text: a header line precedes the rows

    @property
    def delimiter(self) -> str:
        return "\t" if self.format == "criteo" else ","

    def expected(self) -> str:
        return _EXPECTED.get(self.format, f"the {len(self.columns)} header columns")

    def position(self, column: str) -> int:
        """1-based field number of ``column`` (for file:row:column messages)."""
        return self.columns.index(column) + 1


def _open_stream(path: Path, kind: FileKind) -> tuple[pa.NativeFile, pa.NativeFile]:
    """(raw file, readable stream): the raw file's position is the bytes consumed."""
    raw = pa.OSFile(str(path), "rb")
    if kind.compression is None:
        return raw, raw
    return raw, pa.CompressedInputStream(raw, kind.compression)


def _head(path: Path, kind: FileKind) -> bytes:
    """The first bytes of the (decompressed) text, BOM removed."""
    raw, stream = _open_stream(path, kind)
    try:
        head: bytes = stream.read(_PEEK)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot read ({exc}); check the file and its suffix") from exc
    finally:
        stream.close()
        raw.close()
    return head[len(_BOM) :] if head.startswith(_BOM) else head


def _check_bytes(path: Path, head: bytes, final: bool) -> None:
    """NUL bytes and invalid UTF-8 in ``head``, with the line they are on."""
    nul = head.find(b"\x00")
    if nul >= 0:
        raise DataError(_nul_message(path, head.count(b"\n", 0, nul) + 1))
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=final)
    except UnicodeDecodeError as exc:
        line = head.count(b"\n", 0, exc.start) + 1
        column = exc.start - (head.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(_utf8_message(path, line, column, head[exc.start])) from exc


def _nul_message(path: Path, line: int) -> str:
    return (
        f"{path}:{line}: contains a NUL byte (a corrupt or binary file?); "
        "remove it or re-export the file as text"
    )


def _utf8_message(path: Path, line: int, column: int, byte: int) -> str:
    return (
        f"{path}:{line}:{column}: not valid UTF-8 (byte 0x{byte:02x}); "
        "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    )


def _first_line(head: bytes) -> tuple[int, str] | None:
    """(line number, text) of the first non-blank line in ``head``."""
    for number, line in enumerate(head.split(b"\n"), start=1):
        text = line.rstrip(b"\r")
        if text:
            return number, text.decode("utf-8", errors="replace")
    return None


def _csv_fields(text: str) -> list[str]:
    return next(csv.reader([text]), [])


def _looks_like(text: str, format: str) -> str:
    """A hint naming the format a first line looks like (or "" when none fits)."""
    tabs = text.split("\t")
    commas = _csv_fields(text)
    if format != "criteo" and len(tabs) == 40:
        return "this looks like a Criteo tab-separated file: try --format criteo"
    if format != "criteo" and len(tabs) > 1 and len(commas) == 1:
        return "this looks like a tab-separated file; format csv reads comma-separated files"
    if format != "avazu" and len(tabs) == 1 and (commas[0] == "id" or len(commas) == 24):
        return "this looks like an Avazu file: try --format avazu"
    if format == "criteo" and len(tabs) == 1 and len(commas) > 1:
        numeric = all(_is_number(c) for c in commas if c)
        header = "" if numeric else " with a header"
        return f"this looks like a comma-separated file{header}: try --format csv"
    return ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _field_count_message(layout: Layout, line: int, found: int, text: str | None) -> str:
    hint = _looks_like(text, layout.format) if text is not None else ""
    return f"{layout.path}:{line}: expected {layout.expected()}, found {found}: " + (
        hint if hint else "fix or remove this line"
    )


def open_layout(path: Path, format: str) -> Layout:
    """Open ``path`` just far enough to know its columns; refuse a file that does not fit
    ``format`` (with the format it looks like, when the first line shows it)."""
    kind = kind_of(path)
    if kind.parquet:
        try:
            schema = pq.read_schema(str(path))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(
                f"{path}: not a readable Parquet file ({exc}); check the file or its suffix"
            ) from exc
        return Layout(path, format, kind, tuple(schema.names), header=False)
    if format == "parquet":
        raise DataError(
            f"{path}: format 'parquet' reads .parquet files; for a text file use "
            "--format csv (or criteo/avazu for those layouts)"
        )
    head = _head(path, kind)
    _check_bytes(path, head, final=len(head) < _PEEK)
    first = _first_line(head)
    if first is None:
        raise DataError(
            f"{path}: empty file (no rows); remove it from the source or point at the data"
        )
    line, text = first
    if format == "criteo":
        layout = Layout(path, format, kind, CRITEO_COLUMNS, header=False)
        found = len(text.split("\t"))
        if found != len(CRITEO_COLUMNS):
            raise DataError(_field_count_message(layout, line, found, text))
        return layout
    fields = _csv_fields(text)
    if format == "avazu":
        layout = Layout(path, format, kind, AVAZU_COLUMNS, header=fields[:1] == ["id"])
        if layout.header and tuple(fields) != AVAZU_COLUMNS:
            raise DataError(
                f"{path}:{line}: Avazu header is {','.join(fields)!r}, expected "
                f"{','.join(AVAZU_COLUMNS)!r}; fix the header, or read the file as format 'csv'"
            )
        if len(fields) != len(AVAZU_COLUMNS):
            raise DataError(_field_count_message(layout, line, len(fields), text))
        return layout
    layout = Layout(path, format, kind, tuple(fields), header=True)
    hint = _looks_like(text, format)
    if len(fields) == 1 and hint:
        raise DataError(f"{path}:{line}: the header has 1 column (no commas): {hint}")
    return layout


class FileStream:
    """RecordBatches of one file's ``columns`` (types: "string" or "float"); ``position``
    is the bytes read so far. pyarrow errors become DataError via ``diagnose``."""

    def __init__(
        self,
        layout: Layout,
        types: dict[str, str],
        block_size: int,
        batch_rows: int,
        label: str | None,
        limit: int | None = None,
        threads: bool = CSV_THREADS,
    ) -> None:
        self.layout = layout
        self.threads = threads  # text: pyarrow's own parsing threads
        self.types = types
        self.limit = limit  # records of this file the caller needs (None: all)
        self.block_size = block_size
        self.batch_rows = batch_rows
        self.label = label
        self.position = 0
        self.size = layout.path.stat().st_size

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self.layout.kind.parquet:
            yield from self._parquet()
        else:
            yield from self._text()

    def _parquet(self) -> Iterator[pa.RecordBatch]:
        try:
            # String sparse columns as dictionary arrays straight from the dictionary pages.
            schema = pq.read_schema(str(self.layout.path))
            strings = [
                name
                for name, kind in self.types.items()
                if kind == "string" and _is_text(schema.field(name).type)
            ]
            file = pq.ParquetFile(str(self.layout.path), read_dictionary=strings)
            groups = file.metadata.num_row_groups
            for done, group in enumerate(range(groups), start=1):
                yield from file.iter_batches(
                    batch_size=self.batch_rows,
                    row_groups=[group],
                    columns=list(self.types),
                    use_threads=PARQUET_THREADS,
                )
                done += 1
                self.position = self.size * done // max(groups, 1)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{self.layout.path}: cannot read Parquet ({exc})") from exc

    def _text(self) -> Iterator[pa.RecordBatch]:
        layout = self.layout
        arrow_types = {
            name: pa.string() if kind == "string" else pa.float64()
            for name, kind in self.types.items()
        }
        read = pacsv.ReadOptions(
            use_threads=self.threads,
            block_size=self.block_size,
            column_names=None if layout.header else list(layout.columns),
        )
        parse = pacsv.ParseOptions(
            delimiter=layout.delimiter,
            quote_char=False if layout.format == "criteo" else '"',
            newlines_in_values=layout.format == "csv",
            ignore_empty_lines=True,
        )
        convert = pacsv.ConvertOptions(
            include_columns=list(self.types),
            column_types=arrow_types,
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
            null_values=[""],
        )
        # csv: the last batch is held back until the end of the file is checked for a
        # quote never closed (pyarrow reads the rest of the file into that one cell).
        hold = layout.format == "csv"
        emitted = 0  # records yielded so far
        pending: pa.RecordBatch | None = None
        raw, stream = _open_stream(layout.path, layout.kind)
        try:
            try:
                reader = pacsv.open_csv(
                    stream, read_options=read, parse_options=parse, convert_options=convert
                )
                while True:
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                    self.position = raw.tell()
                    if hold:
                        batch, pending = pending, batch
                        if batch is None:
                            continue
                    yield batch
                    emitted += batch.num_rows
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                yield from self._before_problem(emitted, pending, str(exc))
                return
        finally:
            stream.close()
            raw.close()
        if pending is not None:
            if _odd_quotes(layout):
                found = first_problem(layout, self.types, self.label)
                if found is not None and (self.limit is None or found[0] < self.limit):
                    raise found[1]
            yield pending

    def _before_problem(
        self, emitted: int, pending: pa.RecordBatch | None, message: str
    ) -> Iterator[pa.RecordBatch]:
        """pyarrow rejected a block: the records before the first bad one that the caller
        still needs (``limit``): the held-back batch, then the rest re-read in Python;
        else the bad record's error."""
        layout = self.layout
        found = first_problem(layout, self.types, self.label)
        if found is None:
            raise DataError(f"{layout.path}: {message}")
        index, error = found
        if self.limit is None or index < self.limit:
            raise error
        if pending is not None:
            yield pending
            emitted += pending.num_rows
        if emitted < self.limit:
            yield records_batch(layout, self.types, emitted, self.limit)


def _odd_quotes(layout: Layout) -> bool:
    """Whether the text has an odd number of '"' (a quote never closed; escaped quotes come
    in pairs). One more pass over the bytes, at C speed."""
    raw, stream = _open_stream(layout.path, layout.kind)
    count = 0
    try:
        while True:
            block = stream.read(1 << 22)
            if not block:
                return count % 2 == 1
            count += block.count(b'"')
    finally:
        stream.close()
        raw.close()


def _is_text(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


# --- the error path: plain-Python re-reading -----------------------------------------------


def _byte_lines(layout: Layout) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes without the newline) of every physical line."""
    raw, stream = _open_stream(layout.path, layout.kind)
    try:
        rest = b""
        number = 0
        while True:
            block = stream.read(1 << 20)
            if not block:
                break
            if number == 0 and not rest and block.startswith(_BOM):
                block = block[len(_BOM) :]
            lines = (rest + block).split(b"\n")
            rest = lines.pop()
            for line in lines:
                number += 1
                yield number, line
        if rest:
            yield number + 1, rest
    finally:
        stream.close()
        raw.close()


def _text_lines(layout: Layout) -> Iterator[tuple[int, str]]:
    """Decoded physical lines (with "\\n"), refusing NUL bytes and invalid UTF-8."""
    for number, line in _byte_lines(layout):
        if b"\x00" in line:
            raise DataError(_nul_message(layout.path, number))
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                _utf8_message(layout.path, number, exc.start + 1, line[exc.start])
            ) from exc
        yield number, text + "\n"


def records(layout: Layout) -> Iterator[tuple[int, list[str]]]:
    """(first physical line, fields) of every data record, as pyarrow counts them
    (blank lines skipped, the header line not included)."""
    lines = _text_lines(layout)
    if layout.format == "criteo":
        source: Iterator[tuple[int, list[str]]] = (
            (n, t.rstrip("\n").rstrip("\r").split("\t"))
            for n, t in lines
            if t.rstrip("\n").rstrip("\r")
        )
    else:
        source = _csv_records(layout, lines)
    if layout.header:
        next(source, None)
    yield from source


def _csv_records(
    layout: Layout, lines: Iterator[tuple[int, str]]
) -> Iterator[tuple[int, list[str]]]:
    numbers: list[int] = []

    def texts() -> Iterator[str]:
        for number, text in lines:
            numbers.append(number)
            yield text

    reader = csv.reader(texts(), strict=True)
    while True:
        count = len(numbers)
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "unexpected end of data" in str(exc) and count < len(numbers):
                raise DataError(
                    f"{layout.path}:{numbers[count]}: a quoted field opened on this line is "
                    "never closed (unbalanced '\"' quote, the rest of the file would be one "
                    'cell); close the quote, or write a literal quote as ""'
                ) from exc
            raise DataError(
                f"{layout.path}:{numbers[-1] if numbers else 1}: malformed CSV ({exc}); "
                "fix the quoting on this line"
            ) from exc
        if fields:  # csv gives [] for a blank line, which pyarrow skips too
            yield numbers[count] if count < len(numbers) else numbers[-1], fields


def physical_line(layout: Layout, record: int) -> int:
    """The 1-based line where data record ``record`` (0-based, in this file) starts; for
    Parquet, the 1-based row number. Re-reads the file: error path only."""
    if layout.kind.parquet:
        return record + 1
    for index, (number, _) in enumerate(records(layout)):
        if index == record:
            return number
    return -1


def cell_problem(role: str, column: str, text: str) -> str | None:
    """What is wrong with one dense or label cell's text (None: nothing)."""
    if role == "label":
        if text == "":
            return f"label {column!r} is empty; every row needs a label 0 or 1"
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if value not in (0.0, 1.0):
            return f"label {column!r} is {text!r}; labels must be 0 or 1 (0.0 and 1.0 also work)"
        return None
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        return (
            f"dense column {column!r} is {text!r}; write a finite number or an empty cell "
            "there, or choose another dense column"
        )
    return None


def first_problem(
    layout: Layout, types: dict[str, str], label: str | None
) -> tuple[int, DataError] | None:
    """(record index, error) of the first bad record of a text file, found by a slow
    re-read (error path only): wrong field count, NUL byte, invalid UTF-8, unusable dense
    or label cell, a quote never closed."""
    checks = [
        (layout.columns.index(name), "label" if name == label else "dense", name)
        for name, kind in types.items()
        if kind == "float"
    ]
    expected = len(layout.columns)
    seen = 0  # records read whole so far: an exception belongs to record ``seen``
    try:
        for index, (number, fields) in enumerate(records(layout)):
            seen = index
            if len(fields) != expected:
                text = layout.delimiter.join(fields) if index == 0 and not layout.header else None
                return index, DataError(_field_count_message(layout, number, len(fields), text))
            for position, role, name in checks:
                problem = cell_problem(role, name, fields[position])
                if problem:
                    return index, DataError(f"{layout.path}:{number}:{position + 1}: {problem}")
            seen = index + 1
    except DataError as exc:
        return seen, exc
    return None


def find_problem(layout: Layout, types: dict[str, str], label: str | None) -> DataError | None:
    """The first bad record's error (``first_problem``), or None."""
    found = first_problem(layout, types, label)
    return None if found is None else found[1]


def records_batch(layout: Layout, types: dict[str, str], first: int, stop: int) -> pa.RecordBatch:
    """Data records ``[first, stop)`` re-read in plain Python (all before the first bad
    record) as the RecordBatch pyarrow would have made: strings as written, numbers by
    Arrow's own string -> float64 cast, "" missing. Error path only."""
    cells: dict[str, list[str]] = {name: [] for name in types}
    positions = {name: layout.columns.index(name) for name in types}
    for index, (_, fields) in enumerate(records(layout)):
        if index >= stop:
            break
        if index >= first:
            for name, position in positions.items():
                cells[name].append(fields[position])
    arrays = []
    for name, kind in types.items():
        if kind == "string":
            arrays.append(pa.array(cells[name], type=pa.string()))
        else:
            texts = pa.array([t if t else None for t in cells[name]], type=pa.string())
            arrays.append(texts.cast(pa.float64()))
    return pa.RecordBatch.from_arrays(arrays, names=list(types))


def diagnose(layout: Layout, types: dict[str, str], label: str | None, fallback: str) -> DataError:
    """``find_problem``, or ``fallback`` (pyarrow's message) with the file when it finds none."""
    found = None if layout.kind.parquet else find_problem(layout, types, label)
    return found or DataError(f"{layout.path}: {fallback}")


def used_columns(
    layout: Layout, sparse: Sequence[str], dense: Sequence[str], label: str | None
) -> dict[str, str]:
    """{column: "string" | "float"} of what a read needs, in file order."""
    wanted = {name: "string" for name in sparse}
    wanted.update({name: "float" for name in dense})
    if label is not None:
        wanted[label] = "float"
    return {name: wanted[name] for name in layout.columns if name in wanted}
