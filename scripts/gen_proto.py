"""Generate the Python code for proto/*.proto, reproducibly.

Usage: python scripts/gen_proto.py [--out DIR]

Writes <name>_pb2.py, <name>_pb2.pyi and <name>_pb2_grpc.py next to each
.proto (or into --out) and rewrites grpc_tools' absolute imports into relative
ones so the code works as the `edgeplex.proto` package. The generator version
is pinned in pyproject.toml; tests/proto/test_generated.py fails when the
committed code differs from a fresh run.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def generate(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    stems = [Path(p).stem for p in protos]
    for path in sorted(out_dir.glob("*_pb2*.py*")):
        text = path.read_text()
        for stem in stems:
            text = re.sub(
                rf"^import {stem}_pb2 as", f"from . import {stem}_pb2 as", text, flags=re.M
            )
        # Our messages use Triton's package name `inference` (wire compatibility),
        # so registering them in protobuf's default pool would clash with
        # tritonclient's copies in any process that imports both. Each file gets
        # a private pool instead; the wire format is unchanged.
        text = text.replace(
            "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
            "_POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = _POOL.AddSerializedFile(",
        )
        path.write_text(text)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
