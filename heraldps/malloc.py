"""Give the memory of big calls back to the system (glibc), so a burst does not stay.

A 64 MB request passes through gRPC's receive buffers, the parsed message and
NumPy arrays; glibc keeps freed chunks in per-thread arenas, so after 16 such
calls at once a shard stayed at ~2.9 GB resident. Two measures, both measured
in docs/figures.md: fewer arenas (``MALLOC_ARENA_MAX``, set for the servers by
``heraldps.serving`` before threads start, unless the environment sets it) and
``malloc_trim`` shortly after a big call ends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

BIG_CALL_BYTES = 8 * 2**20  # calls moving at least this much schedule a trim
TRIM_DELAY_SECONDS = 0.2  # after the call: gRPC frees its send buffers once the answer left
M_ARENA_MAX = -8  # mallopt parameter number (malloc.h)
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None  # not glibc (musl, macOS): nothing to do
    return libc


_LIBC = _libc()


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``); True if it took effect."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_ARENA_MAX, arenas))


class Trimmer:
    """Calls ``malloc_trim(0)`` once, a moment after one or more big calls ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = False

    def after_call(self, nbytes: int) -> None:
        if _LIBC is None or nbytes < BIG_CALL_BYTES:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
        timer = threading.Timer(TRIM_DELAY_SECONDS, self._trim)
        timer.daemon = True
        timer.start()

    def _trim(self) -> None:
        with self._lock:
            self._pending = False
        assert _LIBC is not None
        _LIBC.malloc_trim(0)  # ctypes releases the GIL for the call
