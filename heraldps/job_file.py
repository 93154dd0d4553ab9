"""The job file: one YAML (or JSON) description of a training run, read by ``heraldps
train``, ``heraldps feed`` (and so by compose and Kubernetes) and the workers alike.

Sections and keys are documented in docs/training.md. This module is the one place
that maps the file onto :class:`~heraldps.job.TrainingJob`, so every process that reads
the same file trains the same model. Unknown sections and keys are refused with the
valid ones listed; relative data paths are relative to the job file's directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob
from heraldps.modes import check_look_ahead, check_prefetch_plans, early_write_back_setting

SECTIONS: dict[str, tuple[str, ...]] = {
    "data": (
        "train", "valid", "test", "valid_fraction", "test_fraction", "format",
        "label_column", "sparse_columns", "dense_columns", "dense_transforms",
    ),
    "model": ("embedding_dim", "hidden_layers", "activation", "dropout", "batch_norm"),
    "optimizer": ("name", "lr", "embedding_l2", "weight_decay"),
    "schedule": (
        "max_epochs", "monitor", "patience", "lr_decay", "lr_patience", "seed", "shuffle",
        "shuffle_buffer_rows", "eval_every", "checkpoint_every", "checkpoint_epochs",
        "keep_checkpoints",
    ),
    "cluster": (
        "mode", "workers", "batch_size_per_worker", "shards", "store", "cache_gb",
        "cache_fraction", "staleness", "policy", "device", "dense_sync", "max_restarts",
        "early_write_back", "look_ahead", "prefetch_plans",
    ),
    "output": ("dir",),
}  # fmt: skip
"""Every section of a job file and its keys."""

MONITORS = ("auc", "logloss")


@dataclass(frozen=True)
class Splits:
    """Where the train, validation and test rows come from: files, or fractions of the
    train file (the last ``valid_fraction + test_fraction`` of its rows, after a shuffle by
    the job's seed)."""

    train: str
    valid: str | None = None
    test: str | None = None
    valid_fraction: float = 0.0
    test_fraction: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """The epoch loop of ``heraldps train``."""

    max_epochs: int = 10
    monitor: str = "auc"  # the validation metric that picks the best epoch
    patience: int = 2  # epochs without improvement before training stops
    lr_decay: float = 1.0  # lr x this after ``lr_patience`` epochs without improvement
    lr_patience: int = 1
    seed: int = 0
    shuffle: bool = True  # a new order of the training rows every epoch (by seed, epoch)
    # 0: the shuffle permutes the whole training split in memory; N > 0: it streams the
    # split through a two-pass bucket shuffle holding at most N rows (heraldps.data.shuffle)
    shuffle_buffer_rows: int = 0
    eval_every: int = 0  # also validate every this many iterations within an epoch (0: off)
    checkpoint_every: int = 0  # a checkpoint every this many iterations (0: off)
    checkpoint_epochs: bool = True  # a checkpoint at every epoch's end
    keep_checkpoints: int = 2  # the newest this many are kept

    @property
    def checkpoints(self) -> bool:
        """Whether the run writes checkpoints at all."""
        return bool(self.checkpoint_every or self.checkpoint_epochs)


@dataclass(frozen=True)
class Cluster:
    """The local cluster ``heraldps train`` starts (workers and batch are in the job)."""

    mode: str = "herald"
    shards: int = 2
    store: str = "staged"
    cache_gb: float = 1.0
    cache_fraction: float = 0.1  # cache rows per worker: this share of distinct train keys
    max_restarts: int = 0  # a process that dies: restart from the newest checkpoint this often


@dataclass(frozen=True)
class JobFile:
    """A job file, read and checked: the job every process runs, and the run around it."""

    path: Path | None
    settings: dict[str, dict[str, Any]]  # as read, with flags applied (shown at start)
    job: TrainingJob
    splits: Splits
    schedule: Schedule
    cluster: Cluster
    output: str | None


def read(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a JSON or YAML file (JSON first: a ``job.json`` may hold NaN,
    which YAML reads as a string)."""
    import json

    import yaml

    where = Path(path)
    try:
        text = where.read_text()
    except FileNotFoundError:  # an OSError, as reading a job.json always raised
        raise FileNotFoundError(f"job file {where}: no such file") from None
    try:
        raw = json.loads(text)
    except ValueError:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidArgument(f"job file {where}: not valid YAML or JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise InvalidArgument(f"job file {where}: must be a mapping of sections")
    return raw


def is_job_file(raw: dict[str, Any]) -> bool:
    """A sectioned job file (``data:`` is a mapping), not a flat ``job.json``."""
    return isinstance(raw.get("data"), dict)


def check_keys(raw: dict[str, Any], where: str = "job file") -> None:
    """Refuse unknown sections and keys, naming the valid ones."""
    for section, body in raw.items():
        if section not in SECTIONS:
            raise InvalidArgument(
                f"{where}: unknown section {section!r}; the sections are: {', '.join(SECTIONS)}"
            )
        if not isinstance(body, dict):
            raise InvalidArgument(f"{where}: section {section!r} must be a mapping of keys")
        for key in body:
            if key not in SECTIONS[section]:
                raise InvalidArgument(
                    f"{where}: unknown key {section}.{key}; the keys of {section!r} are: "
                    f"{', '.join(SECTIONS[section])}"
                )


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``{"section.key": value}`` set (flags win over the file; None: unset)."""
    out = {section: dict(body) for section, body in raw.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        out.setdefault(section, {})[key] = value
    return out


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> JobFile:
    """The job file at ``path``, with ``overrides`` (``"section.key": value``) applied."""
    raw = read(path)
    return from_dict(with_overrides(raw, overrides or {}), Path(path))


def _path(value: Any, base: Path | None) -> str | None:
    """A data path: ``bundled:...`` and absolute paths as given, others relative to the
    job file's directory."""
    if value is None:
        return None
    text = str(value)
    if text.startswith("bundled:") or base is None or Path(text).is_absolute():
        return text
    return str((base.parent / text).resolve())


def _columns(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(c for c in value.split(",") if c)
    return tuple(str(c) for c in value)


def _fraction(name: str, value: Any) -> float:
    share = float(value or 0.0)
    if not (math.isfinite(share) and 0 <= share < 1):
        raise InvalidArgument(f"data.{name} must be in [0, 1), got {value}")
    return share


def from_dict(raw: dict[str, Any], path: Path | None = None) -> JobFile:
    """Check ``raw`` and map it onto the job and the run's settings."""
    where = f"job file {path}" if path else "job file"
    check_keys(raw, where)
    data, model = raw.get("data", {}), raw.get("model", {})
    opt, sched = raw.get("optimizer", {}), raw.get("schedule", {})
    cl, out = raw.get("cluster", {}), raw.get("output", {})
    if "train" not in data:
        raise InvalidArgument(f"{where}: data.train is required (a file, or bundled:NAME)")
    splits = Splits(
        train=str(_path(data["train"], path)),
        valid=_path(data.get("valid"), path),
        test=_path(data.get("test"), path),
        valid_fraction=_fraction("valid_fraction", data.get("valid_fraction")),
        test_fraction=_fraction("test_fraction", data.get("test_fraction")),
    )
    if (splits.valid and splits.valid_fraction) or (splits.test and splits.test_fraction):
        raise InvalidArgument(f"{where}: give data.valid or data.valid_fraction (data.test or "
                              "data.test_fraction), not both")  # fmt: skip
    if splits.valid_fraction + splits.test_fraction >= 1:
        raise InvalidArgument(f"{where}: data.valid_fraction + data.test_fraction must be < 1")
    schedule = Schedule(**{k: v for k, v in sched.items()})
    if schedule.monitor not in MONITORS:
        raise InvalidArgument(f"schedule.monitor must be one of {', '.join(MONITORS)}")
    if schedule.max_epochs < 1 or schedule.patience < 1 or schedule.lr_patience < 1:
        raise InvalidArgument("schedule.max_epochs, patience and lr_patience must be >= 1")
    buffer = schedule.shuffle_buffer_rows
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        raise InvalidArgument(f"schedule.shuffle_buffer_rows must be a whole number of rows "
                              f">= 0 (0: the whole training split in memory), got "
                              f"{buffer!r}")  # fmt: skip
    if not isinstance(schedule.shuffle, bool):
        raise InvalidArgument(f"schedule.shuffle must be true or false, got {schedule.shuffle!r}")
    if schedule.eval_every < 0 or schedule.checkpoint_every < 0:
        raise InvalidArgument("schedule.eval_every and checkpoint_every must be >= 0 "
                              "iterations (0: off)")  # fmt: skip
    if schedule.keep_checkpoints < 1:
        raise InvalidArgument("schedule.keep_checkpoints must be >= 1")
    if not 0 < schedule.lr_decay <= 1:
        raise InvalidArgument(f"schedule.lr_decay must be in (0, 1] (1: off), got "
                              f"{schedule.lr_decay}")  # fmt: skip
    own = ("mode", "shards", "store", "cache_gb", "cache_fraction", "max_restarts")
    cluster = Cluster(**{k: cl[k] for k in own if k in cl})
    if cluster.max_restarts < 0:
        raise InvalidArgument("cluster.max_restarts must be >= 0")
    from heraldps.modes import mode_named

    mode_named(cluster.mode)  # a known mode, or the error listing them
    params: dict[str, Any] = {
        "data": splits.train,
        "format": data.get("format", "csv"),
        "sparse_columns": _columns(data.get("sparse_columns")),
        "label_column": data.get("label_column"),
        "dense_columns": _columns(data.get("dense_columns")),
        "dense_transforms": _columns(data.get("dense_transforms")),
        "epochs": schedule.max_epochs,
        "seed": schedule.seed,
        "optimizer": opt.get("name", "adam"),
        "lr": opt.get("lr"),
        "embedding_l2": float(opt.get("embedding_l2", 0.0)),
        "weight_decay": float(opt.get("weight_decay", 0.0)),
    }
    for key in ("embedding_dim", "activation", "dropout"):
        if key in model:
            params[key] = model[key]
    if "hidden_layers" in model:
        params["hidden"] = tuple(int(w) for w in (model["hidden_layers"] or ()))
    for key in ("workers", "batch_size_per_worker", "staleness", "policy", "device",
                "dense_sync"):  # fmt: skip
        if key in cl:
            params[key] = cl[key]
    if "batch_norm" in model:
        params["batch_norm"] = bool(model["batch_norm"])
    if "early_write_back" in cl:
        params["early_write_back"] = early_write_back_setting(
            cl["early_write_back"], "cluster.early_write_back"
        )
    if "look_ahead" in cl:
        params["look_ahead"] = check_look_ahead(cl["look_ahead"], "cluster.look_ahead")
    if "prefetch_plans" in cl:
        params["prefetch_plans"] = check_prefetch_plans(
            cl["prefetch_plans"], "cluster.prefetch_plans"
        )
    job = TrainingJob(**params)
    output = out.get("dir")
    if output is not None:
        output = str(_path(output, path))
    return JobFile(path, raw, job, splits, schedule, cluster, output)


@dataclass(frozen=True)
class RowSplit:
    """Where the fractions of ``data.train`` fall: rows ``[0, train)`` train, then
    ``valid`` rows of validation, then ``test`` rows of test."""

    total: int
    train: int
    valid: int
    test: int


def row_split(jf: JobFile) -> RowSplit | None:
    """The row ranges ``valid_fraction`` and ``test_fraction`` hold out of ``data.train``
    (its last rows, in file order), counted by parsing the file; None without fractions."""
    s = jf.splits
    if not (s.valid_fraction or s.test_fraction):
        return None
    from heraldps.data import count_rows

    total = count_rows(jf.job.data_spec())
    valid, test = int(total * s.valid_fraction), int(total * s.test_fraction)
    return RowSplit(total, total - valid - test, valid, test)


def training_split(jf: JobFile) -> TrainingJob:
    """The job training only the train split: with fractions, the rows before the held-out
    ones (``max_rows``), so ``heraldps train`` and ``heraldps feed`` train the same rows."""
    split = row_split(jf)
    if split is None:
        return jf.job
    from dataclasses import replace

    return replace(jf.job, max_rows=split.train)


def training_job(path: str | Path) -> TrainingJob:
    """The job of a job file, or of a flat ``job.json`` (what ``heraldps local`` and
    ``heraldps train`` write): what ``heraldps feed`` and the workers run."""
    raw = read(path)
    if is_job_file(raw):
        return from_dict(raw, Path(path)).job
    return TrainingJob.from_json(Path(path).read_text())
