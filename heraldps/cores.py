"""How many cores this process may use, and how many are idle right now.

The PS shares a big request's compiled loops out to helper threads
(``ps_server.parallel``). A helper only helps where a core is idle: on a machine whose
cores are all busy, a helper that holds a piece of work may be descheduled halfway
through it and the caller must wait for it. On our shared 2-core VM, a PS lookup of
65,536 keys split at a load of 6-8 took 5.7 ms against 1.4 ms on one thread. So a
request asks first: the kernel's count of threads running at this moment
(``/proc/loadavg``'s fourth field, this thread included) against the cores, about 10 us.
A single snapshot is noisy (a thread that runs for microseconds counts); the scheduler,
which plans a batch every few milliseconds, measures instead
(``scheduler_service.split.HelperChoice``).
"""

from __future__ import annotations

import os


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


CORES = _cores()
_loadavg: int | None = None


def idle_cores() -> int:
    """Cores with nothing to run at this moment: the cores this process may use, less
    the threads the kernel has running (this one included). Where ``/proc/loadavg``
    cannot be read, every core but this thread's counts as idle."""
    global _loadavg
    try:
        if _loadavg is None:
            _loadavg = os.open("/proc/loadavg", os.O_RDONLY)
        running = int(os.pread(_loadavg, 128, 0).split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        running = 1
    return max(0, CORES - running)
