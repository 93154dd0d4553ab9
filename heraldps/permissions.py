"""Secret files (role tokens, TLS private keys) that other users could read.

Checked once when a process starts (``check_private``): a file another user could
read or change is named in one warning line that says ``chmod 600``, or, with
``--strict-permissions`` (``HERALDPS_STRICT_PERMISSIONS``), the process refuses to
start. "Another user" means: any access for others, or group access when the file's
group is not the process's own primary group. A Kubernetes Secret volume (root-owned,
mode 0440, group = the pod's ``runAsGroup``/``fsGroup``) and a user-private group on
a host therefore pass; a group shared with other users does not. See docs/security.md.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterable

log = logging.getLogger(__name__)

_warned: set[str] = set()  # a file named by both a server's and a client's flag: one line
_lock = threading.Lock()


def too_open(path: str) -> int | None:
    """The file's mode when users other than this process's could read or write it
    (None: private, or not there: reading it reports that)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    others = mode & 0o007
    group = mode & 0o070 and info.st_gid != os.getegid()
    return mode if others or group else None


def check_private(files: Iterable[tuple[str | None, str]], strict: bool) -> None:
    """Each (path, flag) of a secret file: warn once per file when it is too open;
    ``strict``: ValueError instead (the CLI prints it as one line and exits 2)."""
    for path, flag in files:
        if not path:
            continue
        mode = too_open(path)
        if mode is None:
            continue
        message = (
            f"{flag} {path!r} can be read by other users (mode {mode:04o}); run: chmod 600 {path}"
        )
        if strict:
            raise ValueError(f"{message} (--strict-permissions refuses to start)")
        with _lock:
            if path in _warned:
                continue
            _warned.add(path)
        log.warning("%s (--strict-permissions refuses to start instead)", message)
