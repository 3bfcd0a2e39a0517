"""The wheel installs into a clean virtual environment and imports under `edgeplex` only."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_wheel_installs_cleanly_and_owns_only_edgeplex(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
    )
    wheel = next((tmp_path / "dist").glob("edgeplex-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
        names = set(zf.namelist())
    assert tops == {"edgeplex", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in (
        "agent/server.py",
        "agent/runners/zygote.py",
        "proto/inference_pb2.py",
        "proto/inference.proto",
        "cli.py",
    ):
        assert f"edgeplex/{module}" in names, module

    # A clean environment holding the wheel alone; its dependencies are read from this
    # suite's environment after it (PYTHONPATH comes first, but an entry there is not
    # a site directory: the suite's editable install of edgeplex stays out of sight).
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         str(wheel)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    own = next((env_dir / "lib").glob("python*/site-packages"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = f"{own}{os.pathsep}{deps}"
    probe = (
        "import edgeplex, edgeplex.agent.server, edgeplex.agent.runners.zygote, sys;"
        "import edgeplex.proto;"
        "import importlib.util as u;"
        "assert u.find_spec('agent') is None and u.find_spec('proto') is None;"
        "assert 'site-packages' in edgeplex.__file__, edgeplex.__file__;"
        "print(edgeplex.__version__)"
    )
    out = subprocess.run(
        [str(python), "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "0.1.0"
    help_text = subprocess.run(
        [str(env_dir / "bin" / "edgeplex"), "agent", "--help"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    assert "--model-repo" in help_text
