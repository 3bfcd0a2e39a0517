"""edgeplex: many ONNX models on few GPUs across many edge sites.

Process roles live in subpackages: `edgeplex.agent` (the data plane of one edge
box) and `edgeplex.proto` (the wire contracts). See docs/architecture.md.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgeplex")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"
