"""What one rescan of the repository costs in poll mode, side by side in one run.

    python bench/repository_poll.py [--models 2000] [--rounds 5]

Builds a repository of `--models` folders, each a small graph with a config.pbtxt
(two inputs, two outputs, dynamic batching), and times, `--rounds` times each,
alternating:

- `read`: every folder read and parsed, as the first scan does (and every poll
  did before folders were stamped);
- `rescan`: the same repository again with the last scan in hand, as a poll
  finds it when nothing changed: a stat of each file, no parsing;
- `one changed`: the same with one folder's config edited (read again).

Printed: the median milliseconds of each, the ratio of `read` to `rescan`, and how
it was run. Pure file inspection: no agent, no runner.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.catalog.repository import scan_repository_versions, unservable

CONFIG = """max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
        { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
         { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def build(root: Path, models: int) -> None:
    first = root / "m00000"
    demo.make_add_sub(first)
    (first / "config.pbtxt").write_text(CONFIG)
    for i in range(1, models):
        shutil.copytree(first, root / f"m{i:05d}")


def timed(scan) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    scan()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    defaults = ModelConfig()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root, args.models)
        last = scan_repository_versions(root, defaults)
        edited = root / "m00001" / "config.pbtxt"
        times: dict[str, list[float]] = {"read": [], "rescan": [], "one changed": []}

        def read() -> None:
            found = scan_repository_versions(root, defaults)
            unservable(root, found)

        def rescan() -> None:
            found = scan_repository_versions(root, defaults, last=last)
            unservable(root, found)

        for i in range(args.rounds):
            times["read"].append(timed(read))
            times["rescan"].append(timed(rescan))
            edited.write_text(CONFIG.replace("100 }", f"{101 + i} }}"))
            times["one changed"].append(timed(rescan))
            last = scan_repository_versions(root, defaults, last=last)
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    print(
        f"{args.models} model folders, {args.rounds} rounds alternating; "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    for name, ms in medians.items():
        print(f"{name:12s} {ms:8.1f} ms")
    print(f"read / rescan: {medians['read'] / medians['rescan']:.1f}x")


if __name__ == "__main__":
    main()
