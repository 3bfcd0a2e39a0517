"""Build the native gRPC door's HTTP/2 session (agent/frontdoor/_nghttp2.pyx)
into the edgeplex that this Python imports: the checkout itself for an editable
install, site-packages otherwise. Needs Cython, the system C compiler and
libnghttp2's headers (Debian: libnghttp2-dev). Without it the agent serves
gRPC through grpcio's server.

    python scripts/build_native.py
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    extension = Extension(
        "edgeplex.agent.frontdoor._nghttp2",
        [str(ROOT / "agent" / "frontdoor" / "_nghttp2.pyx")],
        libraries=["nghttp2"],
        extra_compile_args=["-O2"],
    )
    modules = cythonize([extension], quiet=True, language_level=3)
    dist = Distribution({"ext_modules": modules})
    command = dist.get_command_obj("build_ext")
    command.build_temp = str(ROOT / ".cache" / "build-native")
    command.build_lib = str(ROOT / ".cache" / "build-native" / "lib")
    command.ensure_finalized()
    command.run()
    built = Path(command.get_ext_fullpath(extension.name))
    spec = importlib.util.find_spec("edgeplex.agent.frontdoor")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("edgeplex is not installed in this Python")
    target = Path(next(iter(spec.submodule_search_locations))) / built.name
    target.write_bytes(built.read_bytes())
    print(f"built {target} ({sysconfig.get_platform()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
