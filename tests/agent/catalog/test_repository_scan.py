"""A rescan of the repository (poll mode) sees a change to any file of a model's
folder, and reads again only the folders that changed."""

from __future__ import annotations

import os
from pathlib import Path

from edgeplex.agent.catalog import demo
from edgeplex.agent.catalog.model_config import ModelConfig
from edgeplex.agent.catalog.repository import folder_stamp, scan_repository_versions

LABELLED = """
max_batch_size: 8
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ], label_filename: "labels.txt" } ]
"""


def _touch(path: Path, data: bytes) -> None:
    """Rewrites `path` in place with a later modification time (the clock's tick
    could otherwise hide a quick edit)."""
    info = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))


def test_the_stamp_follows_every_file_of_the_folder(tmp_path: Path) -> None:
    model = tmp_path / "m"
    demo.make_add_sub(model)
    (model / "initial_state").mkdir()
    (model / "initial_state" / "state").write_bytes(bytes(4))
    first = folder_stamp(model)
    assert folder_stamp(model) == first

    _touch(model / "initial_state" / "state", b"\x01\x00\x00\x00")  # same size
    edited = folder_stamp(model)
    assert edited != first
    (model / "warmup").mkdir()
    (model / "warmup" / "sample").write_bytes(bytes(8))
    added = folder_stamp(model)
    assert added not in (first, edited)
    (model / "warmup" / "sample").unlink()
    assert folder_stamp(model) == edited

    (model / "loop").symlink_to(model)  # a link back up the tree is walked once
    (model / "dangling").symlink_to(tmp_path / "nowhere")
    assert folder_stamp(model) == edited


def test_a_rescan_reads_again_only_the_folders_that_changed(tmp_path: Path) -> None:
    for name in ("kept", "edited"):
        demo.make_add_sub(tmp_path / name)
        (tmp_path / name / "config.pbtxt").write_text(LABELLED)
        (tmp_path / name / "labels.txt").write_text("".join(f"a{i}\n" for i in range(16)))
    first = scan_repository_versions(tmp_path, ModelConfig())
    assert first["edited"][0].declared_outputs[0].labels[15] == "a15"

    _touch(tmp_path / "edited" / "labels.txt", "".join(f"b{i}\n" for i in range(16)).encode())
    demo.make_add_sub(tmp_path / "new")
    second = scan_repository_versions(tmp_path, ModelConfig(), last=first)
    assert second["kept"] is first["kept"]  # not read again
    assert second["edited"][0].declared_outputs[0].labels[15] == "b15"
    assert second["edited"][0].stamp != first["edited"][0].stamp
    assert set(second) == {"kept", "edited", "new"}
