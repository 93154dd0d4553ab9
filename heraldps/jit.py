"""Compiled kernels: numba's ``njit``, with its on-disk cache outside the installed package.

Left alone, numba caches compiled code in a ``__pycache__`` folder beside each
source file, i.e. inside ``site-packages/heraldps``. A later ``pip install -e``
removes the package but not those files, and the orphaned folder then shadows
the real package (``cannot import name '__version__' from 'heraldps'``).
So heraldps points numba's cache at ``NUMBA_CACHE_DIR`` when the user set it,
else at ``$XDG_CACHE_HOME/heraldps/numba`` (``~/.cache/heraldps/numba``), else
at a per-user folder under the temporary directory: the first of these that is
writable; if none is, kernels compile at every start instead of being cached.

A cold cache costs each process kind 10-13 s of compiling at its first use.
``heraldps warmup`` compiles every kernel ahead of time; the container image runs
it at build time into a read-only folder named by ``HERALDPS_KERNEL_SEED``, whose
files this module copies into the (writable) cache at import, so a new container
loads its kernels instead of compiling them (docs/deployment.md#compiled-kernels).
Numba keys each compiled kernel by the CPU it was compiled for; the image compiles
for ``NUMBA_CPU_NAME=generic`` so its kernels load on any x86-64 node. An empty
``NUMBA_CPU_NAME`` means this machine's own CPU (numba alone would read it as a
nameless CPU with this machine's features).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import suppress
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
    """Where compiled kernels are cached (None: nowhere writable, no caching). A
    ``NUMBA_CACHE_DIR`` that cannot be written (a read-only root file system without a
    writable /tmp) is passed over with a warning: numba would refuse to compile at all."""
    wanted = os.environ.get("NUMBA_CACHE_DIR")
    candidates = [Path(wanted)] if wanted else []
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        candidates.append(Path(base) / "heraldps" / "numba")
    except (KeyError, RuntimeError):  # no home directory (e.g. a uid without a passwd entry)
        pass
    with suppress(OSError):  # no usable temporary directory at all
        candidates.append(Path(tempfile.gettempdir()) / f"heraldps-numba-{os.getuid()}")
    found = next((str(c) for c in candidates if _writable(c)), None)
    if wanted and found != wanted:
        instead = f"compiled kernels go to {found}" if found else "kernels compile at every start"
        logging.getLogger(__name__).warning(
            "NUMBA_CACHE_DIR=%s is not writable: %s", wanted, instead
        )
    return found


SEED_ENV = "HERALDPS_KERNEL_SEED"


def seed_cache(cache: Path, seed: Path) -> int:
    """Copy every compiled kernel of ``seed`` (a cache ``heraldps warmup`` filled; it may
    be read-only) that ``cache`` does not have into ``cache``. Returns the number of files
    copied. Files already in ``cache`` are kept: numba rewrites an index when it compiles
    something new (another CPU), and that index knows more than the seed's. Each file is
    copied to a temporary name and linked into place, so processes starting at once never
    see half a file; data files go first, so no index names a file not there yet."""
    copied = 0
    for folder in sorted(p for p in seed.iterdir() if p.is_dir()):
        target = cache / folder.name
        files = sorted(folder.iterdir(), key=lambda f: (f.suffix == ".nbi", f.name))
        for source in files:
            dest = target / source.name
            if source.suffix not in (".nbi", ".nbc") or dest.exists():
                continue
            target.mkdir(parents=True, exist_ok=True)
            temporary = target / f".{source.name}.{os.getpid()}.seed"
            shutil.copyfile(source, temporary)
            try:
                os.link(temporary, dest)
                copied += 1
            except FileExistsError:  # another process was quicker
                pass
            except OSError:  # a file system without hard links
                if not dest.exists():
                    os.replace(temporary, dest)
                    copied += 1
            finally:
                temporary.unlink(missing_ok=True)
    return copied


def _seed_from_environment(cache: str) -> None:
    seed = os.environ.get(SEED_ENV)
    if not seed or not Path(seed).is_dir() or Path(seed).resolve() == Path(cache).resolve():
        return
    with suppress(OSError):  # a cache that cannot take it compiles at first use, as unseeded
        seed_cache(Path(cache), Path(seed))


def _cache_typed_list() -> None:
    """Numba compiles the helpers behind its typed ``List`` (``numba.typed.typedlist``: make,
    append, get and set an item...) in every process that uses a ``List`` from Python, and
    never caches them: 0.6 s of CPU at each scheduler start (its cache mirror keeps one).
    Numba's cache takes them like any kernel."""
    from numba.core.registry import CPUDispatcher
    from numba.typed import typedlist

    for helper in vars(typedlist).values():
        if isinstance(helper, CPUDispatcher):
            helper.enable_caching()


_config: Any = numba.config
if os.environ.get("NUMBA_CPU_NAME") == "":  # empty: this machine's CPU, by name
    _config.CPU_NAME = None
    _config.CPU_FEATURES = None
CACHE_DIR = cache_dir()
if CACHE_DIR is not None:
    _config.CACHE_DIR = CACHE_DIR
    _seed_from_environment(CACHE_DIR)
    _cache_typed_list()


def njit(**options: Any) -> _JITWrapper:
    """``numba.njit`` with caching on (in :data:`CACHE_DIR`) whenever a cache is writable."""
    wrapper: _JITWrapper = numba.njit(cache=CACHE_DIR is not None, **options)
    return wrapper
