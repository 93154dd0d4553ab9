"""``python -m launcher ARGS`` runs ``heraldps ARGS`` (what the local cluster's processes use)."""

import sys

from launcher.cli import main

sys.exit(main())
