"""The streaming data path: sources, formats, keys, dense transforms, one reader.

Every process reads data through ``heraldps.data.reader`` (see docs/data.md).
"""

from __future__ import annotations

from heraldps.data.dataset import SparseDataset, concat
from heraldps.data.errors import DataError
from heraldps.data.reader import (
    DataProfile,
    batches,
    check,
    count_rows,
    read_all,
    scan,
    stream,
)
from heraldps.data.sources import files_of
from heraldps.data.spec import DENSE_TRANSFORMS, FORMATS, DataSpec, DenseStats

__all__ = [
    "DENSE_TRANSFORMS",
    "FORMATS",
    "DataError",
    "DataProfile",
    "DataSpec",
    "DenseStats",
    "SparseDataset",
    "batches",
    "check",
    "concat",
    "count_rows",
    "files_of",
    "read_all",
    "scan",
    "stream",
]
