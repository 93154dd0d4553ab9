"""Give the memory of big calls back to the system (glibc), so a burst does not stay.

A 64 MB request passes through gRPC's receive buffers, the parsed message and
NumPy arrays; glibc keeps freed chunks in per-thread arenas, so after 16 such
calls at once a shard stayed at ~2.9 GB resident. Two measures, both measured
in docs/figures.md: fewer arenas (``MALLOC_ARENA_MAX``, set for the servers by
``heraldps.serving`` before threads start, unless the environment sets it) and
a cycle collection and ``malloc_trim`` once big calls have stopped for a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time

log = logging.getLogger(__name__)

BIG_CALL_BYTES = 8 * 2**20  # calls moving at least this much schedule a trim
QUIET_SECONDS = 1.0  # trim once no big call has ended for this long
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
    """Calls ``malloc_trim(0)`` once big calls have stopped for ``QUIET_SECONDS``.

    Not after each one: ``heraldps.runtime`` keeps freed heap memory for the next
    big message on purpose (page faults made large messages ~3x slower), so a
    steady stream of big calls keeps its memory, and a burst gives it back once over.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = False
        self._last_big = 0.0

    def after_call(self, nbytes: int) -> None:
        if _LIBC is None or nbytes < BIG_CALL_BYTES:
            return
        with self._lock:
            self._last_big = time.monotonic()
            if self._pending:
                return
            self._pending = True
        self._arm(QUIET_SECONDS)

    def _arm(self, delay: float) -> None:
        timer = threading.Timer(delay, self._trim)
        timer.daemon = True
        timer.start()

    def _trim(self) -> None:
        with self._lock:
            wait = self._last_big + QUIET_SECONDS - time.monotonic()
            if wait > 0:  # big calls still coming: look again later
                self._arm(wait)
                return
            self._pending = False
        # A failed call's traceback and its frames form a cycle that holds the request
        # (tens of MB) until the cyclic collector runs: run it first, once per burst.
        gc.collect()
        assert _LIBC is not None
        _LIBC.malloc_trim(0)  # ctypes releases the GIL for the call
