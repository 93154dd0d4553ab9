"""``bundled:NAME[/FILE]`` names data shipped in the package, wherever it is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from heraldps import bundled
from heraldps.data import DataSpec, read_all
from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob


def test_names_resolve_to_the_package_files() -> None:
    train = bundled.resolve("bundled:criteo_head8k")
    assert train.name == "train.tsv" and train.is_file()
    assert train.parent.parent.parent == Path(bundled.__file__).parent
    assert bundled.resolve("bundled:criteo_head8k/test.tsv") == train.with_name("test.tsv")
    assert bundled.bundled_data() == (train, train.with_name("test.tsv"))
    assert bundled.resolve("data/x.tsv") == Path("data/x.tsv")  # other paths pass through


def test_unknown_names_list_what_exists() -> None:
    with pytest.raises(InvalidArgument, match="bundled: bundled:criteo_head8k"):
        bundled.resolve("bundled:criteo_full")
    with pytest.raises(InvalidArgument, match=r"has PROVENANCE\.md, test\.tsv, train\.tsv"):
        bundled.resolve("bundled:criteo_head8k/valid.tsv")


def test_a_job_reads_bundled_data() -> None:
    job = TrainingJob(data="bundled:criteo_head8k")
    assert job.read().rows == 7_200
    assert read_all(DataSpec("bundled:criteo_head8k/test.tsv")).rows == 391
