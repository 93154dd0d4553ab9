"""The training modes every process agrees on (Herald Table 1, plus HET alone).

- ``naive``: sequential partition, every update written back each iteration;
- ``on_demand``: sequential partition, on-demand synchronization;
- ``location_aware``: Herald Algorithm 1, naive write-backs;
- ``herald``: Algorithm 1 and on-demand synchronization;
- ``het``: plans carry samples only; worker caches decide pulls and pushes by clocks.
"""

from __future__ import annotations

HERALD_MODES = ("naive", "on_demand", "location_aware", "herald")
HET_MODE = "het"
ALL_MODES = (*HERALD_MODES, HET_MODE)
LOCATION_AWARE_MODES = ("location_aware", "herald")

# The scheduler keeps one bit per worker in its cache-mirror masks (uint64).
MAX_WORKERS = 64
