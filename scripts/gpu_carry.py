"""Wheels for a GPU machine with no network, in folders small enough to carry.

    python scripts/gpu_carry.py pack [--out .cache/gpu-carry]    # here, with PyPI
    python3 scripts/gpu_carry.py join CARRY HOUSE                 # there, stdlib only

`pack` downloads, for the GPU machine's Python (CPython 3.12, manylinux_2_28,
x86_64), onnxruntime-gpu, nvidia-ml-py, onnx, the build backend, every runtime
dependency of edgeplex but the CPU onnxruntime and what its GPU tests need, into
a wheelhouse, writes `requirements-gpu.txt` beside the wheels, and packs it all
into numbered folders (`CARRY/00`, `CARRY/01`, ...) of at most 58 MiB each: a
wheel larger than that
travels as `NAME.part000`, `NAME.part001`, ... `join` puts the wheelhouse back
together on the other side, and bench/gpu_check.sh installs from it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 58 * 2**20  # under the 60 MiB a carried folder may hold
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
EXTRA = ["onnxruntime-gpu==1.31.1", "nvidia-ml-py>=12", "onnx>=1.16", "setuptools>=69", "wheel"]
# The tests that need a GPU (CUDA shared memory) run there too: they use tritonclient's
# gRPC client, a runtime dependency already (its HTTP client has no wheel for 3.12).
TESTS = ["pytest>=8", "pytest-timeout>=2.3", "pytest-asyncio>=0.23"]


def requirements() -> list[str]:
    """edgeplex's runtime dependencies, with the CUDA build of ONNX Runtime instead of
    the CPU one (both install the same `onnxruntime` module)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d for d in project["dependencies"] if not re.match(r"onnxruntime\b", d)]
    return deps + EXTRA + TESTS


def pack(out: Path, python_version: str) -> None:
    house = ROOT / ".cache" / "gpu-wheels"
    house.mkdir(parents=True, exist_ok=True)
    wanted = requirements()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(house),
         "--python-version", python_version, "--implementation", "cp", *platforms, *wanted],
        check=True,
    )  # fmt: skip
    (house / "requirements-gpu.txt").write_text("\n".join(wanted) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    folder, used, count = 0, 0, 0
    for path in sorted(house.iterdir(), key=lambda p: p.stat().st_size):
        data_size = path.stat().st_size
        pieces = max(1, -(-data_size // LIMIT))
        with path.open("rb") as source:
            for index in range(pieces):
                chunk = source.read(LIMIT)
                if used + len(chunk) > LIMIT:
                    folder, used = folder + 1, 0
                target = out / f"{folder:02d}"
                target.mkdir(parents=True, exist_ok=True)
                name = path.name if pieces == 1 else f"{path.name}.part{index:03d}"
                (target / name).write_bytes(chunk)
                used += len(chunk)
        count += 1
    print(f"{count} files in {folder + 1} folders under {out}; carry them one per run:")
    for each in sorted(out.iterdir()):
        print(f"  {each.relative_to(ROOT)}")


def join(carry: Path, house: Path) -> None:
    """Every carried folder's files into `house`, the parts of a split wheel joined."""
    house.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[Path]] = {}
    for path in sorted(carry.glob("*/*")):
        match = re.fullmatch(r"(.+)\.part(\d{3})", path.name)
        if match:
            parts.setdefault(match.group(1), []).append(path)
        else:
            shutil.copyfile(path, house / path.name)
    for name, pieces in parts.items():
        pieces.sort(key=lambda p: p.name)
        with (house / name).open("wb") as whole:
            for piece in pieces:
                whole.write(piece.read_bytes())
    print(f"{len(list(house.iterdir()))} files in {house}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("--out", type=Path, default=ROOT / ".cache" / "gpu-carry")
    packing.add_argument("--python-version", default="3.12")
    joining = commands.add_parser("join")
    joining.add_argument("carry", type=Path)
    joining.add_argument("house", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.out, args.python_version)
    else:
        join(args.carry, args.house)


if __name__ == "__main__":
    main()
