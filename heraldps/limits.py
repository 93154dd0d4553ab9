"""Limits every process agrees on (clients check them before sending, shards again):
numbers, and the length of names and paths in requests.

A row's version is HET's clock: +1 per applied update, or any larger number a
write-back stores. Versions and iterations are int64 on the wire and on disk;
capping them far below 2**63 means no sum or increment can ever wrap to a
negative number, whatever a caller sends.
"""

from __future__ import annotations

import os

import numpy as np

from heraldps.errors import InvalidArgument, shown

# Largest version a write-back may store or a snapshot may hold. A commit adds 1 to a
# version, so 2**62 leaves 2**62 commits of room before int64 could wrap.
MAX_VERSION = 2**62

# Largest iteration a push, a commit or a snapshot may name (same reasoning).
MAX_ITERATION = 2**62

# The largest finite float32: a row value or optimizer state must stay within it.
FLOAT32_MAX = float(np.finfo(np.float32).max)

# Longest table name (UTF-8 bytes) any request may carry; CreateTable allows 128 characters
# of [A-Za-z0-9_.-] (heraldps.spec), so a longer name names no table.
MAX_NAME_BYTES = 256

# Longest Save/Load path (UTF-8 bytes): Linux's PATH_MAX.
MAX_PATH_BYTES = 4096


def check_name(name: object, what: str = "table") -> str:
    """``name`` when it is a string of at most ``MAX_NAME_BYTES``; InvalidArgument otherwise
    (the message shows a shortened copy, never the whole input)."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} name must be a string, got {type(name).__name__}")
    size = _utf8_size(name, what)
    if size > MAX_NAME_BYTES:
        raise InvalidArgument(
            f"{what} name {shown(name)} is {size} bytes, over the limit of {MAX_NAME_BYTES}; "
            "table names are 1-128 characters from [A-Za-z0-9_.-]"
        )
    return name


def check_path(path: object, what: str) -> str:
    """``path`` (a string or ``os.PathLike``) as a string: not empty, no NUL byte, at most
    ``MAX_PATH_BYTES``; InvalidArgument naming ``what`` otherwise."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidArgument(f"{what}: path must be a string, got {type(path).__name__}")
    if not path:
        raise InvalidArgument(f"{what}: path is empty; pass a directory")
    if "\0" in path:
        raise InvalidArgument(
            f"{what}: path {shown(path)} holds a NUL byte, which no file name may; "
            "pass a plain directory path"
        )
    size = _utf8_size(path, what)
    if size > MAX_PATH_BYTES:
        raise InvalidArgument(
            f"{what}: path {shown(path)} is {size} bytes, over the limit of {MAX_PATH_BYTES}"
        )
    return path


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what}: {shown(text)} is not valid Unicode text") from None
