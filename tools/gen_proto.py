"""Generate the Python gRPC stubs (and mypy stubs) from proto/.

The one command that produces heraldps/v1/*_pb2*.py{,i}:

    python tools/gen_proto.py            # writes into the repository
    python tools/gen_proto.py --out DIR  # writes into DIR (CI drift check)

Needs the dev extra (grpcio-tools, mypy-protobuf).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("heraldps") / "v1"


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every proto/heraldps/v1/*.proto; return the files written."""
    protos = sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    # protoc finds the mypy plugins on PATH; they live beside this interpreter.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *[str(p.relative_to(PROTO_ROOT)) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        target = out_root / PACKAGE_DIR
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / PACKAGE_DIR).iterdir()):
            shutil.copyfile(src, target / src.name)
            written.append(target / src.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write heraldps/v1/ under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
