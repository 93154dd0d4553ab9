"""The job file: sections and keys checked, mapped onto the TrainingJob in one place,
flags over file values, paths relative to the file, the shipped examples valid."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from heraldps import job_file
from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob
from launcher.cli import train as train_cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"

SMALL = {
    "data": {"train": "bundled:criteo_head8k", "valid_fraction": 0.1, "format": "criteo"},
    "model": {"embedding_dim": 6, "hidden_layers": [16, 8], "dropout": 0.1},
    "optimizer": {"name": "adam", "lr": 0.002, "embedding_l2": 0.05, "weight_decay": 0.01},
    "schedule": {"max_epochs": 3, "seed": 5},
    "cluster": {"mode": "naive", "workers": 2, "batch_size_per_worker": 64},
}


def test_sections_map_onto_the_training_job() -> None:
    jf = job_file.from_dict(SMALL)
    job = jf.job
    assert (job.data, job.format, job.embedding_dim, job.hidden, job.dropout) == (
        "bundled:criteo_head8k", "criteo", 6, (16, 8), 0.1)  # fmt: skip
    assert (job.optimizer, job.lr, job.embedding_l2, job.weight_decay) == ("adam", 0.002,
                                                                          0.05, 0.01)  # fmt: skip
    assert (job.workers, job.batch_size_per_worker, job.seed, job.epochs) == (2, 64, 5, 3)
    assert jf.cluster.mode == "naive" and jf.splits.valid_fraction == 0.1
    assert jf.schedule.monitor == "auc" and jf.schedule.patience == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**SMALL, "trainer": {}}, "unknown section 'trainer'; the sections are: data, model"),
        ({**SMALL, "model": {"hidden": [8]}}, "unknown key model.hidden; the keys of 'model' "
         "are: embedding_dim, hidden_layers"),
        ({**SMALL, "schedule": {"monitor": "accuracy"}}, "schedule.monitor must be one of"),
        ({**SMALL, "cluster": {"mode": "fast"}}, "unknown mode 'fast'"),
        ({"model": {}}, "data.train is required"),
        ({**SMALL, "data": {"train": "x", "valid": "v", "valid_fraction": 0.1}}, "not both"),
    ],
)  # fmt: skip
def test_unknown_sections_keys_and_values_are_refused_with_the_valid_ones(
    raw: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        job_file.from_dict(raw)


def test_early_write_back_is_all_off_or_a_row_count() -> None:
    assert job_file.from_dict(SMALL).job.early_write_back == -1  # the default: all
    for value, rows in (("all", -1), ("off", 0), (16, 16)):
        raw = {**SMALL, "cluster": {**SMALL["cluster"], "early_write_back": value}}
        assert job_file.from_dict(raw).job.early_write_back == rows
    for bad in ("some", 1.5, True, -3):
        raw = {**SMALL, "cluster": {**SMALL["cluster"], "early_write_back": bad}}
        with pytest.raises(InvalidArgument, match="early"):
            job_file.from_dict(raw)


def test_look_ahead_is_one_to_thirty_two_batches() -> None:
    assert job_file.from_dict(SMALL).job.look_ahead == 1  # the default: one batch
    raw = {**SMALL, "cluster": {**SMALL["cluster"], "look_ahead": 4}}
    assert job_file.from_dict(raw).job.look_ahead == 4
    for bad in (0, 33, "4", 2.0, True):
        raw = {**SMALL, "cluster": {**SMALL["cluster"], "look_ahead": bad}}
        with pytest.raises(InvalidArgument, match=r"cluster\.look_ahead"):
            job_file.from_dict(raw)
    with pytest.raises(InvalidArgument, match="--look-ahead must be 1"):
        TrainingJob(data="x", look_ahead=0)


def test_batch_norm_passes_through() -> None:
    raw = {**SMALL, "model": {**SMALL["model"], "batch_norm": True}}
    assert job_file.from_dict(raw).job.batch_norm
    off = {**SMALL, "model": {**SMALL["model"], "batch_norm": False}}
    assert not job_file.from_dict(off).job.batch_norm


def test_flags_override_the_file_and_paths_follow_the_file(tmp_path: Path) -> None:
    raw = {**SMALL, "data": {"train": "data/train.csv", "test": "/abs/test.csv",
                             "format": "csv"}, "output": {"dir": "out"}}  # fmt: skip
    path = tmp_path / "jobs" / "job.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--job", str(path), "--mode", "herald", "--workers", "4",
                              "--seed", "9", "--max-epochs", "7", "--out", "/tmp/o"])  # fmt: skip
    jf = job_file.load(path, train_cli.overrides_of(args))
    assert jf.cluster.mode == "herald" and jf.job.workers == 4 and jf.job.seed == 9
    assert jf.schedule.max_epochs == 7 and jf.output == "/tmp/o"
    assert jf.job.batch_size_per_worker == 64  # not overridden: the file's
    assert jf.job.data == str(tmp_path / "jobs" / "data" / "train.csv")
    assert jf.splits.test == "/abs/test.csv"
    assert job_file.load(path).output == str(tmp_path / "jobs" / "out")


def test_a_job_file_and_a_flat_job_json_both_load_as_the_job(tmp_path: Path) -> None:
    """What feed and the workers read: either form."""
    as_json = tmp_path / "job.json"
    as_json.write_text(json.dumps(SMALL))  # a job file written as JSON
    assert TrainingJob.load(as_json) == job_file.from_dict(SMALL).job
    flat = tmp_path / "flat.json"
    flat.write_text(job_file.from_dict(SMALL).job.to_json())
    assert TrainingJob.load(flat) == job_file.from_dict(SMALL).job


@pytest.mark.parametrize("name", ["criteo_sample.yaml", "frappe_bars.yaml"])
def test_the_shipped_job_files_are_valid(name: str) -> None:
    raw = job_file.read(EXAMPLES / name)
    job_file.check_keys(raw)
    if not raw.get("model", {}).get("batch_norm") or "batch_norm" in {
        f.name for f in fields(TrainingJob)
    }:
        job_file.load(EXAMPLES / name)


def test_local_takes_the_job_file_with_its_flags_winning(tmp_path: Path) -> None:
    """``heraldps local --job FILE``: the file sets what the flags leave at their defaults."""
    from launcher.cli import local as local_cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    parser = argparse.ArgumentParser()
    local_cli.add_arguments(parser)
    args = parser.parse_args(["--job", str(path), "--workers", "3"])
    extra = local_cli.job_file_flags(args)
    assert args.workers == 3  # the flag
    assert (args.modes, args.batch_size_per_worker, args.epochs, args.optimizer, args.lr) == (
        "naive", 64, 3, "adam", 0.002)  # fmt: skip
    assert (args.hidden_layers, args.embedding_dim, args.eval_fraction) == ((16, 8), 6, 0.1)
    assert extra == {"seed": 5}  # no flag of local's sets it: set on the job
    # The scheduler's settings: the file's, unless a flag sets them.
    cluster = {**SMALL["cluster"], "early_write_back": "off", "look_ahead": 4}
    path.write_text(yaml.safe_dump({**SMALL, "cluster": cluster}))
    args = parser.parse_args(["--job", str(path)])
    assert local_cli.job_file_flags(args) == {"seed": 5}
    assert (args.early_write_back, args.look_ahead) == (0, 4)
    args = parser.parse_args(["--job", str(path), "--look-ahead", "2", "--early-write-back", "7"])
    local_cli.job_file_flags(args)
    assert (args.early_write_back, args.look_ahead) == (7, 2)


def test_fractions_hold_out_the_last_rows_for_train_and_feed_alike(tmp_path: Path) -> None:
    from launcher.feed import _load_job

    jf = job_file.from_dict({**SMALL, "data": {**SMALL["data"], "test_fraction": 0.05}})
    split = job_file.row_split(jf)
    assert split is not None and split.total == 7200  # the bundled sample's training file
    assert (split.valid, split.test) == (720, 360) and split.train == 7200 - 720 - 360
    assert job_file.training_split(jf).max_rows == split.train
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "data": {**SMALL["data"], "test_fraction": 0.05}}))
    assert _load_job(str(path))[0].max_rows == split.train  # what heraldps feed trains
    assert job_file.row_split(job_file.from_dict({**SMALL, "data": {"train": "x"}})) is None


def test_checkpoint_keys_reach_train_and_local(tmp_path: Path) -> None:
    """``schedule.checkpoint_every``, ``keep_checkpoints``, ``checkpoint_epochs`` and
    ``cluster.max_restarts``: read by ``heraldps train``, and by ``heraldps local --job``."""
    from launcher.cli import local as local_cli

    raw = {**SMALL, "schedule": {**SMALL["schedule"], "checkpoint_every": 4,
                                 "keep_checkpoints": 3, "checkpoint_epochs": False},
           "cluster": {**SMALL["cluster"], "max_restarts": 2}}  # fmt: skip
    jf = job_file.from_dict(raw)
    assert (jf.schedule.checkpoint_every, jf.schedule.keep_checkpoints) == (4, 3)
    assert not jf.schedule.checkpoint_epochs and jf.cluster.max_restarts == 2
    assert job_file.from_dict(SMALL).schedule.checkpoints  # epoch ends, by default
    with pytest.raises(InvalidArgument, match="max_restarts"):
        job_file.from_dict({**SMALL, "cluster": {"max_restarts": -1}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    parser = argparse.ArgumentParser()
    local_cli.add_arguments(parser)
    args = parser.parse_args(["--job", str(path), "--max-restarts", "1"])
    local_cli.job_file_flags(args)
    assert (args.checkpoint_every, args.keep_checkpoints, args.max_restarts) == (4, 3, 1)
