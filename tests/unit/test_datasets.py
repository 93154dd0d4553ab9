"""The CTR data reader against independent plain-Python parsing of the real sample files."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.datasets import (
    AVAZU_COLUMNS,
    FORMATS,
    SparseDataset,
    feature_key,
    read_dataset,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
CRITEO = DATA / "criteo_kaggle_head8k"
AVAZU = DATA / "avazu_head9k"
CRITEO_SAMPLE = DATA / "criteo_deepctr_sample" / "criteo_sample.txt"
C_COLUMNS = [f"C{i}" for i in range(1, 27)]
I_COLUMNS = [f"I{i}" for i in range(1, 14)]


def need(path: Path) -> Path:
    """Skip (not fail) where the shared sample data is not checked out next to the repo."""
    if not path.exists():
        pytest.skip(f"sample data {path} is absent; put the shared data folder at {DATA}")
    return path


def row_keys(ds: SparseDataset, row: int) -> list[int]:
    keys: list[int] = ds.keys[ds.offsets[row] : ds.offsets[row + 1]].tolist()
    return keys


def tsv_rows(path: Path) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in path.read_text().splitlines(True)]


def reference_keys(cells: list[str]) -> list[int]:
    """The spec's rule, cell by cell: one key per non-empty value, in column order."""
    return [feature_key(j, v) for j, v in enumerate(cells) if v != ""]


# --- key formula ---------------------------------------------------------------------------


def test_feature_key_is_the_documented_blake2b() -> None:
    digest = hashlib.blake2b(b"7\x1fabc", digest_size=8).digest()
    assert feature_key(7, "abc") == int.from_bytes(digest, "little", signed=True)
    # The vectors in the module docstring, for feeders in other languages.
    assert feature_key(0, "68fd1e64") == 4185973209796718312
    assert feature_key(25, "9727dd16") == 3181448029515369485
    assert feature_key(0, "x") != feature_key(1, "x")
    assert feature_key(0, "é") == feature_key(0, "\u00e9")


def test_feature_key_ignores_the_hash_seed() -> None:
    code = "from heraldps.datasets import feature_key; print(feature_key(3, 'a8cd5504'))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {str(feature_key(3, "a8cd5504"))}


# --- criteo --------------------------------------------------------------------------------


def test_criteo_train_matches_plain_python() -> None:
    path = need(CRITEO / "train.tsv")
    ds = read_dataset(path, "criteo")
    rows = tsv_rows(path)
    assert ds.rows == len(rows) == 7200
    assert ds.sparse_columns == tuple(C_COLUMNS)
    assert ds.dense_columns == tuple(I_COLUMNS)
    for r in range(0, ds.rows, 7):
        assert row_keys(ds, r) == reference_keys(rows[r][14:])
    assert ds.labels.tolist() == [float(row[0]) for row in rows]
    dense = [[math.log1p(max(float(x), 0.0)) if x else 0.0 for x in row[1:14]] for row in rows]
    np.testing.assert_allclose(ds.dense, np.array(dense, dtype=np.float32), rtol=1e-6)
    distinct = sum(len({row[14 + j] for row in rows} - {""}) for j in range(26))
    assert ds.distinct_keys() == distinct == 34431


def test_criteo_empty_values_give_no_key() -> None:
    path = need(CRITEO / "train.tsv")
    ds = read_dataset(path, "criteo")
    empties = np.array([row[14:].count("") for row in tsv_rows(path)])
    assert empties.sum() > 0
    assert np.diff(ds.offsets).tolist() == (26 - empties).tolist()
    assert ds.offsets[-1] == ds.keys.size


def provenance_table(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(unique values per field, empty count per field) as published in PROVENANCE.md."""
    text = path.read_text()
    unique = {name: int(n) for name, n in re.findall(r"^\| (C\d+) \| (\d+) \|$", text, re.M)}
    missing = re.search(r"Missing \(empty\) counts: (\{.*\})", text)
    assert missing is not None and len(unique) == 26
    return unique, json.loads(missing.group(1))


def test_criteo_head8k_matches_provenance_counts() -> None:
    """Per-field distinct keys over train+dev+test = the published counts minus the empty value."""
    unique, missing = provenance_table(need(CRITEO / "PROVENANCE.md"))
    keys, fields = [], []
    empties = np.zeros(26, dtype=np.int64)
    for name in ("train", "dev", "test"):
        path = CRITEO / f"{name}.tsv"
        present = np.array([[v != "" for v in row[14:]] for row in tsv_rows(path)])
        keys.append(read_dataset(path, "criteo").keys)
        fields.append(np.nonzero(present)[1])  # row-major, in column order, like the keys
        empties += (~present).sum(axis=0)
    all_keys, all_fields = np.concatenate(keys), np.concatenate(fields)
    for j, name in enumerate(C_COLUMNS):
        expected = unique[name] - (1 if missing[name] else 0)
        assert np.unique(all_keys[all_fields == j]).size == expected, name
        assert empties[j] == missing[name], name
    assert np.unique(all_keys).size == sum(unique.values()) - sum(m > 0 for m in missing.values())


def test_keys_are_stable_across_reads_and_row_order(tmp_path: Path) -> None:
    path = need(CRITEO / "train.tsv")
    first, second = read_dataset(path, "criteo"), read_dataset(path, "criteo")
    assert np.array_equal(first.keys, second.keys)
    assert np.array_equal(first.offsets, second.offsets)
    reversed_path = tmp_path / "reversed.tsv"
    reversed_path.write_text("".join(reversed(path.read_text().splitlines(True))))
    flipped = read_dataset(reversed_path, "criteo")
    n = first.rows
    for r in range(0, n, 97):
        assert row_keys(flipped, n - 1 - r) == row_keys(first, r)
    assert np.array_equal(np.unique(flipped.keys), np.unique(first.keys))


def test_criteo_max_rows_reads_a_prefix() -> None:
    path = need(CRITEO / "train.tsv")
    full, head = read_dataset(path, "criteo"), read_dataset(path, "criteo", max_rows=100)
    assert head.rows == 100
    assert np.array_equal(head.keys, full.row_slice(0, 100).keys)
    assert read_dataset(path, "criteo", max_rows=0).rows == 0


def criteo_line(label: str = "0", ints: str = "", cats: str = "") -> str:
    return "\t".join([label, *([ints] * 13), *([cats] * 26)]) + "\n"


def test_malformed_criteo_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    good = criteo_line("1", "3", "abc")
    path.write_text(good + good + "\t".join(["0"] * 39) + "\n" + good)
    with pytest.raises(ValueError, match=r"bad\.tsv:3: expected 40 fields .* found 39"):
        read_dataset(path, "criteo")
    assert read_dataset(path, "criteo", max_rows=2).rows == 2  # stops before the bad line


def test_criteo_bad_integer_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text(criteo_line() + criteo_line(ints="7") + criteo_line(ints="x1"))
    with pytest.raises(ValueError, match=r"bad\.tsv:3:2: dense column 'I1' is 'x1'"):
        read_dataset(path, "criteo")


def test_criteo_dense_is_log1p_of_clipped_value(tmp_path: Path) -> None:
    path = tmp_path / "small.tsv"
    cells = ["1", "-1", "0", "", "3", *["9"] * 9, "a", "", *["b"] * 24]
    path.write_text("\t".join(cells) + "\r\n\n")  # CRLF and a blank line are tolerated
    ds = read_dataset(path, "criteo")
    assert ds.rows == 1
    np.testing.assert_allclose(ds.dense[0, :4], [0.0, 0.0, 0.0, math.log1p(3)], rtol=1e-6)
    assert row_keys(ds, 0) == [feature_key(0, "a"), *(feature_key(j, "b") for j in range(2, 26))]
    assert ds.labels.tolist() == [1.0]


# --- avazu ---------------------------------------------------------------------------------


def test_avazu_with_and_without_header(tmp_path: Path) -> None:
    path = need(AVAZU / "train.csv")
    with_header = read_dataset(path, "avazu")
    headerless = tmp_path / "train_noheader.csv"
    headerless.write_text("".join(path.read_text().splitlines(True)[1:]))
    without = read_dataset(headerless, "avazu")
    assert with_header.rows == without.rows == 8087
    assert np.array_equal(with_header.keys, without.keys)
    assert np.array_equal(with_header.labels, without.labels)
    assert with_header.sparse_columns == AVAZU_COLUMNS[2:]
    assert with_header.dense.shape == (8087, 0)
    rows = list(csv.reader(io.StringIO(path.read_text())))[1:]
    assert with_header.labels.tolist() == [float(row[1]) for row in rows]
    assert row_keys(with_header, 5) == reference_keys(rows[5][2:])
    distinct = sum(len({row[j] for row in rows}) for j in range(2, 24))
    assert with_header.distinct_keys() == distinct == 9565


def test_avazu_headerless_dev_file() -> None:
    path = need(AVAZU / "dev.csv")
    ds = read_dataset(path, "avazu")
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert ds.rows == len(rows) == 480
    assert np.diff(ds.offsets).tolist() == [22] * 480  # Avazu has no empty cells
    assert row_keys(ds, 0) == reference_keys(rows[0][2:])


def test_avazu_wrong_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("id,click,hour\n1,0,14102100\n")
    with pytest.raises(ValueError, match=r"a\.csv:1: Avazu header .*format 'csv'"):
        read_dataset(path, "avazu")


# --- csv -----------------------------------------------------------------------------------


def test_csv_criteo_sample_with_named_columns() -> None:
    path = need(CRITEO_SAMPLE)
    ds = read_dataset(
        path, "csv", sparse_columns=C_COLUMNS, label_column="label", dense_columns=I_COLUMNS
    )
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert ds.rows == len(rows) == 200
    assert ds.labels.sum() == 49
    for r in (0, 1, 199):
        assert row_keys(ds, r) == reference_keys([rows[r][c] for c in C_COLUMNS])
    raw = [[float(row[c]) if row[c] else 0.0 for c in I_COLUMNS] for row in rows]
    assert np.array_equal(ds.dense, np.array(raw, dtype=np.float32))  # no log for csv
    assert ds.dense[0, 2] == 260.0 and ds.dense[1, 1] == -1.0


def test_csv_column_errors_list_the_available_columns() -> None:
    path = need(CRITEO_SAMPLE)
    with pytest.raises(ValueError, match=r"'C99' is not a column; available columns: label, I1"):
        read_dataset(path, "csv", sparse_columns=["C1", "C99"])
    with pytest.raises(ValueError, match=r"needs sparse_columns .* available columns: label"):
        read_dataset(path, "csv")
    with pytest.raises(ValueError, match="not the string"):
        read_dataset(path, "csv", sparse_columns="C1")
    with pytest.raises(ValueError, match="name a column twice"):
        read_dataset(path, "csv", sparse_columns=["C1", "C1"])
    with pytest.raises(ValueError, match="label does not leak"):
        read_dataset(path, "csv", sparse_columns=["C1", "label"], label_column="label")


def test_csv_labels_and_dense_parsing(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('y,x,cat,"name, quoted"\n1,2.5,a,"p,q"\n0,,,\n0.25,-3,a,r\n')
    ds = read_dataset(
        path, "csv", sparse_columns=["cat", "name, quoted"], label_column="y", dense_columns=["x"]
    )
    assert ds.labels.tolist() == [1.0, 0.0, 0.25]
    assert ds.dense[:, 0].tolist() == [2.5, 0.0, -3.0]
    assert ds.offsets.tolist() == [0, 2, 2, 4]
    assert ds.keys.tolist() == [
        feature_key(0, "a"),
        feature_key(1, "p,q"),
        feature_key(0, "a"),
        feature_key(1, "r"),
    ]
    unlabeled = read_dataset(path, "csv", sparse_columns=["cat"])
    assert unlabeled.labels.tolist() == [0.0, 0.0, 0.0] and unlabeled.dense.shape == (3, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("1,a\n,b\n", r"t\.csv:3:1: label column 'y' is ''; write a finite number there"),
        ("1,a\nnan,b\n", r"t\.csv:3:1: label column 'y' is 'nan'"),
        ("1,a\n0,b,extra\n", r"t\.csv:3: expected 2 fields \(the 2 header columns\), found 3"),
        ('1,"a\n', r"t\.csv:2: malformed CSV"),
    ],
)
def test_csv_bad_cells_name_line_and_column(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,c\n" + body)
    with pytest.raises(ValueError, match=message):
        read_dataset(path, "csv", sparse_columns=["c"], label_column="y")


def test_reader_argument_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("c\na\n")
    assert FORMATS == ("criteo", "avazu", "csv")
    with pytest.raises(ValueError, match="unknown format 'parquet'; use one of criteo"):
        read_dataset(path, "parquet")
    with pytest.raises(ValueError, match="max_rows must be >= 0"):
        read_dataset(path, "csv", sparse_columns=["c"], max_rows=-1)
    with pytest.raises(ValueError, match="no such file"):
        read_dataset(tmp_path / "missing.csv", "csv", sparse_columns=["c"])
    (tmp_path / "nul.csv").write_text("c\na\x00\n")
    with pytest.raises(ValueError, match=r"nul\.csv:2: contains a NUL"):
        read_dataset(tmp_path / "nul.csv", "csv", sparse_columns=["c"])
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="needs a header line"):
        read_dataset(tmp_path / "empty.csv", "csv", sparse_columns=["c"])


values = st.sampled_from(["", "a", "b", "0", "1", "x y", "é", "a,b", '"q"'])


@settings(max_examples=40, deadline=None)
@given(
    table=st.lists(st.lists(values, min_size=3, max_size=3), max_size=30),
    seed=st.integers(0, 2**32),
)
def test_csv_keys_match_reference_in_any_row_order(table: list[list[str]], seed: int) -> None:
    """Same (column, value) -> same key, whatever the row order; empty cells give no key."""
    order = np.random.default_rng(seed).permutation(len(table)).tolist()
    datasets = []
    with tempfile.TemporaryDirectory() as folder:
        for name, rows in (("plain", table), ("shuffled", [table[i] for i in order])):
            path = Path(folder) / f"{name}.csv"
            with path.open("w", encoding="utf-8", newline="") as f:
                csv.writer(f).writerows([["f0", "f1", "f2"], *rows])
            datasets.append(read_dataset(path, "csv", sparse_columns=["f2", "f0"]))
    plain, shuffled = datasets
    for r, row in enumerate(table):
        assert row_keys(plain, r) == reference_keys([row[2], row[0]])
    for new_row, old_row in enumerate(order):
        assert row_keys(shuffled, new_row) == row_keys(plain, old_row)


# --- SparseDataset -------------------------------------------------------------------------


def toy(rows: int) -> SparseDataset:
    """Row r has r % 3 keys (100 r + i), label r and one dense feature -r."""
    counts = np.arange(rows) % 3
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    keys = np.concatenate([100 * r + np.arange(c) for r, c in enumerate(counts)] + [[]])
    return SparseDataset(
        offsets=offsets,
        keys=keys.astype(np.int64),
        labels=np.arange(rows, dtype=np.float32),
        dense=-np.arange(rows, dtype=np.float32)[:, None],
        sparse_columns=("k",),
        dense_columns=("d",),
    )


def test_row_slice_rebases_offsets() -> None:
    ds = toy(10)
    part = ds.row_slice(4, 8)
    assert part.rows == 4 and part.offsets[0] == 0
    assert part.offsets.tolist() == (ds.offsets[4:9] - ds.offsets[4]).tolist()
    for r in range(4):
        assert row_keys(part, r) == row_keys(ds, 4 + r)
    assert part.labels.tolist() == [4, 5, 6, 7] and part.dense[:, 0].tolist() == [-4, -5, -6, -7]
    assert ds.row_slice(3, 3).rows == 0 and ds.row_slice(3, 3).keys.size == 0
    with pytest.raises(ValueError, match="out of range for 10 rows"):
        ds.row_slice(5, 11)
    with pytest.raises(ValueError, match="out of range"):
        ds.row_slice(6, 5)


def test_batches_drop_the_partial_tail_and_respect_limit() -> None:
    ds = toy(10)
    batches = list(ds.batches(3))
    assert [b.rows for b in batches] == [3, 3, 3]
    assert np.array_equal(np.concatenate([b.keys for b in batches]), ds.row_slice(0, 9).keys)
    assert [b.labels[0] for b in ds.batches(3, limit=2)] == [0, 3]
    assert list(ds.batches(3, limit=0)) == []
    assert list(ds.batches(11)) == []
    assert len(list(ds.batches(5))) == 2
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ds.batches(0)
    with pytest.raises(ValueError, match="limit must be >= 0"):
        ds.batches(2, limit=-1)


def test_inconsistent_arrays_are_refused() -> None:
    ds = toy(4)
    with pytest.raises(ValueError, match="offsets must start at 0 and end at len"):
        SparseDataset(ds.offsets, ds.keys[:-1], ds.labels, ds.dense, ("k",), ("d",))
    with pytest.raises(ValueError, match="must be int64"):
        SparseDataset(ds.offsets.astype(np.int32), ds.keys, ds.labels, ds.dense, ("k",), ("d",))
    with pytest.raises(ValueError, match=r"dense must have shape \(rows, 2\)"):
        SparseDataset(ds.offsets, ds.keys, ds.labels, ds.dense, ("k",), ("d", "e"))


def test_read_arrays_are_read_only(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("c\na\nb\n")
    ds = read_dataset(path, "csv", sparse_columns=["c"])
    with pytest.raises(ValueError, match="read-only"):
        ds.keys[0] = 1
    with pytest.raises(ValueError, match="read-only"):
        next(ds.batches(1)).offsets[0] = 1


def test_fields_name_the_column_of_every_key(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,c\nx,,z\n,y,\nx,y,z\n")
    ds = read_dataset(path, "csv", sparse_columns=["a", "b", "c"])
    assert ds.fields is not None
    assert ds.fields.tolist() == [0, 2, 1, 0, 1, 2]
    assert ds.row_slice(1, 3).fields.tolist() == [1, 0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="fields must be int32"):
        SparseDataset(
            ds.offsets, ds.keys, ds.labels, ds.dense, ds.sparse_columns, (), ds.fields[:2]
        )
