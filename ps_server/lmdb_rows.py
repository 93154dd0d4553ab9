"""Rows of one table in an LMDB named database, read and written a whole batch at a time.

Layout (one LMDB entry per row):

- key: the int64 key's two's-complement bits as a **big-endian** uint64, so
  LMDB's byte order is numeric order and a sorted batch of keys reads
  neighbouring pages in sequence;
- value: ``version`` int64 LE, ``changed`` int64 LE (iteration of the last
  change, -1 never), ``values`` float32 LE ``[dim]``, ``state`` float32 LE
  ``[state_width]``: ``16 + 4 (dim + state_width)`` bytes.

Batches cross the Python/LMDB boundary as lists of ``bytes`` built and taken
apart by NumPy (``view('V<n>').tolist()`` and ``b"".join``), and py-lmdb's
``getmulti``/``putmulti`` loop in C: no per-key Python code on a request path.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ps_server.kernels import copy_rows

KEY_DTYPE = np.dtype(">u8")
_PUT_CHUNK = 262_144


@dataclass(frozen=True)
class RowArrays:
    """Rows read from disk: ``found[i]`` says whether ``keys[i]`` had an entry."""

    found: npt.NDArray[np.bool_]
    versions: npt.NDArray[np.int64]
    changed: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]


def encode_keys(keys: npt.NDArray[np.int64]) -> list[bytes]:
    return list(keys.view(np.uint64).astype(KEY_DTYPE).view("V8").tolist())


def sort_for_disk(keys: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Order of ``keys`` in which LMDB stores them (unsigned numeric order)."""
    return np.argsort(keys.view(np.uint64), kind="stable")


class LmdbRows:
    """One table's named database inside a shard's LMDB environment."""

    def __init__(self, env: Any, name: str, dim: int, state_width: int, txn: Any = None) -> None:
        """``txn``: a write transaction to create the database in (it then exists only if
        that transaction commits); None creates it at once."""
        self.env = env
        self.db = env.open_db(f"table:{name}".encode(), txn=txn)
        self.dim = dim
        self.state_width = state_width
        self.row_bytes = 16 + 4 * (dim + state_width)

    def count(self, txn: Any) -> int:
        return int(txn.stat(self.db)["entries"])

    def _record(self) -> np.dtype:
        """The on-disk value as a structured dtype: fields decode as views, no copies."""
        fields = [
            ("version", "<i8"),
            ("changed", "<i8"),
            ("values", "<f4", (self.dim,)),
            ("state", "<f4", (self.state_width,)),
        ]
        return np.dtype(fields)

    def get(self, txn: Any, keys: npt.NDArray[np.int64]) -> RowArrays:
        """Rows of distinct ``keys`` (any order) inside read or write transaction ``txn``."""
        n = keys.shape[0]
        order = sort_for_disk(keys)
        found_items = txn.cursor(self.db).getmulti(encode_keys(keys[order]))
        got = len(found_items)
        found = np.zeros(n, dtype=bool)
        versions = np.zeros(n, dtype=np.int64)
        changed = np.full(n, -1, dtype=np.int64)
        values = np.zeros((n, self.dim), dtype=np.float32)
        state = np.zeros((n, self.state_width), dtype=np.float32)
        if got:
            raw_rows = b"".join(map(operator.itemgetter(1), found_items))
            if got == n:  # every key present: answers come in sorted-request order
                where = order
            else:  # getmulti skips absent keys: match the keys it returned
                raw_keys = b"".join(map(operator.itemgetter(0), found_items))
                got_keys = np.frombuffer(raw_keys, dtype=KEY_DTYPE).astype(np.uint64)
                sorted_keys = keys[order].view(np.uint64)
                where = order[np.searchsorted(sorted_keys, got_keys)]
            record = np.frombuffer(raw_rows, dtype=self._record())
            found[where] = True
            versions[where] = record["version"]
            changed[where] = record["changed"]
            if got == 1:  # numpy calls a one-row field view C-contiguous: a kernel signature
                values[where], state[where] = record["values"], record["state"]  # of its own
            else:
                source = np.arange(got, dtype=np.int64)
                copy_rows(values, where, record["values"], source)
                if self.state_width:
                    copy_rows(state, where, record["state"], source)
        return RowArrays(found, versions, changed, values, state)

    def put(
        self,
        txn: Any,
        keys: npt.NDArray[np.int64],
        versions: npt.NDArray[np.int64],
        changed: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
    ) -> None:
        """Insert or replace rows of distinct ``keys`` inside write transaction ``txn``."""
        order = sort_for_disk(keys)
        cursor = txn.cursor(self.db)
        for start in range(0, keys.shape[0], _PUT_CHUNK):  # bounded temporary memory
            part = order[start : start + _PUT_CHUNK]
            self._put_sorted(cursor, keys[part], versions[part], changed[part], values[part],
                             state[part])  # fmt: skip

    def _put_sorted(
        self,
        cursor: Any,
        keys: npt.NDArray[np.int64],
        versions: npt.NDArray[np.int64],
        changed: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
    ) -> None:
        """One chunk, keys already in disk order."""
        record = np.empty(keys.shape[0], dtype=self._record())
        record["version"], record["changed"] = versions, changed
        record["values"], record["state"] = values, state
        rows = record.view(f"V{self.row_bytes}").tolist()
        cursor.putmulti(zip(encode_keys(keys), rows, strict=True))

    def scan(self, txn: Any) -> tuple[npt.NDArray[np.int64], RowArrays]:
        """Every row, in disk order."""
        raw_keys = b"".join(txn.cursor(self.db).iternext(keys=True, values=False))
        raw_rows = b"".join(txn.cursor(self.db).iternext(keys=False, values=True))
        keys = np.frombuffer(raw_keys, dtype=KEY_DTYPE).astype(np.uint64).view(np.int64)
        record = np.frombuffer(raw_rows, dtype=self._record())
        return keys, RowArrays(
            found=np.ones(keys.shape[0], dtype=bool),
            versions=record["version"].astype(np.int64),
            changed=record["changed"].astype(np.int64),
            values=np.ascontiguousarray(record["values"], dtype=np.float32),
            state=np.ascontiguousarray(record["state"], dtype=np.float32),
        )

    def clear(self, txn: Any) -> None:
        txn.drop(self.db, delete=False)
