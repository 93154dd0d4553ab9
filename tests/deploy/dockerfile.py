"""Just enough Dockerfile and .dockerignore reading for the deployment tests."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: int  # index of the FROM it belongs to
    line: int  # first line, 1-based


def instructions(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    found: list[Instruction] = []
    stage, text, start = -1, "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not text and (not line or line.startswith("#")):
            continue
        if text and line.startswith("#"):
            continue
        if not text:
            start = number
        text += " " + line.rstrip("\\").strip() if text else line.rstrip("\\").strip()
        if line.endswith("\\"):
            continue
        keyword, _, args = text.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        found.append(Instruction(keyword.upper(), args.strip(), stage, start))
        text = ""
    return found


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction (after any --options)."""
    value: list[str] = json.loads(args[args.index("[") :])
    return value


def dockerignore_sends(patterns: list[str], path: str) -> bool:
    """Whether the build context includes ``path``: the last matching pattern decides, a
    pattern also matching everything below a matched directory (Docker's rule, simplified)."""
    sent = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, bare) for p in prefixes):
            sent = negated
    return sent


def dockerignore_patterns(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
