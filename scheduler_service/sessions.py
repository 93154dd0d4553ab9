"""Worker sessions: only the process that registered worker ``w`` may speak for it.

``RegisterWorker`` answers a fresh random secret in the trailing metadata
``heraldps-session``; the worker sends it back as metadata on ``WatchPlans``
and ``ReportDone``. A worker token proves a caller is *a* worker; the session
proves it is *this* worker, so a forged report (another worker's id, or no
registration at all) cannot complete an iteration. Registering again (a
restarted worker) replaces the secret, so a stale process is shut out too.

The scheduler checks sessions when it checks tokens (``--admin-token-file``);
without tokens it trusts its network and checks nothing, as before.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Iterable

from heraldps.auth import SESSION_METADATA_KEY as METADATA_KEY
from heraldps.errors import PermissionDenied


class WorkerSessions:
    """The current secret of every registered worker."""

    def __init__(self, enforce: bool) -> None:
        self.enforce = enforce
        self._secrets: dict[int, str] = {}
        self._lock = threading.Lock()

    def issue(self, worker: int) -> str:
        """A new secret for ``worker``; any earlier one stops working."""
        secret = secrets.token_hex(16)
        with self._lock:
            self._secrets[worker] = secret
        return secret

    def check(self, worker: int, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """PermissionDenied unless ``metadata`` carries ``worker``'s current secret."""
        if not self.enforce:
            return
        presented = next((v for k, v in metadata or () if k == METADATA_KEY), None)
        with self._lock:
            expected = self._secrets.get(worker)
        if (
            not isinstance(presented, str)
            or expected is None
            or not hmac.compare_digest(presented.encode(), expected.encode())
        ):
            raise PermissionDenied(
                f"worker {worker}: the call does not carry that worker's session; a worker "
                f"registers first (RegisterWorker) and sends back the '{METADATA_KEY}' "
                "metadata it got, and only the latest registration of an id counts"
            )
