"""Compiled kernels: numba's ``njit``, with its on-disk cache outside the installed package.

Left alone, numba caches compiled code in a ``__pycache__`` folder beside each
source file, i.e. inside ``site-packages/heraldps``. A later ``pip install -e``
removes the package but not those files, and the orphaned folder then shadows
the real package (``cannot import name '__version__' from 'heraldps'``).
So heraldps points numba's cache at ``NUMBA_CACHE_DIR`` when the user set it,
else at ``$XDG_CACHE_HOME/heraldps/numba`` (``~/.cache/heraldps/numba``), else
at a per-user folder under the temporary directory; if none is writable,
kernels compile at every start instead of being cached.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numba

if TYPE_CHECKING:
    from numba.core.decorators import _JITWrapper


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def cache_dir() -> str | None:
    """Where compiled kernels are cached (None: nowhere writable, no caching)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    candidates = []
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        candidates.append(Path(base) / "heraldps" / "numba")
    except (KeyError, RuntimeError):  # no home directory (e.g. a uid without a passwd entry)
        pass
    candidates.append(Path(tempfile.gettempdir()) / f"heraldps-numba-{os.getuid()}")
    return next((str(c) for c in candidates if _writable(c)), None)


CACHE_DIR = cache_dir()
if CACHE_DIR is not None:
    _config: Any = numba.config
    _config.CACHE_DIR = CACHE_DIR


def njit(**options: Any) -> _JITWrapper:
    """``numba.njit`` with caching on (in :data:`CACHE_DIR`) whenever a cache is writable."""
    wrapper: _JITWrapper = numba.njit(cache=CACHE_DIR is not None, **options)
    return wrapper
