"""What to read and how: ``DataSpec``, plus the statistics dense transforms need.

A spec is plain data (JSON round-trip via ``to_dict``/``from_dict``), so a job records it
whole and every worker, the feeder and a later evaluation read the same rows the same way,
with the same dense statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heraldps.data.errors import DataError

FORMATS = ("criteo", "avazu", "csv", "parquet")
DENSE_TRANSFORMS = ("log1p", "standardize", "minmax", "raw")
# Transforms that need the statistics of a first pass (``scan``).
NEEDS_STATS = ("standardize", "minmax")

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


@dataclass(frozen=True)
class _Defaults:
    """A format's column choice when the spec names none (None: the user must name it)."""

    sparse: tuple[str, ...] | None
    label: str | None
    dense: tuple[str, ...]
    transform: str


DEFAULTS: Mapping[str, _Defaults] = {
    "criteo": _Defaults(CRITEO_COLUMNS[14:], "label", CRITEO_COLUMNS[1:14], "log1p"),
    "avazu": _Defaults(AVAZU_COLUMNS[2:], "click", (), "raw"),
    "csv": _Defaults(None, None, (), "standardize"),
    "parquet": _Defaults(None, None, (), "standardize"),
}


@dataclass(frozen=True)
class DenseStats:
    """Exact statistics of one dense column over a pass (missing cells excluded).

    ``std`` is the population standard deviation (ddof 0, as scikit-learn's StandardScaler).
    """

    column: str
    count: int
    missing: int
    mean: float
    std: float
    min: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> DenseStats:
        return DenseStats(
            column=str(data["column"]),
            count=int(data["count"]),
            missing=int(data["missing"]),
            mean=float(data["mean"]),
            std=float(data["std"]),
            min=float(data["min"]),
            max=float(data["max"]),
        )


def _names(value: Sequence[str] | None, role: str) -> tuple[str, ...] | None:
    """A tuple of names; a bare string is refused since it would split into letters."""
    if value is None:
        return None
    if isinstance(value, str):
        raise DataError(f"{role} must be a list of column names, not the string {value!r}")
    names = tuple(str(v) for v in value)
    if len(set(names)) != len(names):
        raise DataError(f"{role} {list(names)} name a column twice; list each column once")
    return names


@dataclass(frozen=True)
class DataSpec:
    """Which rows and columns of which files, and how dense columns are transformed.

    ``source``: a file, comma-separated files, a directory, a glob or ``bundled:NAME``
    (``heraldps.data.sources``). Column fields left None take the format's defaults
    (``DEFAULTS``); csv and parquet have no default sparse or label column.
    ``no_label``: inference-only data, every label 0. ``start_row``/``stop_row``: the
    rows ``[start, stop)`` of the whole source (held-out splits).
    """

    source: str
    format: str = "criteo"
    sparse_columns: tuple[str, ...] | None = None
    label_column: str | None = None
    dense_columns: tuple[str, ...] | None = None
    dense_transforms: tuple[str, ...] | None = None
    dense_stats: tuple[DenseStats, ...] | None = None
    no_label: bool = False
    start_row: int = 0
    stop_row: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "source", str(self.source))
        if self.format not in FORMATS:
            raise DataError(f"unknown format {self.format!r}; use one of {', '.join(FORMATS)}")
        set_(self, "sparse_columns", _names(self.sparse_columns, "sparse_columns"))
        set_(self, "dense_columns", _names(self.dense_columns, "dense_columns"))
        if self.dense_transforms is not None:
            if isinstance(self.dense_transforms, str):
                raise DataError("dense_transforms must be a list, one transform per dense column")
            set_(self, "dense_transforms", tuple(self.dense_transforms))
        if self.dense_stats is not None:
            set_(self, "dense_stats", tuple(self.dense_stats))
        if self.no_label and self.label_column is not None:
            raise DataError(
                f"no_label is set but label_column is {self.label_column!r}; "
                "drop one (no_label means the data has no labels)"
            )
        if self.start_row < 0 or (self.stop_row is not None and self.stop_row < self.start_row):
            raise DataError(
                f"row range [{self.start_row}, {self.stop_row}) is invalid; "
                "use 0 <= start_row <= stop_row"
            )
        dense = self.dense()
        transforms = self.transforms()
        if len(transforms) != len(dense):
            raise DataError(
                f"{len(transforms)} dense_transforms for {len(dense)} dense columns; "
                "give one transform per dense column (or one for all)"
            )
        for name, transform in zip(dense, transforms, strict=True):
            if transform not in DENSE_TRANSFORMS:
                raise DataError(
                    f"dense column {name!r}: unknown transform {transform!r}; "
                    f"use one of {', '.join(DENSE_TRANSFORMS)}"
                )
        if self.dense_stats is not None:
            named = tuple(s.column for s in self.dense_stats)
            if named != dense:
                raise DataError(
                    f"dense_stats are for columns {list(named)}, the spec's dense columns are "
                    f"{list(dense)}; run scan() on this spec and use its dense_stats"
                )

    # --- resolved views -------------------------------------------------------------------

    def sparse(self) -> tuple[str, ...]:
        """The sparse (categorical) columns, in key-field order."""
        if self.sparse_columns is not None:
            return self.sparse_columns
        default = DEFAULTS[self.format].sparse
        if default is None:
            raise DataError(
                f"format {self.format!r} needs sparse_columns (the categorical columns); "
                "name them, e.g. --sparse-columns user,item"
            )
        return default

    def label(self) -> str | None:
        """The label column; None only for ``no_label`` data."""
        if self.no_label:
            return None
        if self.label_column is not None:
            return self.label_column
        default = DEFAULTS[self.format].label
        if default is None:
            raise DataError(
                f"format {self.format!r} needs label_column (the 0/1 target column); "
                "name it, e.g. --label-column click, or add --no-label for inference-only data"
            )
        return default

    def dense(self) -> tuple[str, ...]:
        """The dense (numeric) columns."""
        if self.dense_columns is not None:
            return self.dense_columns
        return DEFAULTS[self.format].dense

    def transforms(self) -> tuple[str, ...]:
        """One transform per dense column (a single given transform applies to all)."""
        dense = self.dense()
        if self.dense_transforms is None:
            return (DEFAULTS[self.format].transform,) * len(dense)
        if len(self.dense_transforms) == 1:
            return self.dense_transforms * len(dense)
        return self.dense_transforms

    def needs_stats(self) -> bool:
        """Whether a transform needs ``dense_stats`` that the spec does not have yet."""
        return self.dense_stats is None and any(t in NEEDS_STATS for t in self.transforms())

    @property
    def num_fields(self) -> int:
        return len(self.sparse())

    @property
    def num_dense(self) -> int:
        return len(self.dense())

    def with_stats(self, stats: Sequence[DenseStats]) -> DataSpec:
        """This spec with the dense statistics of a first pass (``scan(spec).dense_stats``)."""
        return dataclasses.replace(self, dense_stats=tuple(stats))

    def with_rows(self, start_row: int, stop_row: int | None) -> DataSpec:
        """This spec reading rows ``[start_row, stop_row)`` of the source."""
        return dataclasses.replace(self, start_row=start_row, stop_row=stop_row)

    # --- JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("sparse_columns", "dense_columns", "dense_transforms"):
            if data[name] is not None:
                data[name] = list(data[name])
        if self.dense_stats is not None:
            data["dense_stats"] = [s.to_dict() for s in self.dense_stats]
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> DataSpec:
        known = {f.name for f in dataclasses.fields(DataSpec)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"unknown data spec fields {unknown}; known: {sorted(known)}")
        values = dict(data)
        for name in ("sparse_columns", "dense_columns", "dense_transforms"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        if values.get("dense_stats") is not None:
            values["dense_stats"] = tuple(DenseStats.from_dict(s) for s in values["dense_stats"])
        return DataSpec(**values)
