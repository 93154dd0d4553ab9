"""Numeric limits every process agrees on (clients check them before sending, shards again).

A row's version is HET's clock: +1 per applied update, or any larger number a
write-back stores. Versions and iterations are int64 on the wire and on disk;
capping them far below 2**63 means no sum or increment can ever wrap to a
negative number, whatever a caller sends.
"""

from __future__ import annotations

import numpy as np

# Largest version a write-back may store or a snapshot may hold. A commit adds 1 to a
# version, so 2**62 leaves 2**62 commits of room before int64 could wrap.
MAX_VERSION = 2**62

# Largest iteration a push, a commit or a snapshot may name (same reasoning).
MAX_ITERATION = 2**62

# The largest finite float32: a row value or optimizer state must stay within it.
FLOAT32_MAX = float(np.finfo(np.float32).max)
