"""Type-check the installed shape of the project: `mypy -p edgeplex`.

The repository keeps one folder per role (agent/, control_plane/, proto/,
deploy/rig/) and pyproject's package-dir installs them as edgeplex.agent and
so on. mypy cannot follow that mapping from the source tree (and an editable
install hides it behind an import hook), so imports between the packages
would go unchecked. This builds the installed layout as symlinks under
.cache/typecheck/ and checks package `edgeplex` there, with pyproject's
[tool.mypy] settings.

Usage: python scripts/typecheck.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".cache" / "typecheck"


def build_tree() -> None:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(TREE, ignore_errors=True)
    top = TREE / "edgeplex"
    top.mkdir(parents=True)
    for path in (ROOT / mapping["edgeplex"]).iterdir():
        if path.suffix in (".py", ".typed"):
            (top / path.name).symlink_to(path)
    for package, folder in mapping.items():
        if package != "edgeplex":
            (top / package.split(".", 1)[1]).symlink_to(ROOT / folder)


def main() -> int:
    build_tree()
    env = dict(os.environ, MYPYPATH=str(TREE))
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".cache" / "mypy"),
        "-p",
        "edgeplex",
    ]
    return subprocess.call(command, cwd=TREE, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
