"""The training modes every process agrees on (Herald Table 1, plus HET alone).

- ``naive``: sequential partition, every update written back each iteration;
- ``on_demand``: sequential partition, on-demand synchronization;
- ``location_aware``: Herald Algorithm 1, naive write-backs;
- ``herald``: Algorithm 1 and on-demand synchronization;
- ``herald_pipelined``: ``herald``'s plans (the same rows move), with the pulls the
  previous iteration cannot change marked early; plans flow one iteration ahead and
  workers fetch those rows while they still train the previous iteration;
- ``het``: plans carry samples only; worker caches decide pulls and pushes by clocks.
"""

from __future__ import annotations

PIPELINED_MODE = "herald_pipelined"
HERALD_MODES = ("naive", "on_demand", "location_aware", "herald", PIPELINED_MODE)
HET_MODE = "het"
ALL_MODES = (*HERALD_MODES, HET_MODE)
LOCATION_AWARE_MODES = ("location_aware", "herald", PIPELINED_MODE)
# What ``heraldps local`` trains without --modes: Herald's Table 1 and HET.
DEFAULT_LOCAL_MODES = ("naive", "on_demand", "location_aware", "herald", HET_MODE)

# The scheduler keeps one bit per worker in its cache-mirror masks (uint64).
MAX_WORKERS = 64
