"""Worker sessions: only the process that registered worker ``w`` may speak for it.

``RegisterWorker`` answers a fresh random secret in the trailing metadata
``heraldps-session``; the worker sends it back as metadata on ``WatchPlans``
and ``ReportDone``. A worker token proves a caller is *a* worker; the session
proves it is *this* worker, so a forged report (another worker's id, or no
registration at all) cannot complete an iteration.

A session is live while its plan stream is open, or, without one, while it spoke
(registered, reported) within the liveness timeout; a stream that ended because
its connection did (the process died) ends the session at once. Registering an
id whose session is live is refused (``WorkerRegistered``), so a second caller
with the worker token cannot take a running worker's place; an admin may force
it (``take_over``). A restarted worker gets its id back as soon as the old
process's stream is gone.

The scheduler checks sessions when it checks tokens (``--admin-token-file``);
without tokens it trusts its network and checks nothing, as before: registering
an id again replaces its session.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from heraldps.auth import SESSION_METADATA_KEY as METADATA_KEY
from heraldps.errors import AlreadyExists, PermissionDenied

log = logging.getLogger(__name__)


class WorkerRegistered(AlreadyExists):
    """A worker id whose session is live was registered again without ``take_over``."""

    reason = "WORKER_REGISTERED"


@dataclass
class _Session:
    secret: str
    last_call: float  # monotonic: registration, or the last call carrying the session
    streams: int = 0  # plan streams open
    lost: bool = False  # its last stream ended with its connection: the process is gone


class WorkerSessions:
    """The current session of every registered worker."""

    def __init__(self, enforce: bool, expiry: float = 60.0) -> None:
        """``expiry``: seconds a session without a plan stream stays live after its last
        call (the scheduler's ``--worker-timeout``)."""
        self.enforce = enforce
        self.expiry = expiry
        self._sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()

    def _why_live(self, session: _Session, now: float) -> str | None:
        if session.streams:
            return "its plan stream is open"
        idle = now - session.last_call
        if not session.lost and idle <= self.expiry:
            return f"it spoke {idle:.1f} s ago (sessions expire after {self.expiry:g} s)"
        return None

    def issue(self, worker: int, take_over: bool = False) -> str:
        """A new secret for ``worker``; any earlier one stops working. WorkerRegistered
        while the earlier one is live (with sessions enforced), unless ``take_over``."""
        secret = secrets.token_hex(16)
        now = time.monotonic()
        with self._lock:
            old = self._sessions.get(worker)
            why = None if old is None else self._why_live(old, now)
            if self.enforce and why is not None:
                if not take_over:
                    raise WorkerRegistered(
                        f"worker {worker} is already registered and live ({why}); a second "
                        "registration is refused until that process exits or falls silent, "
                        "or an admin forces it (RegisterWorker with take_over and the admin "
                        "token)"
                    )
                log.warning("worker %d: an admin took over its live session (%s)", worker, why)
            self._sessions[worker] = _Session(secret, now)
        return secret

    def check(self, worker: int, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        """The session ``metadata`` carries (PermissionDenied unless it is ``worker``'s
        current one); the call counts as the worker speaking."""
        presented = next((v for k, v in metadata or () if k == METADATA_KEY), None)
        with self._lock:
            session = self._sessions.get(worker)
            if (
                session is not None
                and isinstance(presented, str)
                and hmac.compare_digest(presented.encode(), session.secret.encode())
            ):
                session.last_call = time.monotonic()
                session.lost = False
                return presented
        if not self.enforce:
            return ""
        raise PermissionDenied(
            f"worker {worker}: the call does not carry that worker's session; a worker "
            f"registers first (RegisterWorker) and sends back the '{METADATA_KEY}' "
            "metadata it got, and only the latest registration of an id counts"
        )

    def stream_opened(self, worker: int, secret: str) -> None:
        with self._lock:
            session = self._sessions.get(worker)
            if session is not None and session.secret == secret:
                session.streams += 1

    def stream_closed(self, worker: int, secret: str, lost: bool) -> None:
        """A plan stream ended: ``lost`` when its connection did (not the final plan)."""
        with self._lock:
            session = self._sessions.get(worker)
            if session is not None and session.secret == secret and session.streams:
                session.streams -= 1
                session.last_call = time.monotonic()
                session.lost = lost
