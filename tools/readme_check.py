"""Run the commands README.md shows, as a new user would, in a fresh clone (CI does).

Every fenced block whose info string is ``bash`` is a command the README
promises works. The first two, under "Quick start", are the two set-up
commands (install and run the main job; install and run the tests); the others
run after them, in order, from the repository root with ``.venv/bin`` first on
PATH::

    python3 tools/readme_check.py list             # every bash block, numbered
    python3 tools/readme_check.py quickstart 1     # print set-up command 1 (or 2)
    python3 tools/readme_check.py run-others       # run every other bash block

``.ci/run`` runs ``quickstart 1``, then ``quickstart 2`` (the test suite), then
``heraldps --help`` and ``run-others``. Only the standard library: it runs
before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
QUICK_START = "## Quick start"
BLOCK_SECONDS = 300
_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def bash_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every fenced block with info string ``bash``, in order."""
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2).strip())
        for m in _FENCE.finditer(text)
        if m.group(1) == "bash"
    ]


def quick_start(text: str) -> list[str]:
    """The set-up commands: the bash blocks of the Quick start section."""
    start = text.index(QUICK_START)
    end = text.find("\n## ", start + len(QUICK_START))
    return [body for _, body in bash_blocks(text[start : end if end >= 0 else None])]


def others(text: str) -> list[tuple[int, str]]:
    """Every bash block that is not a set-up command."""
    setup = set(quick_start(text))
    return [(line, body) for line, body in bash_blocks(text) if body not in setup]


def run_others(text: str) -> int:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    failed = 0
    for line, body in others(text):
        started = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", "-e", "-c", body], cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=BLOCK_SECONDS,
            )  # fmt: skip
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = -1, f"timed out after {BLOCK_SECONDS} s\n{exc.stdout or ''}"
        seconds = time.monotonic() - started
        first = body.splitlines()[0]
        print(f"README.md:{line}: {'ok' if code == 0 else 'FAILED'} ({seconds:.1f} s): {first}")
        if code != 0:
            failed += 1
            print("\n".join(f"    {row}" for row in str(output).splitlines()[-30:]))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="print every bash block, numbered")
    quick = sub.add_parser("quickstart", help="print set-up command N")
    quick.add_argument("number", type=int, choices=(1, 2))
    sub.add_parser("run-others", help="run every other bash block in order")
    args = parser.parse_args(argv)
    text = README.read_text()
    if args.action == "quickstart":
        commands = quick_start(text)
        if len(commands) != 2:
            print(f"README's Quick start has {len(commands)} bash blocks, not 2", file=sys.stderr)
            return 2
        print(commands[args.number - 1])
        return 0
    if args.action == "list":
        for number, (line, body) in enumerate(bash_blocks(text), start=1):
            print(f"{number}. README.md:{line}\n{body}\n")
        return 0
    return run_others(text)


if __name__ == "__main__":
    sys.exit(main())
