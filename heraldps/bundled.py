"""Data sets shipped inside the package, named ``bundled:NAME[/FILE]``.

A job file that says ``"data": "bundled:criteo_head8k"`` works in any
installation, a container image included, without extra files or paths that
depend on where Python put the package. ``bundled:NAME`` is the set's training
file (``train.tsv``); ``bundled:NAME/FILE`` any file of it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from heraldps.errors import InvalidArgument

PREFIX = "bundled:"
TRAIN_FILE = "train.tsv"
TEST_FILE = "test.tsv"


def _root() -> Path:
    return Path(str(resources.files("heraldps") / "data"))


def available() -> list[str]:
    """Names of the bundled data sets."""
    return sorted(p.name for p in _root().iterdir() if p.is_dir() and not p.name.startswith("_"))


def resolve(path: str | Path) -> Path:
    """The file a data argument names: ``bundled:...`` inside the package, else ``path``."""
    text = str(path)
    if not text.startswith(PREFIX):
        return Path(path)
    name, _, file = text[len(PREFIX) :].partition("/")
    if name not in available():
        raise InvalidArgument(
            f"{text}: no bundled data set {name!r}; bundled: "
            + ", ".join(f"{PREFIX}{n}" for n in available())
        )
    resolved = _root() / name / (file or TRAIN_FILE)
    if not resolved.is_file():
        files = sorted(p.name for p in (_root() / name).iterdir() if p.is_file())
        raise InvalidArgument(f"{text}: no such file; {PREFIX}{name} has {', '.join(files)}")
    return resolved


def bundled_data() -> tuple[Path, Path]:
    """(train, test) of the Criteo sample shipped inside the package."""
    return resolve(f"{PREFIX}criteo_head8k/{TRAIN_FILE}"), resolve(
        f"{PREFIX}criteo_head8k/{TEST_FILE}"
    )
