"""Training samples on the wire (``heraldps.v1.SampleBlock``) and back.

The data feeder is the only reader of the data: it submits whole samples with
each batch, and the scheduler hands every worker its samples inside its plan.
Decoding checks every size, range and value, so a malformed block is an
``InvalidArgument`` naming the field, never a wrong model.
"""

from __future__ import annotations

import numpy as np

from heraldps import wire
from heraldps.data.dataset import SparseDataset
from heraldps.errors import InvalidArgument
from heraldps.v1 import types_pb2

_INT32 = np.dtype("<i4")


def encode_samples(samples: SparseDataset) -> types_pb2.SampleBlock:
    """The block of ``samples`` (which must record each key's field)."""
    if samples.fields is None:
        raise InvalidArgument(
            "the samples do not record each key's field; read them with "
            "heraldps.data (stream or read_all)"
        )
    return types_pb2.SampleBlock(
        sparse_columns=samples.sparse_columns,
        dense_columns=samples.dense_columns,
        offsets=wire.encode_keys(samples.offsets),
        keys=wire.encode_keys(samples.keys),
        fields=np.ascontiguousarray(samples.fields, dtype=_INT32).tobytes(),
        labels=wire.encode_floats(samples.labels),
        dense=wire.encode_floats(samples.dense),
    )


def decode_samples(block: types_pb2.SampleBlock, what: str = "samples") -> SparseDataset:
    """The dataset a block carries; ``InvalidArgument`` (naming ``what``) if malformed."""
    offsets = wire.decode_keys(block.offsets, f"{what}.offsets")
    keys = wire.decode_keys(block.keys, f"{what}.keys")
    if offsets.shape[0] < 1:
        raise InvalidArgument(f"{what}.offsets: needs samples + 1 entries, got none")
    rows = offsets.shape[0] - 1
    if len(block.fields) != 4 * keys.shape[0]:
        raise InvalidArgument(
            f"{what}.fields: expected one little-endian int32 per key ({4 * keys.shape[0]} "
            f"bytes), got {len(block.fields)} bytes"
        )
    fields = np.frombuffer(block.fields, dtype=_INT32).astype(np.int32, copy=False)
    width = len(block.sparse_columns)
    if fields.shape[0] and (fields.min() < 0 or fields.max() >= width):
        raise InvalidArgument(
            f"{what}.fields: every field must be in 0..{width - 1} (one per sparse column), "
            f"got {int(fields.min())}..{int(fields.max())}"
        )
    labels = wire.decode_rows(block.labels, rows, 1, f"{what}.labels").reshape(rows)
    dense = wire.decode_rows(block.dense, rows, len(block.dense_columns), f"{what}.dense")
    try:
        return SparseDataset(
            offsets=offsets,
            keys=keys,
            labels=labels,
            dense=dense,
            sparse_columns=tuple(block.sparse_columns),
            dense_columns=tuple(block.dense_columns),
            fields=fields,
        )
    except ValueError as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
