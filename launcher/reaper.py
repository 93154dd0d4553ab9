"""``python -m launcher.reaper PID``: remove launcher PID's emulated network once it ends.

Started by :func:`launcher.netns.spawn_reaper` in its own session (Ctrl-C and
a kill of the launcher's process group do not reach it), it blocks reading
stdin, a pipe only the launcher holds. EOF means the launcher is gone or done:
the reaper then kills whatever still runs in the launcher's namespaces and
removes them, the veths and the bridge. After a clean exit there is nothing
left to remove and it exits silently.
"""

from __future__ import annotations

import sys

from launcher.iproute import NetworkError
from launcher.netns import remove_network


def main(argv: list[str]) -> int:
    owner = int(argv[0])
    while sys.stdin.buffer.read(4096):
        pass
    try:
        removed = remove_network(owner)
    except NetworkError as exc:
        print(f"heraldps reaper: {exc}", file=sys.stderr)
        return 1
    if removed:
        print(
            f"heraldps reaper: launcher {owner} ended without removing its emulated network; "
            "removed it (and stopped the processes inside)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
