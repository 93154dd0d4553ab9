"""``python -m launcher ARGS`` runs ``heraldps ARGS`` (what the local cluster's processes use).

When the command returns, its work is done: a shard has drained and closed its store, a worker
has written its report, the scheduler has stopped. What is left is the interpreter's teardown,
about a second with grpc, numba and their thread pools loaded, which every process of every
run paid at its end (``heraldps local`` waits for it per mode). So the process flushes its logs
and exits at once (``os._exit``). That skips nothing a kill -9 would not, and every process is
built to survive one (docs/failure-and-recovery.md).
"""

import logging
import os
import sys

from launcher.lifeline import follow_launcher

follow_launcher()  # a process of `heraldps local` dies with it (launcher.lifeline)

from launcher.cli import main  # noqa: E402  (after the guard: imports take seconds)

code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
