"""The streaming reader gives exactly the old whole-file reader's rows on every shipped file.

``data_golden.json`` holds SHA-256 prefixes of the arrays (offsets, keys, labels, dense,
fields) that the old reader (``heraldps/datasets.py``, removed after commit 134b308)
produced for each file; the new reader must reproduce them byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from heraldps.data import DataSpec, read_all, scan, stream
from heraldps.data.dataset import SparseDataset

HERE = Path(__file__).resolve()
DATA = next(
    (
        p
        for p in (HERE.parents[3] / "shared" / "data", HERE.parents[4] / "shared" / "data")
        if p.is_dir()
    ),
    HERE.parents[3] / "shared" / "data",
)
C = [f"C{i}" for i in range(1, 27)]
INTS = [f"I{i}" for i in range(1, 14)]
FRAPPE = [
    "user",
    "item",
    "daytime",
    "weekday",
    "isweekend",
    "homework",
    "cost",
    "weather",
    "country",
    "city",
]

# (source, old reader's arguments, new spec's extra fields)
CASES = [
    ("bundled:criteo_head8k", "criteo", {}, {}),
    ("bundled:criteo_head8k/test.tsv", "criteo", {}, {}),
    *[(f"{DATA}/criteo_kaggle_head8k/{n}.tsv", "criteo", {}, {}) for n in ("train", "dev", "test")],
    *[(f"{DATA}/avazu_head9k/{n}.csv", "avazu", {}, {}) for n in ("train", "dev", "test")],
    *[
        (
            f"{DATA}/frappe_x1/{n}.csv",
            "csv",
            {"sparse_columns": FRAPPE, "label_column": "label"},
            {},
        )
        for n in ("train", "valid", "test")
    ],
    (
        f"{DATA}/criteo_deepctr_sample/criteo_sample.txt",
        "csv",
        {"sparse_columns": C, "label_column": "label", "dense_columns": INTS},
        {"dense_transforms": ("raw",)},  # the old csv dense was raw
    ),
]


GOLDEN = json.loads((HERE.parent / "data_golden.json").read_text())


def digests(ds: SparseDataset) -> dict[str, object]:
    """What ``data_golden.json`` records of a data set."""
    found: dict[str, object] = {
        name: hashlib.sha256(np.ascontiguousarray(getattr(ds, name)).tobytes()).hexdigest()[:16]
        for name in ("offsets", "keys", "labels", "dense", "fields")
    }
    found["rows"] = ds.rows
    return found


@pytest.mark.parametrize(
    ("source", "format", "columns", "extra"), CASES, ids=lambda c: str(c)[-30:]
)
def test_new_reader_equals_old_reader(source: str, format: str, columns: dict, extra: dict) -> None:
    if not source.startswith("bundled:") and not Path(source).exists():
        pytest.skip(f"shared data {source} is absent")
    spec = DataSpec(
        source,
        format,
        **{k: tuple(v) if isinstance(v, list) else v for k, v in columns.items()},
        **extra,
    )
    old = read_all(spec)
    assert digests(old) == GOLDEN[source.split("shared/data/")[-1]]
    # Streamed in small chunks and joined: the same rows.
    chunks = list(stream(spec, batch_rows=1000))
    assert all(c.rows == 1000 for c in chunks[:-1]) and 0 < chunks[-1].rows <= 1000
    assert np.array_equal(np.concatenate([c.keys for c in chunks]), old.keys)
    profile = scan(spec)
    assert profile.rows == old.rows and profile.positives == int(old.labels.sum())
    assert profile.total_distinct_keys == old.distinct_keys()
    assert profile.distinct_values == profile.distinct_keys  # no collision on shipped files
    for j in range(len(old.sparse_columns)):
        assert profile.distinct_keys[j] == np.unique(old.keys[old.fields == j]).size
