"""Which files a data argument names, in a stated, deterministic order.

A source is one file, comma-separated files, a directory, a glob or ``bundled:NAME``.
Order: the items of a comma-separated list as given; inside a directory or a glob, the
paths in *natural* order (digit runs compare as numbers, so ``day_2`` < ``day_10`` and
Criteo 1TB's ``day_0`` .. ``day_23`` read in day order). A directory is searched
recursively, skipping what Spark and Hadoop write next to the data: names starting with
``_`` or ``.`` (``_SUCCESS``, ``_temporary/``, ``.part-0.crc``) and ``*.crc``.
"""

from __future__ import annotations

import glob as globlib
import re
from dataclasses import dataclass
from pathlib import Path

from heraldps import bundled
from heraldps.data.errors import DataError
from heraldps.errors import InvalidArgument

# Text suffixes (criteo, avazu, csv layouts); a file without a suffix (day_0, part-00000) is
# text too. Parquet suffixes work for every format (columns by name).
TEXT_SUFFIXES = (".tsv", ".txt", ".csv")
PARQUET_SUFFIXES = (".parquet", ".pq")
COMPRESSION_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}


@dataclass(frozen=True)
class FileKind:
    """How one file is stored: ``parquet`` or ``text``, and the text's compression."""

    parquet: bool
    compression: str | None


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key comparing digit runs as numbers: ``day_2`` < ``day_10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part
    )


def known_suffixes() -> str:
    """The suffixes we read, for error messages."""
    return (
        f"text ({', '.join(TEXT_SUFFIXES)} or none, optionally "
        f"{', '.join(COMPRESSION_SUFFIXES)}) for formats criteo, avazu, csv; "
        f"{', '.join(PARQUET_SUFFIXES)} for any format, parquet included"
    )


def kind_of(path: Path) -> FileKind:
    """The storage kind of ``path`` by suffix; an unknown suffix is a DataError."""
    name = path.name
    compression = None
    suffix = Path(name).suffix.lower()
    if suffix in COMPRESSION_SUFFIXES:
        compression = COMPRESSION_SUFFIXES[suffix]
        name = name[: -len(suffix)]
        suffix = Path(name).suffix.lower()
    if suffix in PARQUET_SUFFIXES and compression is None:
        return FileKind(parquet=True, compression=None)
    if suffix in TEXT_SUFFIXES or suffix == "" or suffix[1:].isdigit():
        return FileKind(parquet=False, compression=compression)
    raise DataError(
        f"{path}: unknown file suffix {Path(path.name).suffix!r}; heraldps reads {known_suffixes()}"
    )


def _hidden(part: str) -> bool:
    return part.startswith(("_", ".")) or part.endswith(".crc")


def _directory(path: Path) -> list[Path]:
    files = [
        p
        for p in path.rglob("*")
        if p.is_file() and not any(_hidden(part) for part in p.relative_to(path).parts)
    ]
    if not files:
        raise DataError(f"{path}: directory has no data files; point at the folder of the data")
    return sorted(files, key=lambda p: natural_key(p.relative_to(path).as_posix()))


def _one(item: str) -> list[Path]:
    """Files of one item: a bundled name, a file, a directory or a glob."""
    try:
        path = bundled.resolve(item)
    except InvalidArgument as exc:
        raise DataError(exc.message) from exc
    if path.is_file():
        return [path]
    if path.is_dir():
        return _directory(path)
    if any(c in item for c in "*?["):
        matches = sorted(globlib.glob(item, recursive=True), key=natural_key)
        files: list[Path] = []
        for match in matches:
            files.extend(_directory(Path(match)) if Path(match).is_dir() else [Path(match)])
        files = [f for f in files if not _hidden(f.name)]
        if not files:
            raise DataError(f"{item}: the glob matches no files; check the pattern")
        return files
    raise DataError(f"{item}: no such file or directory; check the path to the data")


def files_of(source: str | Path) -> list[Path]:
    """The data files of ``source`` in reading order (see the module docstring).

    Every file's suffix is checked here, so a wrong file fails before anything is read.
    """
    text = str(source)
    if not text:
        raise DataError("the data source is empty; give a file, directory or glob")
    items = [text] if Path(text).exists() else [s for s in text.split(",") if s]
    files = [f for item in items for f in _one(item)]
    for f in files:
        kind_of(f)
    return files
