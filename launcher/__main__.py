"""``python -m launcher ARGS`` runs ``heraldps ARGS`` (what the local cluster's processes use)."""

import sys

from launcher.lifeline import follow_launcher

follow_launcher()  # a process of `heraldps local` dies with it (launcher.lifeline)

from launcher.cli import main  # noqa: E402  (after the guard: imports take seconds)

sys.exit(main())
