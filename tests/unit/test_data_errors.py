"""Every bad input gets one line with file, row and column, from check() (before any process
starts) or, deep in a long file, from the stream when it gets there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from heraldps.data import DataError, DataSpec, check, read_all, scan, stream

AVAZU = Path(__file__).resolve().parents[3] / "shared" / "data" / "avazu_head9k"
if not AVAZU.is_dir():
    AVAZU = Path(__file__).resolve().parents[4] / "shared" / "data" / "avazu_head9k"

CSV: dict[str, Any] = {"format": "csv", "sparse_columns": ("c",), "label_column": "y"}


def criteo_line(label: str = "0", ints: str = "", cats: str = "") -> str:
    return "\t".join([label, *([ints] * 13), *([cats] * 26)]) + "\n"


GOOD = criteo_line("1", "3", "abc")

CASES: list[tuple[str, str | bytes, dict[str, Any], str]] = [
    ("header_only.csv", "y,c\n", CSV, r"header_only\.csv: has a header line but no data rows"),
    ("empty.csv", "", CSV, r"empty\.csv: empty file \(no rows\)"),
    ("blank.tsv", "\n\n", {}, r"blank\.tsv: empty file"),
    (
        "ragged.tsv",
        GOOD + GOOD + "\t".join(["0"] * 39) + "\n" + GOOD,
        {},
        r"ragged\.tsv:3: expected 40 tab-separated fields \(label, I1\.\.I13, C1\.\.C26\), "
        r"found 39: fix or remove this line$",
    ),
    (  # blank lines, which pyarrow skips, do not shift the line number
        "ragged_blank.tsv",
        GOOD + "\n\r\n" + GOOD + "\t".join(["0"] * 39) + "\n" + GOOD,
        {},
        r"ragged_blank\.tsv:5: expected 40 tab-separated fields .* found 39",
    ),
    (
        "ragged.csv",
        "y,c\n1,a\n\n0,b,x\n",
        CSV,
        r"ragged\.csv:4: expected the 2 header columns, found 3",
    ),
    ("nul.csv", "y,c\n1,a\n0,a\x00\n", CSV, r"nul\.csv:3: contains a NUL byte"),
    (
        "latin1.csv",
        "y,c\n1,caf\xe9\n".encode("latin1"),
        CSV,
        r"latin1\.csv:2:6: not valid UTF-8 \(byte 0xe9\)",
    ),
    (
        "own.csv",
        "age,city,click\n31,Paris,1\n",
        {},
        r"own\.csv:1: expected 40 tab-separated fields \(label, I1\.\.I13, C1\.\.C26\), found 1: "
        r"this looks like a comma-separated file with a header: try --format csv$",
    ),
    ("crit.tsv", GOOD, CSV, r"crit\.tsv:1: the header has 1 column .*try --format criteo"),
    (
        "wrong_header.csv",
        "id,click,hour\n1,0,14102100\n",
        {"format": "avazu"},
        r":1: Avazu header is 'id,click,hour', expected .*format 'csv'",
    ),
    (
        "cols.csv",
        "y,c\n1,a\n",
        CSV | {"sparse_columns": ("c", "zz")},
        r"cols\.csv: sparse column 'zz' is not a column; available columns: y, c$",
    ),
    (
        "leak.csv",
        "y,c\n1,a\n",
        CSV | {"sparse_columns": ("c", "y")},
        r"label column 'y' is also a feature column",
    ),
    (
        "nosparse.csv",
        "y,c\n1,a\n",
        CSV | {"sparse_columns": None},
        r"nosparse\.csv: format 'csv' needs sparse_columns .*; available columns: y, c$",
    ),
    (
        "nolabel.csv",
        "y,c\n1,a\n",
        CSV | {"label_column": "click"},
        r"nolabel\.csv: label column 'click' is not a column; available columns: y, c",
    ),
    (
        "unnamed.csv",
        "y,c\n1,a\n",
        CSV | {"label_column": None},
        r"unnamed\.csv: format 'csv' needs label_column .*no.label",
    ),
    (
        "label2.csv",
        "click,c\n1,a\n\n0,b\n2,c\n",
        CSV | {"label_column": "click"},
        r"label2\.csv:5:1: label 'click' is '2'; labels must be 0 or 1",
    ),
    ("half.csv", "y,c\n0.5,a\n", CSV, r"half\.csv:2:1: label 'y' is '0\.5'; labels must be 0 or 1"),
    (
        "nan.csv",
        "y,c\n1,a\nnan,b\n",
        CSV,
        r"nan\.csv:3:1: label 'y' is 'nan'; labels must be 0 or 1",
    ),
    ("nolabelcell.csv", "y,c\n1,a\n,b\n", CSV, r"nolabelcell\.csv:3:1: label 'y' is empty"),
    (
        "dense.tsv",
        criteo_line() + criteo_line(ints="7") + criteo_line(ints="x1"),
        {},
        r"dense\.tsv:3:2: dense column 'I1' is 'x1'; write a finite number",
    ),
    (
        "inf.csv",
        "y,c,x\n1,a,inf\n",
        CSV | {"dense_columns": ("x",), "dense_transforms": ("raw",)},
        r"inf\.csv:2:3: dense column 'x' is 'inf'",
    ),
]


@pytest.mark.parametrize(("name", "body", "fields", "message"), CASES, ids=[c[0] for c in CASES])
def test_check_refuses_bad_input_in_one_line(
    tmp_path: Path, name: str, body: str | bytes, fields: dict[str, Any], message: str
) -> None:
    path = tmp_path / name
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body)
    with pytest.raises(DataError, match=message) as caught:
        check(DataSpec(str(path), **fields))
    assert "\n" not in str(caught.value)
    assert str(path) in str(caught.value) or "feature column" in str(caught.value)


def test_avazu_read_as_criteo_suggests_avazu() -> None:
    for name in ("train.csv", "dev.csv"):
        path = AVAZU / name
        if not path.exists():
            pytest.skip("shared data absent")
        with pytest.raises(DataError, match=r":1: expected 40 .* try --format avazu$"):
            check(DataSpec(str(path)))


def test_a_problem_deep_in_a_file_stops_the_stream_with_its_line(tmp_path: Path) -> None:
    # Past the first 65,536 rows, the reader's unit of conversion: the chunks before it come
    # out, then the stream stops at the bad line.
    lines = [criteo_line(str(i % 2), "1", f"v{i % 50}") for i in range(80_000)]
    lines[70_000] = criteo_line("3", "1", "x")
    lines.insert(100, "\n")  # a blank line before it
    path = tmp_path / "long.tsv"
    path.write_text("".join(lines))
    spec = DataSpec(str(path))
    check(spec)  # the first chunk is fine
    rows = 0
    with pytest.raises(
        DataError, match=r"long\.tsv:70002:1: label 'label' is '3'; labels must be 0 or 1"
    ):
        for chunk in stream(spec, batch_rows=4096):
            rows += chunk.rows
    assert 0 < rows <= 70_000 and rows % 4096 == 0
    with pytest.raises(DataError, match=r"long\.tsv:70002:1"):
        scan(spec)


def test_spec_errors() -> None:
    with pytest.raises(
        DataError, match="unknown format 'json'; use one of criteo, avazu, csv, parquet"
    ):
        DataSpec("x", "json")
    with pytest.raises(DataError, match="not the string"):
        DataSpec("x", "csv", sparse_columns="c")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="name a column twice"):
        DataSpec("x", "csv", sparse_columns=("c", "c"))
    with pytest.raises(DataError, match="unknown transform 'log'"):
        DataSpec("x", dense_transforms=("log",))
    with pytest.raises(DataError, match="2 dense_transforms for 13 dense columns"):
        DataSpec("x", dense_transforms=("raw", "raw"))
    with pytest.raises(DataError, match="no_label is set but label_column"):
        DataSpec("x", "csv", label_column="y", no_label=True)
    with pytest.raises(DataError, match=r"row range \[5, 2\) is invalid"):
        DataSpec("x", start_row=5, stop_row=2)
    with pytest.raises(DataError, match=r"row range \[-1, None\) is invalid"):
        DataSpec("x", start_row=-1)


def test_no_label_reads_zeros(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("c\na\nb\n")
    ds = read_all(DataSpec(str(path), "csv", sparse_columns=("c",), no_label=True))
    assert ds.labels.tolist() == [0.0, 0.0]


def test_transform_without_stats_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("y,c,age\n1,a,30\n")
    spec = DataSpec(
        str(path), "csv", sparse_columns=("c",), label_column="y", dense_columns=("age",)
    )
    with pytest.raises(
        DataError, match=r"dense column 'age' uses transform 'standardize', which needs statistics"
    ):
        next(stream(spec))
