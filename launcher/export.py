"""Where an exported model comes from: live shards, or a checkpoint on disk.

Both give the same directory (``heraldps.model_export``): the embedding rows training
touched, the dense vector, the job. From live shards the rows come through
``ExportIncremental`` (every row, those with version 0 dropped block by block) and the dense
vector through a pull; from a checkpoint, the shards' snapshot files are read and
verified as a shard's Load verifies them (``ps_server.snapshot``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from heraldps import checkpoints
from heraldps.client import PSClient
from heraldps.client.snapshots import ExportedRows
from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.job import DENSE_TABLE, EMBEDDING_TABLE, TrainingJob
from heraldps.model_export import ExportedModel, touched, write_model
from ps_server.snapshot import read_for_shard


def export_from_ps(job: TrainingJob, ps: PSClient, out: Path, source: dict[str, Any]) -> Path:
    """Write the model the shards behind ``ps`` hold now to the new directory ``out``."""
    blocks = [rows for name, rows in ps.export_blocks(-1, EMBEDDING_TABLE, keep=_trained)
              if name == EMBEDDING_TABLE]  # fmt: skip
    if not blocks:
        raise FailedPrecondition(f"the shards hold no {EMBEDDING_TABLE!r} table: nothing trained")
    keys, values, versions = (np.concatenate([getattr(b, f) for b in blocks])
                              for f in ("keys", "values", "versions"))  # fmt: skip
    del blocks
    table = touched(EMBEDDING_TABLE, keys, values, versions, job.make_initializer())
    dense = ps.pull_dense(job.dense_parameter(job.model().dense_size))
    model = ExportedModel(job.to_json(), {EMBEDDING_TABLE: table}, dense, source)
    return write_model(out, model)


def _trained(rows: ExportedRows) -> ExportedRows:
    """A block's trained rows (version > 0, see ``touched``), values only: an export of a
    large table holds the rows it writes, not every row's optimizer state and bytes."""
    keep = rows.versions > 0
    empty = np.zeros((int(keep.sum()), 0), np.float32)
    return ExportedRows(rows.keys[keep], rows.values[keep], empty, rows.versions[keep],
                        rows.changed_iterations[keep])  # fmt: skip


def export_from_checkpoint(job: TrainingJob, checkpoint: Path, out: Path) -> Path:
    """Write the model of ``checkpoint`` (a ``ckpt-*`` folder, a checkpoint directory: its
    newest complete checkpoint, or a snapshot a PS ``Save`` wrote) to ``out``. The job must
    be the one that wrote a checkpoint (its manifest's fingerprint, when it records one)."""
    if any(checkpoint.glob("shard-*-of-*")) and not (checkpoint / checkpoints.MANIFEST).exists():
        path = checkpoint  # a plain Save
        source: dict[str, Any] = {"snapshot": str(checkpoint)}
    else:
        found = checkpoints.resolve(checkpoint)
        if found is None:
            raise InvalidArgument(
                f"--checkpoint {checkpoint}: no complete checkpoint there (a ckpt-* folder with "
                "a manifest.json, the directory holding them, or a snapshot of shard-* folders)"
            )
        path, manifest = found
        if manifest.fingerprint and manifest.fingerprint != checkpoints.fingerprint(
            job.to_json(), manifest.mode
        ):
            raise FailedPrecondition(
                f"{path} was written by another job (fingerprint {manifest.fingerprint}); pass "
                "the job.json of the run that wrote it (heraldps local keeps it in WORKDIR/MODE)"
            )
        source = {"checkpoint": str(path), "iteration": manifest.iteration, "mode": manifest.mode}
    committed, tables = read_for_shard(path, 0, 1)
    by_name = {spec.name: block for spec, block in tables}
    missing = [name for name in (EMBEDDING_TABLE, DENSE_TABLE) if name not in by_name]
    if missing:
        raise FailedPrecondition(f"{path} holds no {' or '.join(map(repr, missing))} table")
    emb = by_name[EMBEDDING_TABLE]
    table = touched(EMBEDDING_TABLE, emb.keys, emb.values, emb.versions, job.make_initializer())
    dense_param = job.dense_parameter(job.model().dense_size)
    block = by_name[DENSE_TABLE]
    order = np.argsort(block.keys)
    if not np.array_equal(block.keys[order], dense_param.keys):
        raise FailedPrecondition(
            f"{path}: the {DENSE_TABLE!r} table has rows {block.keys.shape[0]}, the job's model "
            f"needs rows 0..{dense_param.rows - 1}; pass the job that wrote the checkpoint"
        )
    dense = dense_param.from_rows(block.values[order])
    source.setdefault("iteration", committed)
    return write_model(out, ExportedModel(job.to_json(), {EMBEDDING_TABLE: table}, dense, source))
