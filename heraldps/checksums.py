"""File checksums shared by PS snapshots and exported models."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks (hashlib releases the GIL on large ones)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
