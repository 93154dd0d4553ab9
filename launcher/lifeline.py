"""Processes of ``heraldps local`` end with the launcher, however the launcher ends.

Two halves. In the launcher, :func:`stop_on_signals` turns SIGTERM and SIGHUP
(what systemd, Kubernetes, a CI timeout or ``kill PID`` send) into the same
orderly stop as Ctrl-C: the exception unwinds ``run_mode``, whose ``finally``
stops every process it started. The children run in their own sessions, so a
signal to the launcher alone never reaches them.

A SIGKILL cannot be caught, so each child guards itself: :func:`follow_launcher`
(the first thing ``python -m launcher`` does) asks Linux to SIGKILL it when its
parent dies (``prctl(PR_SET_PDEATHSIG)``), then checks that the launcher is
still its parent, in case the launcher died before the request was made. The
kernel ties the request to the *thread* that forked the child: the launcher
starts its processes from its main thread, which lives as long as the launcher.
Elsewhere than Linux the request is skipped, and only the signal handlers hold.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType

# Set in the environment of every process the launcher starts: the launcher's PID.
LAUNCHER_PID_ENV = "HERALDPS_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The launcher got SIGTERM or SIGHUP: unwind as Ctrl-C does, with the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def child_environment() -> dict[str, str]:
    """The environment for a process the launcher starts: its own, plus the launcher's PID."""
    return {**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}


def follow_launcher() -> None:
    """In a process the launcher started: die when the launcher does, even by SIGKILL."""
    owner = os.environ.get(LAUNCHER_PID_ENV, "")
    if not owner.isdigit():
        return  # started by hand, by systemd or by Kubernetes: nothing to follow
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)  # the C library Python itself runs on
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            print(f"heraldps: prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}",
                  file=sys.stderr)  # fmt: skip
    if os.getppid() != int(owner):  # the launcher died before the request above
        os._exit(1)


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler: ignore further stop signals, raise :class:`Stopped` (main thread)."""
    for s in (*STOP_SIGNALS, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`Stopped` in the main thread.

    The first signal starts the stop; later ones are ignored, so they cannot cut the
    stop short (the children die with the launcher anyway, see :func:`follow_launcher`).
    """

    previous = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, signal.SIGINT)}
    for s in STOP_SIGNALS:
        signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be restored
                signal.signal(s, handler)
