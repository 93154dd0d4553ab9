"""Every source kind (file, files, directory, glob, .gz, Parquet) reads the same rows."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from heraldps import bundled
from heraldps.data import DataError, DataSpec, files_of, read_all
from heraldps.data.dataset import SparseDataset
from heraldps.data.sources import natural_key
from heraldps.data.spec import CRITEO_COLUMNS

TRAIN = bundled.resolve("bundled:criteo_head8k")


def same(a: SparseDataset, b: SparseDataset) -> None:
    for name in ("offsets", "keys", "labels", "dense", "fields"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.fixture(scope="module")
def whole() -> SparseDataset:
    return read_all(DataSpec(str(TRAIN)))


def split(tmp_path: Path, parts: list[str], folder: str = "parts") -> list[Path]:
    """The bundled TSV cut into files named ``parts`` (in data order)."""
    lines = TRAIN.read_text().splitlines(True)
    out = tmp_path / folder
    out.mkdir(parents=True, exist_ok=True)
    cuts = np.linspace(0, len(lines), len(parts) + 1).astype(int)
    paths = []
    for name, lo, hi in zip(parts, cuts[:-1], cuts[1:], strict=True):
        path = out / name
        path.write_text("".join(lines[lo:hi]))
        paths.append(path)
    return paths


def test_natural_order() -> None:
    names = ["day_10", "day_2", "day_0", "day_1.gz", "part-00010.csv", "part-00009.csv"]
    assert sorted(names, key=natural_key) == [
        "day_0",
        "day_1.gz",
        "day_2",
        "day_10",
        "part-00009.csv",
        "part-00010.csv",
    ]


def test_comma_separated_files(tmp_path: Path, whole: SparseDataset) -> None:
    paths = split(tmp_path, ["b.tsv", "a.tsv", "c.tsv"])
    same(read_all(DataSpec(",".join(str(p) for p in paths))), whole)  # the order given


def test_directory_in_natural_order_skipping_spark_files(
    tmp_path: Path, whole: SparseDataset
) -> None:
    parts = split(tmp_path, ["day_0", "day_2", "day_10"], "days")
    (tmp_path / "days" / "_SUCCESS").write_text("")
    (tmp_path / "days" / ".day_0.crc").write_text("junk")
    (tmp_path / "days" / "_temporary").mkdir()
    (tmp_path / "days" / "_temporary" / "x.tsv").write_text("junk")
    assert files_of(tmp_path / "days") == parts
    same(read_all(DataSpec(str(tmp_path / "days"))), whole)


def test_glob(tmp_path: Path, whole: SparseDataset) -> None:
    split(tmp_path, ["part-2.tsv", "part-9.tsv", "part-10.tsv"])
    (tmp_path / "parts" / "other.txt").write_text("not matched")
    same(read_all(DataSpec(str(tmp_path / "parts" / "part-*.tsv"))), whole)
    with pytest.raises(DataError, match="matches no files"):
        read_all(DataSpec(str(tmp_path / "nothing-*.tsv")))


def test_gzip_streams(tmp_path: Path, whole: SparseDataset) -> None:
    path = tmp_path / "train.tsv.gz"
    with TRAIN.open("rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    same(read_all(DataSpec(str(path))), whole)


def test_parquet_in_criteo_layout(tmp_path: Path, whole: SparseDataset) -> None:
    columns = list(CRITEO_COLUMNS)
    table = pacsv.read_csv(
        TRAIN,
        read_options=pacsv.ReadOptions(column_names=columns),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in columns[14:]} | {"label": pa.int64()},
            strings_can_be_null=False,
        ),
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path, row_group_size=1000)
    same(read_all(DataSpec(str(path))), whole)
    # Empty strings written as nulls give no key either.
    nulls = table.set_column(
        14, "C1", pa.array([v or None for v in table.column("C1").to_pylist()])
    )
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    same(read_all(DataSpec(str(tmp_path / "nulls.parquet"))), whole)


def test_parquet_integer_ids_key_like_their_text(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("label,user,item\n1,7,100\n0,8,100\n")
    pq.write_table(
        pa.table({"label": [1, 0], "user": [7, 8], "item": pa.array([100, 100], pa.int32())}),
        tmp_path / "t.parquet",
    )
    specs = [
        DataSpec(str(tmp_path / name), fmt, sparse_columns=("user", "item"), label_column="label")
        for name, fmt in (("t.csv", "csv"), ("t.parquet", "parquet"))
    ]
    same(read_all(specs[1]), read_all(specs[0]))


def test_unknown_suffix_names_what_we_read(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text("{}")
    with pytest.raises(
        DataError, match=r"data\.json: unknown file suffix '\.json'; heraldps reads text"
    ):
        files_of(tmp_path / "data.json")
    with pytest.raises(DataError, match="no such file or directory"):
        files_of(tmp_path / "missing.tsv")
