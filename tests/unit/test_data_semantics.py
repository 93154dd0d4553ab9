"""What the streaming reader reads, against independent plain-Python parsing of the real
sample files and of small generated ones; plus ``SparseDataset`` itself.

Ported from the old whole-file reader's tests (``tests/unit/test_datasets.py``). Error
messages, source kinds and dense transforms have their own files (test_data_errors,
test_data_sources, test_data_stream); byte-for-byte agreement with the old reader on every
shipped file is test_data_compat.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.data import DataError, DataSpec, SparseDataset, read_all, stream
from heraldps.data.dataset import concat
from heraldps.data.keys import feature_key
from heraldps.data.spec import AVAZU_COLUMNS

HERE = Path(__file__).resolve()
# The shared data sits beside the main checkout (/work/shared) or beside a worktree's parent.
DATA = next(
    (
        p
        for p in (HERE.parents[3] / "shared" / "data", HERE.parents[4] / "shared" / "data")
        if p.is_dir()
    ),
    HERE.parents[3] / "shared" / "data",
)
CRITEO = DATA / "criteo_kaggle_head8k"
AVAZU = DATA / "avazu_head9k"
CRITEO_SAMPLE = DATA / "criteo_deepctr_sample" / "criteo_sample.txt"
C_COLUMNS = tuple(f"C{i}" for i in range(1, 27))
I_COLUMNS = tuple(f"I{i}" for i in range(1, 14))


def need(path: Path) -> Path:
    """Skip (not fail) where the shared sample data is not checked out next to the repo."""
    if not path.exists():
        pytest.skip(f"sample data {path} is absent; put the shared data folder at {DATA}")
    return path


def read(path: Path, fmt: str = "criteo", **fields: object) -> SparseDataset:
    return read_all(DataSpec(str(path), fmt, **fields))  # type: ignore[arg-type]


def row_keys(ds: SparseDataset, row: int) -> list[int]:
    keys: list[int] = ds.keys[ds.offsets[row] : ds.offsets[row + 1]].tolist()
    return keys


def tsv_rows(path: Path) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in path.read_text().splitlines(True)]


def reference_keys(cells: list[str]) -> list[int]:
    """The spec's rule, cell by cell: one key per non-empty value, in column order."""
    return [feature_key(j, v) for j, v in enumerate(cells) if v != ""]


# --- criteo --------------------------------------------------------------------------------


def test_criteo_train_matches_plain_python() -> None:
    path = need(CRITEO / "train.tsv")
    ds = read(path)
    rows = tsv_rows(path)
    assert ds.rows == len(rows) == 7200
    assert ds.sparse_columns == C_COLUMNS
    assert ds.dense_columns == I_COLUMNS
    for r in range(0, ds.rows, 7):
        assert row_keys(ds, r) == reference_keys(rows[r][14:])
    assert ds.labels.tolist() == [float(row[0]) for row in rows]
    dense = [[math.log1p(max(float(x), 0.0)) if x else 0.0 for x in row[1:14]] for row in rows]
    np.testing.assert_allclose(ds.dense, np.array(dense, dtype=np.float32), rtol=1e-6)
    distinct = sum(len({row[14 + j] for row in rows} - {""}) for j in range(26))
    assert ds.distinct_keys() == distinct == 34431


def test_criteo_empty_values_give_no_key() -> None:
    path = need(CRITEO / "train.tsv")
    ds = read(path)
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
        ds = read(path)
        keys.append(ds.keys)
        fields.append(np.nonzero(present)[1])  # row-major, in column order, like the keys
        assert ds.fields is not None and np.array_equal(ds.fields, fields[-1])
        empties += (~present).sum(axis=0)
    all_keys, all_fields = np.concatenate(keys), np.concatenate(fields)
    for j, name in enumerate(C_COLUMNS):
        expected = unique[name] - (1 if missing[name] else 0)
        assert np.unique(all_keys[all_fields == j]).size == expected, name
        assert empties[j] == missing[name], name
    assert np.unique(all_keys).size == sum(unique.values()) - sum(m > 0 for m in missing.values())


def test_keys_are_stable_across_reads_and_row_order(tmp_path: Path) -> None:
    path = need(CRITEO / "train.tsv")
    first, second = read(path), read(path)
    assert np.array_equal(first.keys, second.keys)
    assert np.array_equal(first.offsets, second.offsets)
    reversed_path = tmp_path / "reversed.tsv"
    reversed_path.write_text("".join(reversed(path.read_text().splitlines(True))))
    flipped = read(reversed_path)
    n = first.rows
    for r in range(0, n, 97):
        assert row_keys(flipped, n - 1 - r) == row_keys(first, r)
    assert np.array_equal(np.unique(flipped.keys), np.unique(first.keys))


def test_criteo_stop_row_reads_a_prefix() -> None:
    path = need(CRITEO / "train.tsv")
    full, head = read(path), read(path, stop_row=100)
    assert head.rows == 100
    assert np.array_equal(head.keys, full.row_slice(0, 100).keys)
    assert np.array_equal(head.dense, full.row_slice(0, 100).dense)
    assert read(path, stop_row=0).rows == 0


def criteo_line(label: str = "0", ints: str = "", cats: str = "") -> str:
    return "\t".join([label, *([ints] * 13), *([cats] * 26)]) + "\n"


def test_a_bad_line_after_the_rows_read_is_an_error_without_stop_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    good = criteo_line("1", "3", "abc")
    path.write_text(good + good + "\t".join(["0"] * 39) + "\n" + good)
    with pytest.raises(DataError, match=r"bad\.tsv:3: expected 40 tab-separated fields"):
        read(path)


def test_stop_row_stops_before_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    good = criteo_line("1", "3", "abc")
    path.write_text(good + good + "\t".join(["0"] * 39) + "\n" + good)
    assert read(path, stop_row=2).rows == 2


def test_stop_row_before_a_bad_line_blocks_into_the_file(tmp_path: Path) -> None:
    # 9,000 rows (about 1.5 MB: two 1 MB parse blocks at batch_rows=1000), a ragged line at
    # row 8,000: a stop_row before it reads exactly the rows a clean file gives; past it, the
    # error
    lines = [criteo_line(str(i % 2), str(i), f"v{i % 97}") for i in range(9_000)]
    clean = tmp_path / "clean.tsv"
    clean.write_text("".join(lines[:7_999]))
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines[:7_999]) + "\t".join(["0"] * 39) + "\n" + "".join(lines[8_000:]))
    want = read(clean)
    for stop in (7_999, 5_000, 100):
        spec = DataSpec(str(bad), "criteo", start_row=10, stop_row=stop)
        got = concat(list(stream(spec, batch_rows=1000)))
        assert got.rows == stop - 10
        assert np.array_equal(got.keys, want.row_slice(10, stop).keys)
        assert np.array_equal(got.dense, want.dense[10:stop])
        assert np.array_equal(got.labels, want.labels[10:stop])
    with pytest.raises(DataError, match=r"bad\.tsv:8000: expected 40 tab-separated fields"):
        read(bad, stop_row=8_001)


def test_criteo_dense_is_log1p_of_clipped_value(tmp_path: Path) -> None:
    path = tmp_path / "small.tsv"
    cells = ["1", "-1", "0", "", "3", *["9"] * 9, "a", "", *["b"] * 24]
    path.write_text("\t".join(cells) + "\r\n\n")  # CRLF and a blank line are tolerated
    ds = read(path)
    assert ds.rows == 1
    np.testing.assert_allclose(ds.dense[0, :4], [0.0, 0.0, 0.0, math.log1p(3)], rtol=1e-6)
    assert row_keys(ds, 0) == [feature_key(0, "a"), *(feature_key(j, "b") for j in range(2, 26))]
    assert ds.labels.tolist() == [1.0]


# --- avazu ---------------------------------------------------------------------------------


def test_avazu_with_and_without_header(tmp_path: Path) -> None:
    path = need(AVAZU / "train.csv")
    with_header = read(path, "avazu")
    headerless = tmp_path / "train_noheader.csv"
    headerless.write_text("".join(path.read_text().splitlines(True)[1:]))
    without = read(headerless, "avazu")
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
    ds = read(path, "avazu")
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert ds.rows == len(rows) == 480
    assert np.diff(ds.offsets).tolist() == [22] * 480  # Avazu has no empty cells
    assert row_keys(ds, 0) == reference_keys(rows[0][2:])


# --- csv -----------------------------------------------------------------------------------


def test_csv_criteo_sample_with_named_columns() -> None:
    path = need(CRITEO_SAMPLE)
    ds = read(
        path,
        "csv",
        sparse_columns=C_COLUMNS,
        label_column="label",
        dense_columns=I_COLUMNS,
        dense_transforms=("raw",),  # csv's default is standardize (needs scan()'s statistics)
    )
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert ds.rows == len(rows) == 200
    assert ds.labels.sum() == 49
    for r in (0, 1, 199):
        assert row_keys(ds, r) == reference_keys([rows[r][c] for c in C_COLUMNS])
    raw = [[float(row[c]) if row[c] else 0.0 for c in I_COLUMNS] for row in rows]
    assert np.array_equal(ds.dense, np.array(raw, dtype=np.float32))  # raw: no log
    assert ds.dense[0, 2] == 260.0 and ds.dense[1, 1] == -1.0


def test_csv_quoted_names_and_cells_labels_and_dense(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('y,x,cat,"name, quoted"\n1,2.5,a,"p,q"\n0,,,\n1.0,-3,a,r\n')
    ds = read(
        path,
        "csv",
        sparse_columns=("cat", "name, quoted"),
        label_column="y",
        dense_columns=("x",),
        dense_transforms=("raw",),
    )
    assert ds.labels.tolist() == [1.0, 0.0, 1.0]  # 0.25 was allowed before; now 0/1 only
    assert ds.dense[:, 0].tolist() == [2.5, 0.0, -3.0]  # a missing raw cell is 0.0
    assert ds.offsets.tolist() == [0, 2, 2, 4]
    assert ds.keys.tolist() == [
        feature_key(0, "a"),
        feature_key(1, "p,q"),
        feature_key(0, "a"),
        feature_key(1, "r"),
    ]
    assert ds.fields is not None and ds.fields.tolist() == [0, 1, 0, 1]
    unlabeled = read(path, "csv", sparse_columns=("cat",), no_label=True)
    assert unlabeled.labels.tolist() == [0.0, 0.0, 0.0] and unlabeled.dense.shape == (3, 0)


@pytest.mark.parametrize(
    "body",
    [
        '1,"a\n',  # the last cell opens a quote that never closes
        '1,a\n0,"b\n1,c\n',  # ... and swallows the lines after it into one cell
    ],
    ids=["last-line", "swallows-rows"],
)
def test_an_unclosed_quote_is_refused_with_its_line(tmp_path: Path, body: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,c\n" + body)
    with pytest.raises(DataError, match=r"t\.csv:\d+.*quote") as caught:
        read(path, "csv", sparse_columns=("c",), label_column="y")
    assert "\n" not in str(caught.value)


def test_stop_row_before_a_bad_csv_line_three_blocks_in(tmp_path: Path) -> None:
    # csv holds one parsed block back (the unclosed-quote check): a bad line in the third
    # 1 MB block with stop_row in the second still gives every row before stop_row
    rows = [f"{i % 2},v{i % 89},{'x' * 40}" for i in range(40_000)]  # about 2.2 MB
    clean = tmp_path / "clean.csv"
    clean.write_text("y,c,pad\n" + "\n".join(rows[:35_000]) + "\n")
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "y,c,pad\n" + "\n".join(rows[:35_000]) + "\n1,a,b,EXTRA\n" + "\n".join(rows[35_000:]) + "\n"
    )
    spec = {"sparse_columns": ("c",), "label_column": "y"}
    want = read_all(DataSpec(str(clean), "csv", **spec))  # type: ignore[arg-type]
    for stop in (34_999, 20_000, 1_000):
        chunks = stream(DataSpec(str(bad), "csv", stop_row=stop, **spec), batch_rows=1000)  # type: ignore[arg-type]
        got = concat(list(chunks))
        assert got.rows == stop and np.array_equal(got.keys, want.row_slice(0, stop).keys)
        assert np.array_equal(got.labels, want.labels[:stop])
    with pytest.raises(DataError, match=r"bad\.csv:35002: expected the 3 header columns"):
        read(bad, "csv", stop_row=35_001, **spec)


def test_an_unclosed_quote_after_stop_row_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text('y,c\n1,a\n0,"b\n1,c\n')
    ds = read(path, "csv", sparse_columns=("c",), label_column="y", stop_row=1)
    assert ds.rows == 1 and row_keys(ds, 0) == [feature_key(0, "a")]
    with pytest.raises(DataError, match=r"t\.csv:3: a quoted field opened on this line"):
        read(path, "csv", sparse_columns=("c",), label_column="y", stop_row=2)


values = st.sampled_from(["", "a", "b", "0", "1", "x y", " a", "é", "a,b", '"q"', "a\nb"])


@settings(max_examples=40, deadline=None)
@given(
    table=st.lists(st.lists(values, min_size=3, max_size=3), min_size=1, max_size=30),
    seed=st.integers(0, 2**32),
)
def test_csv_keys_match_reference_in_any_row_order(table: list[list[str]], seed: int) -> None:
    """Same (column, value) -> same key, whatever the row order; empty cells give no key;
    cells are read exactly as written (quotes, commas, spaces, line breaks)."""
    order = np.random.default_rng(seed).permutation(len(table)).tolist()
    datasets = []
    with tempfile.TemporaryDirectory() as folder:
        for name, rows in (("plain", table), ("shuffled", [table[i] for i in order])):
            path = Path(folder) / f"{name}.csv"
            with path.open("w", encoding="utf-8", newline="") as f:
                csv.writer(f).writerows([["f0", "f1", "f2"], *rows])
            datasets.append(read(path, "csv", sparse_columns=("f2", "f0"), no_label=True))
    plain, shuffled = datasets
    assert plain.rows == len(table)
    for r, row in enumerate(table):
        assert row_keys(plain, r) == reference_keys([row[2], row[0]])
    for new_row, old_row in enumerate(order):
        assert row_keys(shuffled, new_row) == row_keys(plain, old_row)


def test_read_arrays_are_read_only(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("c\na\nb\n")
    ds = read(path, "csv", sparse_columns=("c",), no_label=True)
    with pytest.raises(ValueError, match="read-only"):
        ds.keys[0] = 1
    with pytest.raises(ValueError, match="read-only"):
        next(ds.batches(1)).offsets[0] = 1


def test_fields_name_the_column_of_every_key(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,c\nx,,z\n,y,\nx,y,z\n")
    ds = read(path, "csv", sparse_columns=("a", "b", "c"), no_label=True)
    assert ds.fields is not None
    assert ds.fields.tolist() == [0, 2, 1, 0, 1, 2]
    assert ds.row_slice(1, 3).fields.tolist() == [1, 0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="fields must be int32"):
        SparseDataset(
            ds.offsets, ds.keys, ds.labels, ds.dense, ds.sparse_columns, (), ds.fields[:2]
        )


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
